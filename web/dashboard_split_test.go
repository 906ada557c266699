package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"regexp"
	"testing"
	"time"

	"moonji/models"
)

// splitCharts is the charts' JSON of a dashboard page: each chart in both
// splits (by outcome, by model).
type splitCharts struct {
	Labels []string
	Split  string
	Charts []struct {
		Canvas string
		Series []splitSeries // the default split's
		Splits map[string]struct {
			Caption, Label, Palette string
			Series                  []splitSeries
		}
	}
}

type splitSeries struct {
	Label, Key string
	Data       []int64
}

var reChartData = regexp.MustCompile(`(?s)<script id="usage-chart-data" type="application/json">(.*?)</script>`)
var reBucket = regexp.MustCompile(`<tr data-bucket="([^"]+)"`)

// chartsOf reads a dashboard page's charts and the start of each of its
// buckets (from the requests table, in the charts' order).
func chartsOf(t *testing.T, body string) (splitCharts, []string) {
	t.Helper()
	var c splitCharts
	m := reChartData.FindStringSubmatch(body)
	if m == nil || json.Unmarshal([]byte(m[1]), &c) != nil {
		t.Fatalf("no chart data in the page")
	}
	var buckets []string
	for _, b := range reBucket.FindAllStringSubmatch(tableOf(t, body, "requests-table"), -1) {
		buckets = append(buckets, b[1])
	}
	if len(buckets) != len(c.Labels) {
		t.Fatalf("%d buckets in the table, %d labels in the charts", len(buckets), len(c.Labels))
	}
	return c, buckets
}

// byBucket is a chart in a split as series label → bucket start → value,
// zeros left out; order is the series' labels in order.
func byBucket(t *testing.T, c splitCharts, buckets []string, canvas, split string) (got map[string]map[string]int64, order []string) {
	t.Helper()
	got = map[string]map[string]int64{}
	for _, ch := range c.Charts {
		if ch.Canvas != canvas {
			continue
		}
		s, ok := ch.Splits[split]
		if !ok {
			t.Fatalf("%s has no %s split", canvas, split)
		}
		for _, se := range s.Series {
			order = append(order, se.Label)
			if len(se.Data) != len(buckets) {
				t.Fatalf("%s/%s/%s: %d values for %d buckets", canvas, split, se.Label, len(se.Data), len(buckets))
			}
			for i, v := range se.Data {
				if v != 0 {
					if got[se.Label] == nil {
						got[se.Label] = map[string]int64{}
					}
					got[se.Label][buckets[i]] = v
				}
			}
		}
		return got, order
	}
	t.Fatalf("no chart %s", canvas)
	return nil, nil
}

// totals adds up each series over the window.
func totals(series map[string]map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for label, vs := range series {
		for _, v := range vs {
			out[label] += v
		}
	}
	return out
}

