package cli

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"moonji/internal/usageexport"
	"moonji/models"
)

// writeConfig writes a minimal configuration with its own SQLite database.
func writeConfig(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "moonji.yaml")
	cfg := "database_url: sqlite://" + filepath.Join(dir, "moonji.db") + "\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := Run(context.Background(), args, &out, &errOut)
	return out.String(), err
}

func TestKeysCreateListRevoke(t *testing.T) {
	cfg := writeConfig(t)
	out, err := run(t, "keys", "create", "--config", cfg, "--owner", "Ops@Example.com", "--name", "ci", "--expires", "30d", "--rpm", "120")
	if err != nil {
		t.Fatal(err)
	}
	// The key alone on one line, exactly once: scripts capture it with $(…).
	if !strings.HasSuffix(out, "\n") || strings.Count(out, "\n") != 1 || !strings.HasPrefix(out, "mj-") || len(strings.TrimSpace(out)) < 40 {
		t.Fatalf("keys create printed %q", out)
	}
	secret := strings.TrimSpace(out)

	out, err = run(t, "keys", "list", "--config", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, secret) || strings.Contains(out, secret[12:]) {
		t.Fatal("keys list shows the secret")
	}
	for _, want := range []string{"ops@example.com", "ci", secret[:11], "active", "120"} {
		if !strings.Contains(out, want) {
			t.Errorf("keys list lacks %q:\n%s", want, out)
		}
	}

	// MOONJI_CONFIG works as --config does; flags may follow the argument.
	t.Setenv("MOONJI_CONFIG", cfg)
	if out, err = run(t, "keys", "revoke", "1"); err != nil || !strings.Contains(out, "revoked key 1") {
		t.Fatalf("revoke: %q %v", out, err)
	}
	if _, err = run(t, "keys", "revoke", "1", "--config", cfg); err != nil {
		t.Errorf("revoking twice: %v", err)
	}
	if _, err = run(t, "keys", "revoke", "99"); err == nil || !strings.Contains(err.Error(), "no key with ID 99") {
		t.Errorf("revoke of an unknown key: %v", err)
	}
	out, _ = run(t, "keys", "list")
	if !strings.Contains(out, "revoked") {
		t.Errorf("list after revoke:\n%s", out)
	}
}

func TestUsageErrors(t *testing.T) {
	cases := [][]string{
		{},
		{"nope"},
		{"keys"},
		{"keys", "create", "--name", "x"},
		{"keys", "create", "--owner", "a@b", "--name", "x", "--expires", "soon"},
		{"keys", "revoke"},
		{"keys", "revoke", "abc"},
		{"usage"},
		{"usage", "export", "--format", "xml"},
		{"usage", "export", "--since", "yesterday-ish"},
		{"serve", "extra"},
	}
	for _, args := range cases {
		if _, err := run(t, args...); !errors.Is(err, ErrUsage) {
			t.Errorf("moonji %s: %v, want a usage error", strings.Join(args, " "), err)
		}
	}
}

func TestBadConfigNamesTheKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(path, []byte("backends:\n  - {name: a, url: http://x/v1}\nmodels:\n  - {name: m, backend: b}\n"), 0o600)
	_, err := run(t, "keys", "list", "--config", path)
	if err == nil || !strings.Contains(err.Error(), `models[0].backend: unknown backend "b"`) {
		t.Errorf("err = %v", err)
	}
	os.WriteFile(path, []byte("listen: 127.0.0.1:8080\nratelimit: {}\n"), 0o600)
	if _, err := run(t, "keys", "list", "--config", path); err == nil || !strings.Contains(err.Error(), "ratelimit") {
		t.Errorf("an unknown key must be refused: %v", err)
	}
}

func TestUsageExport(t *testing.T) {
	cfg := writeConfig(t)
	db, err := openFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	key := uint(7)
	ttft := int64(42)
	old := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rows := []models.Usage{
		{InferenceID: "inf_old", CreatedAt: old, Outcome: "success", Model: "m", Source: "api"},
		{InferenceID: "inf_a", CreatedAt: time.Now().UTC(), User: "a@example.com", KeyID: &key, Source: "api", Model: "m1",
			Backend: "vllm", Outcome: "success", Status: 200, PromptTokens: 5, CompletionTokens: 64, UsageSource: "engine",
			QueueMs: 3, TTFTMs: &ttft, DurationMs: 900},
		{InferenceID: "inf_b", CreatedAt: time.Now().UTC().Add(time.Second), Source: "api", Model: "x", Outcome: "rejected",
			Status: 401, Reason: "unauthorized", UsageSource: "none"},
	}
	if err := db.Create(&rows).Error; err != nil {
		t.Fatal(err)
	}
	models.Close(db)

	out, err := run(t, "usage", "export", "--config", cfg, "--since", "2026-06-01")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 rows since June, got %d:\n%s", len(lines), out)
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatal(err)
	}
	for _, f := range usageexport.Fields {
		if _, ok := rec[f]; !ok {
			t.Errorf("JSONL record lacks %q: %s", f, lines[0])
		}
	}
	if len(rec) != len(usageexport.Fields) || rec["inference_id"] != "inf_a" || rec["key_id"] != 7.0 || rec["ttft_ms"] != 42.0 ||
		rec["completion_tokens"] != 64.0 || rec["usage_source"] != "engine" {
		t.Errorf("record = %v", rec)
	}
	var second map[string]any
	json.Unmarshal([]byte(lines[1]), &second)
	if second["ttft_ms"] != nil || second["key_id"] != nil || second["reason"] != "unauthorized" {
		t.Errorf("unknowns must export as null: %v", second)
	}

	out, err = run(t, "usage", "export", "--config", cfg, "--format", "csv")
	if err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(strings.NewReader(out)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 4 || strings.Join(recs[0], ",") != strings.Join(usageexport.Fields, ",") {
		t.Fatalf("csv = %q", out)
	}
	if recs[1][0] != "inf_old" || recs[2][14] != "42" || recs[3][14] != "" {
		t.Errorf("csv rows = %q", recs[1:])
	}
}

func TestParseSince(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"2026-11-01":           time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC),
		"2026-11-28T10:00:00Z": time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC),
		"24h":                  now.Add(-24 * time.Hour),
		"7d":                   now.Add(-7 * 24 * time.Hour),
		"":                     {},
	} {
		got, err := parseSince(in, now)
		if err != nil || !got.Equal(want) {
			t.Errorf("parseSince(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
}
