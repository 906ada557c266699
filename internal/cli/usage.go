package cli

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"moonji/models"
)

// exportFields are the ledger's public field names, in order. Billing
// scripts depend on them: add, never rename.
var exportFields = []string{"inference_id", "created_at", "user", "key_id", "source", "model", "backend",
	"outcome", "status", "reason", "prompt_tokens", "completion_tokens", "usage_source", "queue_ms",
	"ttft_ms", "duration_ms"}

// exportRow is one ledger row as exported. Pointers export as null (JSONL)
// or an empty cell (CSV) when unknown.
type exportRow struct {
	InferenceID      string `json:"inference_id"`
	CreatedAt        string `json:"created_at"`
	User             string `json:"user"`
	KeyID            *uint  `json:"key_id"`
	Source           string `json:"source"`
	Model            string `json:"model"`
	Backend          string `json:"backend"`
	Outcome          string `json:"outcome"`
	Status           int    `json:"status"`
	Reason           string `json:"reason"`
	PromptTokens     int    `json:"prompt_tokens"`
	CompletionTokens int    `json:"completion_tokens"`
	UsageSource      string `json:"usage_source"`
	QueueMs          int64  `json:"queue_ms"`
	TTFTMs           *int64 `json:"ttft_ms"`
	DurationMs       int64  `json:"duration_ms"`
}

func toExport(u *models.Usage) exportRow {
	return exportRow{InferenceID: u.InferenceID, CreatedAt: u.CreatedAt.UTC().Format(time.RFC3339Nano), User: u.User,
		KeyID: u.KeyID, Source: u.Source, Model: u.Model, Backend: u.Backend, Outcome: u.Outcome, Status: u.Status,
		Reason: u.Reason, PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, UsageSource: u.UsageSource,
		QueueMs: u.QueueMs, TTFTMs: u.TTFTMs, DurationMs: u.DurationMs}
}

func (r exportRow) csv() []string {
	opt := func(p *int64) string {
		if p == nil {
			return ""
		}
		return strconv.FormatInt(*p, 10)
	}
	key := ""
	if r.KeyID != nil {
		key = strconv.FormatUint(uint64(*r.KeyID), 10)
	}
	t := csvText
	return []string{t(r.InferenceID), t(r.CreatedAt), t(r.User), key, t(r.Source), t(r.Model), t(r.Backend), t(r.Outcome),
		strconv.Itoa(r.Status), t(r.Reason), strconv.Itoa(r.PromptTokens), strconv.Itoa(r.CompletionTokens),
		t(r.UsageSource), strconv.FormatInt(r.QueueMs, 10), opt(r.TTFTMs), strconv.FormatInt(r.DurationMs, 10)}
}

// csvText makes a text cell safe to open in a spreadsheet. Some of the
// ledger's text comes from callers (the model name of any request, even a
// refused one), and Excel, LibreOffice and Google Sheets run a cell that
// starts with =, +, -, @, tab or CR as a formula: such a cell gets a leading
// single quote, as OWASP's "CSV Injection" advice says, which spreadsheets
// show as text. Numeric cells are written by the gateway and left alone.
func csvText(s string) string {
	if s != "" && strings.ContainsRune("=+-@\t\r", rune(s[0])) {
		return "'" + s
	}
	return s
}

func cmdUsage(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) == 0 || args[0] != "export" {
		return fmt.Errorf("%w: usage needs the export command", ErrUsage)
	}
	fs, path := newFlagSet("usage export")
	since := fs.String("since", "", "only rows created at or after TIME (RFC 3339, YYYY-MM-DD, or a duration ago such as 24h)")
	format := fs.String("format", "jsonl", "jsonl or csv")
	if pos, err := parse(fs, args[1:]); err != nil {
		return err
	} else if len(pos) > 0 {
		return fmt.Errorf("%w: usage export takes no arguments", ErrUsage)
	}
	if *format != "jsonl" && *format != "csv" {
		return fmt.Errorf("%w: --format must be jsonl or csv, got %q", ErrUsage, *format)
	}
	from, err := parseSince(*since, time.Now())
	if err != nil {
		return fmt.Errorf("%w: --since: %v", ErrUsage, err)
	}
	db, err := openFor(*path)
	if err != nil {
		return err
	}
	defer models.Close(db)

	bw := bufio.NewWriter(stdout)
	if *format == "jsonl" {
		enc := json.NewEncoder(bw)
		if err := models.EachUsage(ctx, db, from, func(u *models.Usage) error { return enc.Encode(toExport(u)) }); err != nil {
			return err
		}
		return bw.Flush()
	}
	cw := csv.NewWriter(bw)
	if err := cw.Write(exportFields); err != nil {
		return err
	}
	if err := models.EachUsage(ctx, db, from, func(u *models.Usage) error { return cw.Write(toExport(u).csv()) }); err != nil {
		return err
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return err
	}
	return bw.Flush()
}

// parseSince reads --since: RFC 3339, a date, or a duration before now.
func parseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse("2006-01-02", s); err == nil {
		return t, nil
	}
	if d, err := parseDuration(s); err == nil {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("want RFC 3339 (2026-11-29T10:00:00Z), a date (2026-11-29) or a duration (24h, 7d), got %q", s)
}