// TestDashboardSplitsMatchHandCountedRows checks the charts of /admin and
// /usage in both splits — requests and tokens over time by outcome and by
// model — against a set of ledger rows counted by hand: two people, two
// models, a request refused before any model was read, every outcome, two
// hours of today's window and one day ten days ago. The rows are written to
// the ledger and the rollup rebuilt from it: the pages read the rollup.
func TestDashboardSplitsMatchHandCountedRows(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	ctx := context.Background()
	admin := e.signedIn("ada@example.com", true)
	pia := e.signedIn("pia@example.com", false)
	piaU, err := models.UserByEmail(ctx, e.DB, "pia@example.com")
	if err != nil {
		t.Fatal(err)
	}
	bobU, err := models.EnsureUser(ctx, e.DB, "bob@example.com")
	if err != nil {
		t.Fatal(err)
	}
	piaID, bobID := piaU.ID, bobU.ID

	// Two hours of the 24-hour window, well inside it: A four hours before
	// its end, B two hours before (if the hour turns before the page is
	// read, both stay in it; the buckets are matched by their start).
	day := models.LastDay(time.Now())
	a, b := day.To.Add(-4*time.Hour), day.To.Add(-2*time.Hour)
	old := time.Now().UTC().Add(-10 * 24 * time.Hour)
	type row struct {
		at                 time.Time
		who                *uint
		model, outcome     string
		prompt, completion int
	}
	rows := []row{
		{a.Add(5 * time.Minute), &piaID, "m1", models.OutcomeSuccess, 10, 20}, // 1
		{a.Add(6 * time.Minute), &piaID, "m1", models.OutcomeSuccess, 5, 5},   // 2
		{a.Add(7 * time.Minute), &bobID, "m2", models.OutcomeError, 3, 0},     // 3
		{b.Add(1 * time.Minute), &bobID, "m2", models.OutcomeSuccess, 7, 8},   // 4
		{b.Add(2 * time.Minute), &piaID, "m1", models.OutcomeStopped, 4, 2},   // 5
		{b.Add(3 * time.Minute), &bobID, "m1", models.OutcomeCancelled, 1, 1}, // 6
		{b.Add(4 * time.Minute), nil, "", models.OutcomeRejected, 0, 0},       // 7: a bad key
		{b.Add(5 * time.Minute), &bobID, "m2", models.OutcomeRejected, 0, 0},  // 8: rate limited
		{old, &piaID, "m2", models.OutcomeSuccess, 100, 200},                  // 9: in the 30 days only
	}
	for i, r := range rows {
		u := models.Usage{InferenceID: fmt.Sprintf("split-%02d", i+1), CreatedAt: r.at, UserID: r.who, Model: r.model,
			Outcome: r.outcome, PromptTokens: r.prompt, CompletionTokens: r.completion, Source: "api", Status: 200}
		if r.outcome == models.OutcomeRejected {
			u.Status, u.Reason = 429, "rate_limited"
		}
		if err := e.DB.Create(&u).Error; err != nil {
			t.Fatal(err)
		}
	}
	if n, err := models.RebuildRollup(ctx, e.DB); err != nil || n != int64(len(rows)) {
		t.Fatalf("rebuilt the rollup from %d rows (%v), want %d", n, err, len(rows))
	}
	A, B := a.UTC().Format(time.RFC3339), b.UTC().Format(time.RFC3339)
	outcomes := []string{"success", "error", "cancelled", "stopped", "rejected"}
	type want = map[string]map[string]int64
	check := func(what string, c splitCharts, buckets []string, canvas, split string, w want, order []string) {
		t.Helper()
		got, gotOrder := byBucket(t, c, buckets, canvas, split)
		if !reflect.DeepEqual(got, w) {
			t.Errorf("%s, %s by %s:\n got %v\nwant %v", what, canvas, split, got, w)
		}
		if !reflect.DeepEqual(gotOrder, order) {
			t.Errorf("%s, %s by %s: series %q, want %q", what, canvas, split, gotOrder, order)
		}
	}

	// Everyone's last 24 hours. Models by tokens: m1 48, m2 18, none 0.
	body := e.adminPage(admin, "/admin")
	c, buckets := chartsOf(t, body)
	if c.Split != "outcome" || len(c.Charts) != 2 {
		t.Fatalf("default split %q, %d charts", c.Split, len(c.Charts))
	}
	byModel := []string{"m1", "m2", "(no model)"}
	check("/admin 24 h", c, buckets, "chart-requests", "outcome", want{
		"success": {A: 2, B: 1}, "error": {A: 1}, "cancelled": {B: 1}, "stopped": {B: 1}, "rejected": {B: 2},
	}, outcomes)
	check("/admin 24 h", c, buckets, "chart-requests", "model", want{
		"m1": {A: 2, B: 2}, "m2": {A: 1, B: 2}, "(no model)": {B: 1},
	}, byModel)
	check("/admin 24 h", c, buckets, "chart-tokens", "outcome", want{
		"success": {A: 40, B: 15}, "error": {A: 3}, "cancelled": {B: 2}, "stopped": {B: 6},
	}, outcomes)
	check("/admin 24 h", c, buckets, "chart-tokens", "model", want{
		"m1": {A: 40, B: 8}, "m2": {A: 3, B: 15},
	}, byModel)
	// The default split's series are the chart's own (what a reader of the
	// JSON that knows no splits draws), and each split names its chart.
	for _, ch := range c.Charts {
		if !reflect.DeepEqual(ch.Series, ch.Splits["outcome"].Series) {
			t.Errorf("%s: its series are not the default split's", ch.Canvas)
		}
	}
	if got := c.Charts[0].Splits["model"].Caption; got != "Requests by model" {
		t.Errorf("caption %q", got)
	}
	if got := c.Charts[1].Splits["outcome"].Caption; got != "Tokens by outcome" {
		t.Errorf("caption %q", got)
	}
	// The tables say the same, in both splits.
	for _, tc := range []struct {
		table, bucket, attr, key string
		want                     int64
	}{
		{"requests-table", B, "data-outcome", "rejected", 2},
		{"requests-table", B, "data-field", "requests", 5},
		{"requests-model-table", A, "data-model", "m1", 2},
		{"requests-model-table", B, "data-model", "", 1},
		{"requests-model-table", B, "data-field", "requests", 5},
		{"tokens-outcome-table", B, "data-outcome", "stopped", 6},
		{"tokens-outcome-table", A, "data-field", "tokens", 43},
		{"tokens-table", B, "data-model", "m2", 15},
		{"tokens-table", A, "data-field", "tokens", 43},
	} {
		if got := cellValue(t, rowOf(tableOf(t, body, tc.table), "data-bucket", tc.bucket), tc.attr, tc.key); got != tc.want {
			t.Errorf("%s at %s, %s=%q: %d, want %d", tc.table, tc.bucket, tc.attr, tc.key, got, tc.want)
		}
	}

	// Everyone's 30 days: row 9 alone in its day, and the window's totals.
	// Models by tokens: m2 318, m1 48, none 0.
	c, buckets = chartsOf(t, e.adminPage(admin, "/admin?range=30d&split=model"))
	D := old.Truncate(24 * time.Hour).Format(time.RFC3339)
	for _, tc := range []struct {
		canvas, split string
		totals        map[string]int64
		order         []string
		d             map[string]int64 // row 9's day
	}{
		{"chart-requests", "outcome", map[string]int64{"success": 4, "error": 1, "cancelled": 1, "stopped": 1, "rejected": 2}, outcomes,
			map[string]int64{"success": 1}},
		{"chart-requests", "model", map[string]int64{"m2": 4, "m1": 4, "(no model)": 1}, []string{"m2", "m1", "(no model)"},
			map[string]int64{"m2": 1}},
		{"chart-tokens", "outcome", map[string]int64{"success": 355, "error": 3, "cancelled": 2, "stopped": 6}, outcomes,
			map[string]int64{"success": 300}},
		{"chart-tokens", "model", map[string]int64{"m2": 318, "m1": 48}, []string{"m2", "m1", "(no model)"},
			map[string]int64{"m2": 300}},
	} {
		got, order := byBucket(t, c, buckets, tc.canvas, tc.split)
		if tot := totals(got); !reflect.DeepEqual(tot, tc.totals) {
			t.Errorf("/admin 30 d, %s by %s: totals %v, want %v", tc.canvas, tc.split, tot, tc.totals)
		}
		if !reflect.DeepEqual(order, tc.order) {
			t.Errorf("/admin 30 d, %s by %s: series %q, want %q", tc.canvas, tc.split, order, tc.order)
		}
		onDay := map[string]int64{}
		for label, vs := range got {
			if v, ok := vs[D]; ok {
				onDay[label] = v
			}
		}
		if !reflect.DeepEqual(onDay, tc.d) {
			t.Errorf("/admin 30 d, %s by %s on %s: %v, want %v", tc.canvas, tc.split, D, onDay, tc.d)
		}
	}

	// Pia's own last 24 hours on /usage: rows 1, 2 and 5, nobody else's.
	body = e.adminPage(pia, "/usage?range=24h")
	c, buckets = chartsOf(t, body)
	check("pia's /usage 24 h", c, buckets, "chart-requests", "outcome", want{"success": {A: 2}, "stopped": {B: 1}}, outcomes)
	check("pia's /usage 24 h", c, buckets, "chart-requests", "model", want{"m1": {A: 2, B: 1}}, []string{"m1"})
	check("pia's /usage 24 h", c, buckets, "chart-tokens", "outcome", want{"success": {A: 40}, "stopped": {B: 6}}, outcomes)
	check("pia's /usage 24 h", c, buckets, "chart-tokens", "model", want{"m1": {A: 40, B: 6}}, []string{"m1"})
	if got := cellValue(t, rowOf(tableOf(t, body, "requests-model-table"), "data-bucket", A), "data-model", "m1"); got != 2 {
		t.Errorf("pia's m1 requests at %s: %d, want 2", A, got)
	}

	// The control is on both pages, hidden until the script shows it, and
	// each table says which split it belongs to.
	for _, page := range []struct {
		c    *http.Client
		path string
	}{{admin, "/admin"}, {pia, "/usage"}} {
		body := e.adminPage(page.c, page.path)
		for _, s := range []string{
			`<fieldset class="split-switch" id="chart-split" hidden><legend>Split by</legend>`,
			`<input type="radio" name="split" value="model">`,
			`<input type="radio" name="split" value="outcome" checked>`,
			`data-split="outcome"><table class="numbers" id="requests-table">`,
			`data-split="model"><table class="numbers" id="requests-model-table">`,
			`data-split="outcome"><table class="numbers" id="tokens-outcome-table">`,
			`data-split="model"><table class="numbers" id="tokens-table">`,
		} {
			if !regexp.MustCompile(regexp.QuoteMeta(s)).MatchString(body) {
				t.Errorf("%s lacks %s", page.path, s)
			}
		}
	}
}
