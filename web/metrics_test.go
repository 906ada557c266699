package web_test

import (
	"encoding/json"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// scrape fetches /metrics and parses it.
func scrape(t testing.TB, e *testEnv) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(e.URL + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// metricValue returns the value of the series of name whose labels, written
// as `a="x",b="y"` in any order, match; -1 when there is none.
func metricValue(t testing.TB, e *testEnv, name, labels string) float64 {
	t.Helper()
	return seriesValue(scrape(t, e), name, labels)
}

func seriesValue(fams map[string]*dto.MetricFamily, name, labels string) float64 {
	f, ok := fams[name]
	if !ok {
		return -1
	}
	want := map[string]string{}
	for _, kv := range strings.Split(labels, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			want[k] = strings.Trim(v, `"`)
		}
	}
	for _, m := range f.Metric {
		match := true
		for k, v := range want {
			found := false
			for _, l := range m.Label {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			match = match && found
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	return -1
}

func TestMetricsAfterMixedTraffic(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db")
	fams := scrape(t, e)
	// Pre-registered at zero, before anything happened, so rate() sees the
	// first error.
	for _, s := range []struct{ name, labels string }{
		{"moonji_requests_total", `model="m1",outcome="error"`},
		{"moonji_requests_total", `model="renamed",outcome="stopped"`},
		{"moonji_rejections_total", `reason="queue_full"`},
		{"moonji_rejections_total", `reason="rate_limited"`},
		{"moonji_backend_in_flight", `backend="mock"`},
		{"moonji_backend_queued", `backend="mock"`},
	} {
		if v := seriesValue(fams, s.name, s.labels); v != 0 {
			t.Errorf("%s{%s} = %v at start, want 0", s.name, s.labels, v)
		}
	}

	for i := 0; i < 3; i++ {
		readAll(t, e.post(`{"model":"m1","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"a b c"}]}`).Body)
	}
	readAll(t, e.post(`{"model":"m1","max_tokens":7,"messages":[{"role":"user","content":"a"}]}`).Body)
	readAll(t, e.post(`{"model":"m1","messages":[{"role":"user","content":"a"}],"mock":{"fail_status":500}}`).Body)
	readAll(t, e.post(`{"model":"nope","messages":[]}`).Body)
	readAll(t, e.postWith(t.Context(), "", `{"model":"m1","messages":[]}`).Body)
	e.countRows() // flush: the last rows' metrics are counted at finish

	fams = scrape(t, e)
	checks := []struct {
		name, labels string
		want         float64
	}{
		{"moonji_requests_total", `model="m1",outcome="success"`, 4},
		{"moonji_requests_total", `model="m1",outcome="error"`, 1},
		// The missing key's body is never read: its model is unknown too.
		{"moonji_requests_total", `model="m1",outcome="rejected"`, 0},
		{"moonji_requests_total", `model="unknown",outcome="rejected"`, 2},
		{"moonji_rejections_total", `reason="model_not_found"`, 1},
		{"moonji_rejections_total", `reason="unauthorized"`, 1},
		{"moonji_completion_tokens_total", `model="m1"`, 3*5 + 7},
		{"moonji_time_to_first_token_seconds", `model="m1"`, 3},
		{"moonji_queue_wait_seconds", `backend="mock"`, 5},
		{"moonji_request_duration_seconds", `model="m1"`, 5},
		{"moonji_decode_tokens_per_second", `model="m1"`, 3},
		{"moonji_backend_in_flight", `backend="mock"`, 0},
	}
	for _, c := range checks {
		if got := seriesValue(fams, c.name, c.labels); got != c.want {
			t.Errorf("%s{%s} = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if v := seriesValue(fams, "moonji_prompt_tokens_total", `model="m1"`); v <= 0 {
		t.Errorf("moonji_prompt_tokens_total = %v", v)
	}
}

// Every query of the shipped Grafana dashboard uses only metrics the gateway
// exports.
func TestGrafanaDashboardUsesExportedMetrics(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db")
	readAll(t, e.post(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"a"}]}`).Body)
	fams := scrape(t, e)
	raw, err := os.ReadFile("../deploy/grafana/moonji-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	if len(dash.Panels) < 8 {
		t.Fatalf("only %d panels", len(dash.Panels))
	}
	metricName := regexp.MustCompile(`\b(moonji_[a-z_]+|go_[a-z_]+|process_[a-z_]+)\b`)
	var used []string
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			names := metricName.FindAllString(tg.Expr, -1)
			if len(names) == 0 {
				t.Errorf("panel %q: query %q uses no Moonji metric", p.Title, tg.Expr)
			}
			for _, n := range names {
				base := n
				for _, suf := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(n, suf); ok && fams[b] != nil && fams[b].GetType() == dto.MetricType_HISTOGRAM {
						base = b
					}
				}
				if fams[base] == nil {
					t.Errorf("panel %q uses %s, which the gateway does not export", p.Title, n)
				}
				used = append(used, base)
			}
		}
	}
	sort.Strings(used)
	t.Logf("metrics used: %v", used)
}
