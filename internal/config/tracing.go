package config

import (
	"fmt"
	"math"
	"net/url"
)

// Tracing turns on OpenTelemetry traces of the /v1 requests, exported over
// OTLP/HTTP. Off (the default) while OTLPEndpoint is empty: no span is
// then made and nothing is sent anywhere.
type Tracing struct {
	// OTLPEndpoint is the collector's OTLP/HTTP base URL, such as
	// http://127.0.0.1:4318; spans go to its /v1/traces.
	OTLPEndpoint string `yaml:"otlp_endpoint"`
	// SampleRatio is the share of requests traced that come without a
	// sampled parent (a traceparent's decision is followed); 1 traces
	// every one. Unset: 1.
	SampleRatio *float64 `yaml:"sample_ratio"`
}

// DefaultSampleRatio traces every request once tracing is on: an operator
// who sets an endpoint wants to see spans, and sampling down is a choice.
const DefaultSampleRatio = 1.0

// Enabled tells whether traces are exported.
func (t Tracing) Enabled() bool { return t.OTLPEndpoint != "" }

// Ratio is the sampling ratio, the default when unset.
func (t Tracing) Ratio() float64 {
	if t.SampleRatio == nil {
		return DefaultSampleRatio
	}
	return *t.SampleRatio
}

// validate names what is wrong with the tracing section.
func (t Tracing) validate(bad func(key, format string, args ...any)) {
	if t.OTLPEndpoint != "" {
		u, err := url.Parse(t.OTLPEndpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
			bad("tracing.otlp_endpoint", "want an absolute http(s) URL such as http://127.0.0.1:4318 (no user:password), got %q", redactURL(t.OTLPEndpoint))
		} else if u.RawQuery != "" || u.Fragment != "" {
			bad("tracing.otlp_endpoint", "want a base URL without query or fragment, got %q", redactURL(t.OTLPEndpoint))
		}
	}
	if r := t.Ratio(); math.IsNaN(r) || r < 0 || r > 1 {
		bad("tracing.sample_ratio", "must be between 0 and 1, got %s", fmt.Sprint(r))
	}
}
