package ratelimit

import (
	"testing"
	"time"
)

func TestFormatReset(t *testing.T) {
	cases := map[time.Duration]string{
		0:                                   "0s",
		-time.Second:                        "0s",
		12 * time.Millisecond:               "12ms",
		time.Second:                         "1s",
		6 * time.Minute:                     "6m0s",
		8640 * time.Millisecond:             "8.64s",
		time.Millisecond + time.Microsecond: "2ms", // rounded up, never early
		time.Microsecond:                    "1ms",
	}
	for d, want := range cases {
		if got := FormatReset(d); got != want {
			t.Errorf("FormatReset(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestSetHeaders(t *testing.T) {
	got := map[string]string{}
	set := func(k, v string) { got[k] = v }
	SetHeaders(set,
		Decision{Allowed: true, Limit: 60, Remaining: 59, ResetAfter: time.Second},
		Decision{Allowed: false, Limit: 10000, Remaining: 0, ResetAfter: 6 * time.Minute, RetryAfter: 3 * time.Second})
	// Canonical names, so that an http.Header's Set keeps them as they are.
	want := map[string]string{
		"X-Ratelimit-Limit-Requests":     "60",
		"X-Ratelimit-Remaining-Requests": "59",
		"X-Ratelimit-Reset-Requests":     "1s",
		"X-Ratelimit-Limit-Tokens":       "10000",
		"X-Ratelimit-Remaining-Tokens":   "0",
		"X-Ratelimit-Reset-Tokens":       "6m0s",
		"Retry-After":                    "3",
	}
	if len(got) != len(want) {
		t.Fatalf("headers = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("%s = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}

	// Allowed everywhere: no Retry-After; unlimited tokens: no token headers.
	got = map[string]string{}
	SetHeaders(set, Decision{Allowed: true, Limit: 60, Remaining: 1}, Decision{Allowed: true})
	if _, ok := got["Retry-After"]; ok || len(got) != 3 {
		t.Fatalf("headers = %v", got)
	}
}

func TestRetryAfterNeverZero(t *testing.T) {
	if s := RetryAfterSeconds(Decision{Limit: 1, Allowed: false, RetryAfter: 0}); s != 1 {
		t.Fatalf("RetryAfterSeconds = %d, want 1", s)
	}
	if s := RetryAfterSeconds(Decision{Limit: 1, Allowed: false, RetryAfter: 1500 * time.Millisecond}); s != 2 {
		t.Fatalf("RetryAfterSeconds = %d, want 2", s)
	}
	if s := RetryAfterSeconds(Decision{Limit: 1, Allowed: true}, Decision{Allowed: true}); s != 0 {
		t.Fatalf("RetryAfterSeconds = %d, want 0 when allowed", s)
	}
}
