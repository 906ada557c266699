package web

import (
	"bytes"
	"strings"
	"time"

	"github.com/tidwall/gjson"
	"github.com/valyala/fasthttp"

	"moonji/internal/apikey"
	"moonji/internal/auth"
	"moonji/internal/gateway"
)

// limitKeyFailures counts the 401s of /v1 requests that carried a key, per
// source address, logs each without the secret, and answers 429 to an
// address that has failed too often until its window ends.
//
// It wraps the fasthttp handler rather than being Fiber middleware because
// the /v1 routes are mounted before setupAuth runs, and Fiber runs handlers
// in the order they were added: middleware added now would never see /v1.
// Watching the answer's status keeps the key check itself in one place
// (handlers' principal) whatever its reasons for refusing.
func (s *Server) limitKeyFailures(svc *auth.Service) {
	srv := s.App.Server()
	next := srv.Handler
	limiter := svc.Failures
	log := s.log
	srv.Handler = func(ctx *fasthttp.RequestCtx) {
		authz := ctx.Request.Header.Peek(fasthttp.HeaderAuthorization)
		if len(authz) == 0 || !bytes.HasPrefix(ctx.Path(), []byte("/v1/")) {
			next(ctx)
			return
		}
		addr := ctx.RemoteIP().String()
		if limiter.Blocked(addr, time.Now()) {
			ctx.SetStatusCode(fasthttp.StatusTooManyRequests)
			ctx.SetContentType("application/json")
			ctx.Response.Header.Set(fasthttp.HeaderRetryAfter, "60")
			ctx.SetBody(gateway.ErrorBody("Too many failed authentications from your address; try again in a minute.",
				"invalid_request_error", "rate_limit_exceeded"))
			return
		}
		// Copied before the handler runs: fasthttp may reuse the buffer.
		prefix := keyPrefix(string(authz))
		next(ctx)
		if ctx.Response.StatusCode() != fasthttp.StatusUnauthorized {
			return
		}
		blocked := limiter.Fail(addr, time.Now())
		log.Warn("authentication failed", "kind", "api_key", "key_prefix", prefix,
			"reason", gjson.GetBytes(ctx.Response.Body(), "error.message").Str,
			"remote", addr, "path", string(ctx.Path()), "now_blocked", blocked)
	}
}

// keyPrefix is the part of a presented key that lists show (mj- and eight
// characters), enough to tell which key failed and useless to an attacker;
// anything that does not look like a Moonji key is not logged at all.
func keyPrefix(authorization string) string {
	key, ok := strings.CutPrefix(authorization, "Bearer ")
	key = strings.TrimSpace(key)
	if !ok || !strings.HasPrefix(key, apikey.Prefix) || len(key) < len(apikey.Prefix)+8 {
		return "(not a moonji key)"
	}
	return key[:len(apikey.Prefix)+8]
}
