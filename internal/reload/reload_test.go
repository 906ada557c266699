package reload

import (
	"slices"
	"strings"
	"testing"
	"time"

	"moonji/internal/config"
)

func parse(t *testing.T, yaml string) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte(yaml), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

const base = `
backends:
  - {name: a, kind: openai, url: "http://127.0.0.1:9001/v1", max_concurrency: 4}
  - {name: b, kind: openai, url: "http://127.0.0.1:9002/v1", max_concurrency: 4}
models:
  - {name: m1, backend: a}
  - {name: m2, backend: b}
`

func TestVersionIsTheFilesBytes(t *testing.T) {
	at := time.Date(2026, 12, 7, 1, 2, 3, 0, time.UTC)
	v1, v2 := NewVersion([]byte(base), at), NewVersion([]byte(base), at.Add(time.Hour))
	if v1.ID != v2.ID || len(v1.ID) != 12 {
		t.Errorf("the same bytes: %q and %q, want one 12-digit id", v1.ID, v2.ID)
	}
	if v3 := NewVersion([]byte(base+"\n"), at); v3.ID == v1.ID {
		t.Errorf("other bytes, the same id %q", v3.ID)
	}
}

func TestCompare(t *testing.T) {
	old := parse(t, base)
	if c := Compare(old, parse(t, base)); c.Applied() || len(c.Restart) > 0 || c.Summary() != "nothing to apply" {
		t.Errorf("the same file: %+v (%s)", c, c.Summary())
	}

	// b removed, c added, a's limit changed, m1 moved, m2 gone, m3 new, the
	// per-key rate changed; listen, retention and tracing need a restart.
	next := parse(t, `
listen: "127.0.0.1:9999"
retention: {usage: 30d}
tracing: {otlp_endpoint: "http://127.0.0.1:4318"}
rate_limit: {requests_per_minute: 7}
backends:
  - {name: a, kind: openai, url: "http://127.0.0.1:9001/v1", max_concurrency: 8}
  - {name: c, kind: openai, url: "http://127.0.0.1:9003/v1", max_concurrency: 4}
models:
  - {name: m1, backend: c}
  - {name: m3, backend: a}
`)
	c := Compare(old, next)
	for _, check := range []struct {
		what      string
		got, want []string
	}{
		{"backends added", c.BackendsAdded, []string{"c"}},
		{"backends removed", c.BackendsRemoved, []string{"b"}},
		{"backends changed", c.BackendsChanged, []string{"a"}},
		{"models added", c.ModelsAdded, []string{"m3"}},
		{"models removed", c.ModelsRemoved, []string{"m2"}},
		{"models changed", c.ModelsChanged, []string{"m1"}},
	} {
		if !slices.Equal(check.got, check.want) {
			t.Errorf("%s: %v, want %v", check.what, check.got, check.want)
		}
	}
	if !c.RateLimit || !c.Applied() {
		t.Errorf("rate limit %t, applied %t: want both", c.RateLimit, c.Applied())
	}
	for _, key := range []string{"listen", "retention", "tracing"} {
		if !slices.Contains(c.Restart, key) {
			t.Errorf("restart-only keys %v lack %q", c.Restart, key)
		}
	}
	for _, key := range []string{"backends", "models", "rate_limit"} {
		if slices.Contains(c.Restart, key) {
			t.Errorf("%q is applied by a reload, yet listed as needing a restart: %v", key, c.Restart)
		}
	}
	s := c.Summary()
	for _, want := range []string{"backends +1 −1", "added: c", "removed: b", "changed: a", "models changed: m1",
		"rate limit changed", "needs a restart (not applied): "} {
		if !strings.Contains(s, want) {
			t.Errorf("summary %q lacks %q", s, want)
		}
	}
}
