package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The children Model and Backend hand out, looked up once at start, are
// the vectors' own: what is counted through them is exported under the
// right labels, for a model or backend known at start or not.
func TestChildrenAreTheVectors(t *testing.T) {
	m := New([]string{"m1", "unknown"}, []string{"b1"})
	for _, name := range []string{"m1", "late-model"} {
		mm := m.Model(name)
		mm.Requests("success").Inc()
		mm.Requests("not-an-outcome").Inc()
		mm.PromptTokens.Add(3)
		mm.CompletionTokens.Add(5)
		mm.Duration.Observe(0.25)
		mm.TTFT.Observe(0.1)
		mm.DecodeSpeed.Observe(10)
		if got := testutil.ToFloat64(m.Requests.WithLabelValues(name, "success")); got != 1 {
			t.Errorf("%s: requests{success} = %v, want 1", name, got)
		}
		if got := testutil.ToFloat64(m.Requests.WithLabelValues(name, "not-an-outcome")); got != 1 {
			t.Errorf("%s: requests{not-an-outcome} = %v, want 1", name, got)
		}
		if got := testutil.ToFloat64(m.PromptTokens.WithLabelValues(name)); got != 3 {
			t.Errorf("%s: prompt tokens = %v, want 3", name, got)
		}
		if got := testutil.ToFloat64(m.CompletionToks.WithLabelValues(name)); got != 5 {
			t.Errorf("%s: completion tokens = %v, want 5", name, got)
		}
	}
	if m.Model("m1") != m.Model("m1") {
		t.Error("a model known at start is looked up anew on every call")
	}
	for _, name := range []string{"b1", "late-backend"} {
		b := m.Backend(name)
		b.InFlight.Set(4)
		b.Queued.Set(2)
		b.QueueWait.Observe(0.5)
		if got := testutil.ToFloat64(m.InFlight.WithLabelValues(name)); got != 4 {
			t.Errorf("%s: in flight = %v, want 4", name, got)
		}
		if got := testutil.ToFloat64(m.Queued.WithLabelValues(name)); got != 2 {
			t.Errorf("%s: queued = %v, want 2", name, got)
		}
	}
	// Histograms: one observation each, under the model's label.
	if n := testutil.CollectAndCount(m.Duration); n != 3 { // m1, unknown, late-model
		t.Errorf("duration series = %d, want 3", n)
	}
	if got, err := testutil.GatherAndCount(m.Registry, "moonji_request_duration_seconds"); err != nil || got != 3 {
		t.Errorf("gathered duration series = %d, %v", got, err)
	}
}
