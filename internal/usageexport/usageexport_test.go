package usageexport

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"moonji/models"
)

func TestCSVText(t *testing.T) {
	for in, want := range map[string]string{
		"":        "",
		"m1":      "m1",
		"=1":      "'=1",
		"+1":      "'+1",
		"-1":      "'-1",
		"@x":      "'@x",
		"\tx":     "'\tx",
		"\rx":     "'\rx",
		"a=1":     "a=1",
		"'=1":     "'=1",
		"success": "success",
	} {
		if got := CSVText(in); got != want {
			t.Errorf("CSVText(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseSince(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"2026-11-01":           time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC),
		"2026-11-28T10:00:00Z": time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC),
		"24h":                  now.Add(-24 * time.Hour),
		"7d":                   now.Add(-7 * 24 * time.Hour),
		"36500d":               now.Add(-36500 * 24 * time.Hour),
		"":                     {},
	} {
		got, err := ParseSince(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("ParseSince(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	// Nothing that overflows a Duration, or is not a time at all, gets through.
	for _, in := range []string{"0d", "-1d", "-24h", "0s", "36501d", "99999999999d", "9223372036854775807d",
		"2562048h", "yesterday", "7 d", "7D", "2026-13-01", "1e9h", "d"} {
		if got, err := ParseSince(in, now); err == nil {
			t.Errorf("ParseSince(%q) = %v, want an error", in, got)
		}
	}
}

// Write streams one person's rows, oldest first, in either format, and the
// other person's not at all; CSV cells a caller chose cannot be formulas.
func TestWrite(t *testing.T) {
	db, err := models.Open("sqlite://" + t.TempDir() + "/m.db")
	if err != nil {
		t.Fatal(err)
	}
	defer models.Close(db)
	alice, bob := uint(1), uint(2)
	key, ttft := uint(7), int64(42)
	now := time.Now().UTC()
	rows := []models.Usage{
		{InferenceID: "inf_b1", CreatedAt: now.Add(-time.Hour), UserID: &bob, User: "bob@example.com", Model: "m1", Outcome: "success"},
		{InferenceID: "inf_a2", CreatedAt: now.Add(-time.Minute), UserID: &alice, User: "alice@example.com", KeyID: &key,
			Model: "=cmd|' /C calc'!A0", Outcome: "rejected", Status: 404, Reason: "model_not_found", UsageSource: "none"},
		{InferenceID: "inf_a1", CreatedAt: now.Add(-2 * time.Minute), UserID: &alice, User: "alice@example.com", KeyID: &key,
			Model: "m1", Outcome: "success", Status: 200, PromptTokens: 5, CompletionTokens: 9, TTFTMs: &ttft, DurationMs: 80,
			Cost: 123_000, CachedTokens: 2},
		{InferenceID: "inf_old", CreatedAt: now.Add(-48 * time.Hour), UserID: &alice, Model: "m1", Outcome: "success"},
	}
	if err := db.Create(&rows).Error; err != nil {
		t.Fatal(err)
	}
	since := now.Add(-24 * time.Hour)

	var out bytes.Buffer
	flushes := 0
	if err := Write(context.Background(), db, &out, CSV, "USD", since, alice, func() error { flushes++; return nil }); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&out).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 || strings.Join(recs[0], ",") != strings.Join(Fields, ",") {
		t.Fatalf("csv: %q", recs)
	}
	if recs[1][0] != "inf_a1" || recs[2][0] != "inf_a2" || recs[1][14] != "42" || recs[2][5] != "'=cmd|' /C calc'!A0" || recs[2][8] != "404" {
		t.Errorf("csv rows: %q", recs[1:])
	}
	if c := len(Fields); recs[1][c-3] != "0.000123" || recs[1][c-2] != "USD" || recs[1][c-1] != "2" || recs[2][c-3] != "0.000000" {
		t.Errorf("cost, currency and cached tokens: %q", recs[1:])
	}
	if flushes != 1 {
		t.Errorf("flushed called %d times, want once at the end", flushes)
	}

	out.Reset()
	if err := Write(context.Background(), db, &out, JSONL, "USD", since, alice, nil); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("jsonl: %q", out.String())
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[1]), &rec); err != nil {
		t.Fatal(err)
	}
	if len(rec) != len(Fields) || rec["inference_id"] != "inf_a2" || rec["model"] != "=cmd|' /C calc'!A0" || rec["ttft_ms"] != nil ||
		rec["cost"] != "0.000000" || rec["currency"] != "USD" {
		t.Errorf("jsonl record: %v", rec)
	}
	if strings.Contains(out.String(), "bob@") {
		t.Errorf("another person's row in the export: %s", out.String())
	}

	if err := Write(context.Background(), db, &out, "xml", "USD", since, alice, nil); err == nil {
		t.Error("an unknown format was accepted")
	}
}

// A long export is handed on in batches, each followed by flushed (where
// the web handler renews its write deadline), and a failing flushed stops it.
func TestWriteBatches(t *testing.T) {
	db, err := models.Open("sqlite://" + t.TempDir() + "/m.db")
	if err != nil {
		t.Fatal(err)
	}
	defer models.Close(db)
	user := uint(3)
	now := time.Now().UTC()
	rows := make([]models.Usage, 1200)
	for i := range rows {
		rows[i] = models.Usage{InferenceID: fmt.Sprintf("inf_%04d", i), CreatedAt: now.Add(time.Duration(i) * time.Millisecond),
			UserID: &user, Model: "m1", Outcome: "success"}
	}
	if err := db.CreateInBatches(&rows, 200).Error; err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	var seen []int
	err = Write(context.Background(), db, &out, JSONL, "USD", now.Add(-time.Hour), user, func() error {
		seen = append(seen, strings.Count(out.String(), "\n"))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(seen) != "[500 1000 1200]" {
		t.Errorf("rows written at each flush: %v, want [500 1000 1200]", seen)
	}
	stop := errors.New("client gone")
	out.Reset()
	if err := Write(context.Background(), db, &out, CSV, "USD", now.Add(-time.Hour), user, func() error { return stop }); !errors.Is(err, stop) {
		t.Errorf("a failed flush: %v", err)
	}
	if n := strings.Count(out.String(), "\n"); n != 501 {
		t.Errorf("%d lines written before the failed flush stopped it, want 501", n)
	}
}
