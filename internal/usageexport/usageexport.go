// Package usageexport writes ledger rows as CSV or JSONL: the format of
// `moonji usage export` and of a person's download on /usage, one code path
// for both so that billing scripts read either the same way.
package usageexport

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"

	"moonji/internal/money"
	"moonji/models"
)

// Formats of an export.
const (
	CSV   = "csv"
	JSONL = "jsonl"
)

// ContentType is the media type of a format's file.
func ContentType(format string) string {
	if format == CSV {
		return "text/csv; charset=utf-8"
	}
	return "application/x-ndjson; charset=utf-8"
}

// Fields are the ledger's public field names, in order. Billing scripts
// depend on them: add, never rename.
var Fields = []string{"inference_id", "created_at", "user", "key_id", "source", "model", "backend",
	"outcome", "status", "reason", "prompt_tokens", "completion_tokens", "usage_source", "queue_ms",
	"ttft_ms", "duration_ms", "retried_from", "api", "cost", "currency", "cached_tokens"}

// Row is one ledger row as exported. Pointers export as null (JSONL) or an
// empty cell (CSV) when unknown.
type Row struct {
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
	// RetriedFrom is the backend that failed the request before its answer
	// started, when it was retried on Backend.
	RetriedFrom string `json:"retried_from"`
	// API is the endpoint: chat, completions, embeddings or responses.
	API string `json:"api"`
	// Cost is what the row cost, a decimal string in Currency's units
	// (money.Format: exact, at least six decimals).
	Cost         string `json:"cost"`
	Currency     string `json:"currency"`
	CachedTokens int    `json:"cached_tokens"`
}

// FromUsage is the exported form of a ledger row, its cost in currency.
func FromUsage(u *models.Usage, currency string) Row {
	return Row{InferenceID: u.InferenceID, CreatedAt: u.CreatedAt.UTC().Format(time.RFC3339Nano), User: u.User,
		KeyID: u.KeyID, Source: u.Source, Model: u.Model, Backend: u.Backend, Outcome: u.Outcome, Status: u.Status,
		Reason: u.Reason, PromptTokens: u.PromptTokens, CompletionTokens: u.CompletionTokens, UsageSource: u.UsageSource,
		QueueMs: u.QueueMs, TTFTMs: u.TTFTMs, DurationMs: u.DurationMs, RetriedFrom: u.RetriedFrom, API: u.API,
		Cost: money.Format(u.Cost), Currency: currency, CachedTokens: u.CachedTokens}
}

// CSV is the row's cells, in the order of Fields.
func (r Row) CSV() []string {
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
	t := CSVText
	return []string{t(r.InferenceID), t(r.CreatedAt), t(r.User), key, t(r.Source), t(r.Model), t(r.Backend), t(r.Outcome),
		strconv.Itoa(r.Status), t(r.Reason), strconv.Itoa(r.PromptTokens), strconv.Itoa(r.CompletionTokens),
		t(r.UsageSource), strconv.FormatInt(r.QueueMs, 10), opt(r.TTFTMs), strconv.FormatInt(r.DurationMs, 10),
		t(r.RetriedFrom), t(r.API), r.Cost, t(r.Currency), strconv.Itoa(r.CachedTokens)}
}

// CSVText makes a text cell safe to open in a spreadsheet. Some of the
// ledger's text comes from callers (the model name of any request, even a
// refused one), and Excel, LibreOffice and Google Sheets run a cell that
// starts with =, +, -, @, tab or CR as a formula: such a cell gets a leading
// single quote, as OWASP's "CSV Injection" advice says, which spreadsheets
// show as text. Numeric cells are written by the gateway and left alone.
func CSVText(s string) string {
	if s != "" && strings.ContainsRune("=+-@\t\r", rune(s[0])) {
		return "'" + s
	}
	return s
}

// Write streams the rows created at or after since — of one person, or of
// everyone when userID is 0 — to w in format (CSV with a header line, or
// JSONL), oldest first, without holding them all in memory. flushed, when
// not nil, is called after each batch of rows has been handed to w, so
// that a caller serving a slow client can renew its write deadline.
func Write(ctx context.Context, db *gorm.DB, w io.Writer, format, currency string, since time.Time, userID uint, flushed func() error) error {
	f := Format[*models.Usage]{
		Header: Fields,
		CSV:    func(u *models.Usage) []string { return FromUsage(u, currency).CSV() },
		JSON:   func(u *models.Usage) any { return FromUsage(u, currency) },
	}
	err := Stream(w, format, f, func(emit func(*models.Usage) error) error {
		return models.EachUsageOf(ctx, db, since, userID, emit)
	}, flushed)
	if err != nil {
		return fmt.Errorf("usage export: %w", err)
	}
	return nil
}

// MaxAge is the farthest back ParseSince reaches by a duration: longer
// spans overflow a time.Duration (about 292 years) long before that.
const MaxAge = 100 * 365 * 24 * time.Hour

// ParseSince reads a since value: RFC 3339, a date (YYYY-MM-DD, UTC), or a
// duration before now (24h, 90m, 7d); "" is the zero time (everything).
func ParseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse("2006-01-02", s); err == nil {
		return t, nil
	}
	if d, ok := parseAge(s); ok {
		return now.Add(-d), nil
	}
	return time.Time{}, fmt.Errorf("want RFC 3339 (2026-11-29T10:00:00Z), a date (2026-11-29) or a duration (24h, 7d), got %q", s)
}

// parseAge reads a Go duration or whole days ("30d"), positive and at most
// MaxAge: "99999999999d" must be refused, not wrap around into the future.
func parseAge(s string) (time.Duration, bool) {
	if d, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(d)
		if err != nil || n <= 0 || n > int(MaxAge/(24*time.Hour)) {
			return 0, false
		}
		return time.Duration(n) * 24 * time.Hour, true
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 || d > MaxAge {
		return 0, false
	}
	return d, true
}
