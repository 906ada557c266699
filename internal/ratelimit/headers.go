package ratelimit

import (
	"net/textproto"
	"strconv"
	"time"
)

// Header names, as OpenAI sends them.
const (
	HeaderLimitRequests     = "x-ratelimit-limit-requests"
	HeaderRemainingRequests = "x-ratelimit-remaining-requests"
	HeaderResetRequests     = "x-ratelimit-reset-requests"
	HeaderLimitTokens       = "x-ratelimit-limit-tokens"
	HeaderRemainingTokens   = "x-ratelimit-remaining-tokens"
	HeaderResetTokens       = "x-ratelimit-reset-tokens"
	HeaderRetryAfter        = "Retry-After"
)

// The same names as an http.Header keys them, worked out once: SetHeaders
// runs for every request, and http.Header.Set would allocate to
// canonicalize a lower-case name each time (the HTTP server writes every
// name in this form anyway: names are case-insensitive).
var (
	canonicalLimitRequests     = textproto.CanonicalMIMEHeaderKey(HeaderLimitRequests)
	canonicalRemainingRequests = textproto.CanonicalMIMEHeaderKey(HeaderRemainingRequests)
	canonicalResetRequests     = textproto.CanonicalMIMEHeaderKey(HeaderResetRequests)
	canonicalLimitTokens       = textproto.CanonicalMIMEHeaderKey(HeaderLimitTokens)
	canonicalRemainingTokens   = textproto.CanonicalMIMEHeaderKey(HeaderRemainingTokens)
	canonicalResetTokens       = textproto.CanonicalMIMEHeaderKey(HeaderResetTokens)
)

// SetHeaders writes the OpenAI-style rate-limit headers for a request's
// two decisions through set, which can be fiber's c.Set or an http.Header's
// Set, with each name in its canonical form (X-Ratelimit-Limit-Requests).
// A decision with Limit 0 (unlimited, or not evaluated) writes no headers.
// Retry-After is written only when a decision refused the request: the
// largest of their RetryAfter values, in whole seconds, never 0.
func SetHeaders(set func(name, value string), requests, tokens Decision) {
	if requests.Limit > 0 {
		set(canonicalLimitRequests, strconv.Itoa(requests.Limit))
		set(canonicalRemainingRequests, strconv.Itoa(requests.Remaining))
		set(canonicalResetRequests, FormatReset(requests.ResetAfter))
	}
	if tokens.Limit > 0 {
		set(canonicalLimitTokens, strconv.Itoa(tokens.Limit))
		set(canonicalRemainingTokens, strconv.Itoa(tokens.Remaining))
		set(canonicalResetTokens, FormatReset(tokens.ResetAfter))
	}
	if s := RetryAfterSeconds(requests, tokens); s > 0 {
		set(HeaderRetryAfter, strconv.Itoa(s))
	}
}

// FormatReset formats a reset duration the way OpenAI does ("12ms", "1s",
// "8.64s", "6m0s"): Go's duration syntax, rounded up to the millisecond so
// that a client waiting that long never arrives early.
func FormatReset(d time.Duration) string {
	if d <= 0 {
		return "0s"
	}
	ms := (d + time.Millisecond - 1) / time.Millisecond * time.Millisecond
	return ms.String()
}

// RetryAfterSeconds returns the Retry-After value for a set of decisions:
// 0 when all allowed the request, otherwise the largest wait among the
// refusals in whole seconds, at least 1.
func RetryAfterSeconds(ds ...Decision) int {
	var worst time.Duration
	refused := false
	for _, d := range ds {
		if d.Limit > 0 && !d.Allowed {
			refused = true
			worst = max(worst, d.RetryAfter)
		}
	}
	if !refused {
		return 0
	}
	return int(ceilSeconds(worst) / time.Second)
}
