package web

import (
	"strings"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/ratelimit"
)

// CORS for /v1: browser apps on the configured origins may call the API
// with a key. Only /v1 is mounted with it; pages and /api stay same-origin.
// No Access-Control-Allow-Credentials is ever sent, so a browser never
// sends cookies across origins with a request it lets a page read: a
// browser app uses a key, not a person's session.
const (
	// corsMethods are the methods /v1 serves.
	corsMethods = "GET, POST"
	// corsHeaders are granted when a preflight names none.
	corsHeaders = "Authorization, Content-Type"
	// corsMaxAge lets a browser reuse a preflight's answer for two hours
	// (Chromium's own cap). Taking an origin off the list still works at
	// once: each answer needs its own Access-Control-Allow-Origin.
	corsMaxAge = "7200"
)

// corsExposed are the response headers a page may read: the ids (the
// openai SDKs read x-request-id) and what a client needs to back off.
var corsExposed = strings.Join([]string{"X-Inference-Id", "X-Request-Id", "Retry-After",
	ratelimit.HeaderLimitRequests, ratelimit.HeaderRemainingRequests, ratelimit.HeaderResetRequests,
	ratelimit.HeaderLimitTokens, ratelimit.HeaderRemainingTokens, ratelimit.HeaderResetTokens}, ", ")

// cors returns the middleware that answers preflights and grants the
// configured origins, exactly as listed (never "*"). Any other origin gets
// no Access-Control-* header at all, and its preflight a bare 204.
func cors(allowed []string) fiber.Handler {
	origins := make(map[string]bool, len(allowed))
	for _, o := range allowed {
		// Browsers send the origin's scheme and host in lower case.
		origins[strings.ToLower(o)] = true
	}
	return func(c *fiber.Ctx) error {
		// The answer depends on Origin, so caches must keep one per origin.
		c.Vary(fiber.HeaderOrigin)
		origin := c.Get(fiber.HeaderOrigin)
		granted := origin != "" && origins[origin]
		preflight := c.Method() == fiber.MethodOptions && c.Get(fiber.HeaderAccessControlRequestMethod) != ""
		if preflight {
			c.Vary(fiber.HeaderAccessControlRequestMethod, fiber.HeaderAccessControlRequestHeaders)
			if granted {
				c.Set(fiber.HeaderAccessControlAllowOrigin, origin)
				c.Set(fiber.HeaderAccessControlAllowMethods, corsMethods)
				c.Set(fiber.HeaderAccessControlAllowHeaders, requestedHeaders(c.Get(fiber.HeaderAccessControlRequestHeaders)))
				c.Set(fiber.HeaderAccessControlMaxAge, corsMaxAge)
			}
			return c.SendStatus(fiber.StatusNoContent)
		}
		if granted {
			c.Set(fiber.HeaderAccessControlAllowOrigin, origin)
			c.Set(fiber.HeaderAccessControlExposeHeaders, corsExposed)
		}
		return c.Next()
	}
}

// requestedHeaders is the Access-Control-Allow-Headers of a granted
// preflight: the headers it asks for (the openai SDKs send their own
// x-stainless-* and openai-* headers, and add more from one version to the
// next), as long as they are a plain list of header names; else the base
// set.
func requestedHeaders(asked string) string {
	if strings.TrimSpace(asked) == "" {
		return corsHeaders
	}
	for _, name := range strings.Split(asked, ",") {
		name = strings.TrimSpace(name)
		if name == "" || strings.IndexFunc(name, func(r rune) bool { return !isTokenChar(r) }) >= 0 {
			return corsHeaders
		}
	}
	return asked
}

// isTokenChar reports whether r may appear in a header name (RFC 9110's
// tchar).
func isTokenChar(r rune) bool {
	switch {
	case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		return true
	}
	return strings.ContainsRune("!#$%&'*+-.^_`|~", r)
}
