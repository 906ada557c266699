// Validate: every check of a loaded configuration, each naming its key.

package config

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"sort"
	"strings"
	"time"

	"moonji/internal/money"
)

// Validate checks the configuration and names the offending key.
func (c *Config) Validate() error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		bad("listen", "want host:port, got %q", c.Listen)
	}
	if _, _, err := DatabaseDriver(c.DatabaseURL); err != nil {
		bad("database_url", "%v", err)
	}
	if c.RedisURL != "" {
		if u, err := url.Parse(c.RedisURL); err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") {
			bad("redis_url", "want redis://host:port[/db], got %q", c.RedisURL)
		}
	}
	if u, err := url.Parse(c.PublicURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("public_url", "want an absolute http(s) URL, got %q", c.PublicURL)
	}
	if c.RateLimit.RequestsPerMinute < 0 {
		bad("rate_limit.requests_per_minute", "must not be negative")
	}
	if c.RateLimit.TokensPerMinute < 0 {
		bad("rate_limit.tokens_per_minute", "must not be negative")
	}
	if c.RateLimit.UnauthenticatedPerMinute < 0 {
		bad("rate_limit.unauthenticated_per_minute", "must not be negative")
	}
	if c.StreamKeepalive != nil && *c.StreamKeepalive < 0 {
		bad("stream_keepalive", "must not be negative (0 turns it off)")
	}
	if c.StreamWriteTimeout < 0 {
		bad("stream_write_timeout", "must not be negative")
	}
	c.Retention.validate(bad)
	if c.MaxBodyBytes < 1024 {
		bad("max_body_bytes", "must be at least 1024, got %d", c.MaxBodyBytes)
	}
	if c.MaxBodyBytes > 1<<30 {
		bad("max_body_bytes", "must be at most 1 GiB, got %d", c.MaxBodyBytes)
	}
	for i, p := range c.TrustedProxies {
		if _, err := ParseCIDROrIP(p); err != nil {
			bad(fmt.Sprintf("trusted_proxies[%d]", i), "%v", err)
		}
	}
	for i, o := range c.CORS.AllowedOrigins {
		if !validOrigin(o) {
			bad(fmt.Sprintf("cors.allowed_origins[%d]", i), "want an origin such as https://app.example.com (scheme, host, optional port; no path), got %q", o)
		}
	}
	for key, v := range map[string]int{"limits.chat_generations_per_person": c.Limits.ChatGenerationsPerPerson,
		"limits.event_streams_per_person": c.Limits.EventStreamsPerPerson, "limits.conversations_per_minute": c.Limits.ConversationsPerMinute,
		"limits.conversations_per_person": c.Limits.ConversationsPerPerson, "limits.searches_per_minute": c.Limits.SearchesPerMinute} {
		if v < 0 {
			bad(key, "must not be negative (0 takes the default)")
		}
	}
	if c.Keys.MaxPerPerson < 0 {
		bad("keys.max_per_person", "must not be negative")
	}
	if c.Keys.MaxRPM < 0 {
		bad("keys.max_rpm", "must not be negative")
	}
	if c.Chat.ContextTokens < 256 || c.Chat.ContextTokens > 10_000_000 {
		bad("chat.context_tokens", "must be between 256 and 10000000, got %d", c.Chat.ContextTokens)
	}
	if a := c.Attachments.MaxBytes; a < 1024 || a > MaxAttachmentBytes {
		bad("attachments.max_bytes", "must be between 1024 and %d (64 MiB), got %d", MaxAttachmentBytes, a)
	}
	if n := c.Attachments.MaxPerMessage; n < 1 || n > MaxAttachmentsPerLimit {
		bad("attachments.max_per_message", "must be between 1 and %d, got %d", MaxAttachmentsPerLimit, n)
	}
	c.Tracing.validate(bad)
	backends := map[string]bool{}
	for i, b := range c.Backends {
		key := fmt.Sprintf("backends[%d]", i)
		switch {
		case b.Name == "":
			bad(key+".name", "is required")
		case backends[b.Name]:
			bad(key+".name", "duplicate backend %q", b.Name)
		}
		backends[b.Name] = true
		switch b.Kind {
		case KindOpenAI:
			u, err := url.Parse(b.URL)
			if b.URL == "" {
				bad(key+".url", "is required for kind %q", b.Kind)
			} else if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				bad(key+".url", "want an absolute http(s) URL such as http://127.0.0.1:8000/v1, got %q", b.URL)
			}
		case KindBuiltin:
		case KindEngine:
			u, err := url.Parse(b.URL)
			if b.URL == "" {
				bad(key+".url", "is required for kind %q", b.Kind)
			} else if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
				bad(key+".url", "want an absolute ws(s) URL such as ws://127.0.0.1:9300/engine, got %q", b.URL)
			}
			if b.Link.QueueSize < 0 || b.Link.MessageTTL < 0 || b.Link.PingInterval < 0 {
				bad(key+".link", "queue_size, message_ttl and ping_interval must not be negative")
			}
		default:
			bad(key+".kind", "unknown kind %q (want %q, %q or %q)", b.Kind, KindOpenAI, KindBuiltin, KindEngine)
		}
		if b.CAFile != "" {
			if u, err := url.Parse(b.URL); b.Kind != KindOpenAI || err != nil || u.Scheme != "https" {
				bad(key+".ca_file", "is for an openai backend whose url is https, got kind %q and url %q", b.Kind, b.URL)
			} else if err := checkCAFile(b.CAFile); err != nil {
				bad(key+".ca_file", "%v", err)
			}
		}
		if b.MaxConcurrency < 1 {
			bad(key+".max_concurrency", "must be at least 1")
		}
		if b.MaxQueue < 0 {
			bad(key+".max_queue", "must not be negative")
		}
		if b.QueueTimeout < 0 {
			bad(key+".queue_timeout", "must not be negative")
		}
		seenAPI := map[string]bool{}
		for j, a := range b.APIs {
			switch {
			case !knownAPIs[a]:
				bad(fmt.Sprintf("%s.apis[%d]", key, j), "unknown API %q (want chat, responses, embeddings or completions)", a)
			case seenAPI[a]:
				bad(fmt.Sprintf("%s.apis[%d]", key, j), "%q listed twice", a)
			case b.Kind == KindEngine && a != "chat":
				bad(fmt.Sprintf("%s.apis[%d]", key, j), "an engine backend carries chat only, got %q", a)
			}
			seenAPI[a] = true
		}
		if !(b.Weight > 0 && b.Weight <= 1000) {
			bad(key+".weight", "must be above 0 and at most 1000, got %v", b.Weight)
		}
	}
	apisOf := map[string]string{}
	for _, b := range c.Backends {
		sorted := append([]string(nil), b.APIs...)
		sort.Strings(sorted)
		apisOf[b.Name] = strings.Join(sorted, ",")
	}
	models := map[string]bool{}
	for i, m := range c.Models {
		if names := m.BackendNames(); len(names) > 1 {
			for _, n := range names[1:] {
				if backends[n] && backends[names[0]] && apisOf[n] != apisOf[names[0]] {
					bad(key(i), "backends %q and %q serve different apis (%s / %s); a model's backends must serve the same", names[0], n, apisOf[names[0]], apisOf[n])
					break
				}
			}
		}
		key := fmt.Sprintf("models[%d]", i)
		switch {
		case m.Name == "":
			bad(key+".name", "is required")
		case models[m.Name]:
			bad(key+".name", "duplicate model %q", m.Name)
		}
		models[m.Name] = true
		switch {
		case m.Backend != "" && len(m.Backends) > 0:
			bad(key, "give backend or backends, not both")
		case len(m.Backends) > 0:
			if len(m.Backends) > MaxBackendsPerModel {
				bad(key+".backends", "at most %d backends, got %d", MaxBackendsPerModel, len(m.Backends))
			}
			seen := map[string]bool{}
			for j, name := range m.Backends {
				switch {
				case !backends[name]:
					bad(fmt.Sprintf("%s.backends[%d]", key, j), "unknown backend %q", name)
				case seen[name]:
					bad(fmt.Sprintf("%s.backends[%d]", key, j), "backend %q listed twice", name)
				}
				seen[name] = true
			}
		case !backends[m.Backend]:
			bad(key+".backend", "unknown backend %q", m.Backend)
		}
		if m.Price != nil {
			for field, v := range map[string]float64{"input": m.Price.Input, "output": m.Price.Output, "cached_input": m.Price.CachedInput} {
				if _, err := money.FromFloat(v, money.MaxPrice); err != nil {
					bad(key+".price."+field, "%v", err)
				}
			}
		}
		if m.MaxOutputTokens < 0 || m.MaxOutputTokens > MaxOutputTokensLimit {
			bad(key+".max_output_tokens", "must be between 0 and %d, got %d", MaxOutputTokensLimit, m.MaxOutputTokens)
		}
	}
	if !currencyCode.MatchString(c.Currency) {
		bad("currency", "want a code of 3 capital letters (ISO 4217, e.g. USD), got %q", c.Currency)
	}
	if c.LeaseTTL < time.Second || c.LeaseTTL > 10*time.Minute {
		bad("lease_ttl", "must be between 1s and 10m, got %s", c.LeaseTTL)
	}
	if c.Health.Backoff < 0 || c.Health.MaxBackoff < c.Health.Backoff || c.Health.ProbeTimeout <= 0 {
		bad("health", "want 0 < backoff <= max_backoff and a positive probe_timeout")
	}
	if c.Stop.TTL < 0 {
		bad("stop.ttl", "must not be negative")
	}
	if c.Stop.PingInterval < 0 {
		bad("stop.ping_interval", "must not be negative")
	}
	if c.OIDC != nil {
		if c.OIDC.Issuer == "" {
			bad("oidc.issuer", "is required")
		}
		if c.OIDC.ClientID == "" {
			bad("oidc.client_id", "is required")
		}
	} else if !c.DevIDP.AllowNonLoopback {
		if !IsLoopback(c.Listen) {
			bad("dev_idp", "the embedded development login provider refuses to run on the non-loopback address %q; configure an oidc section, or set dev_idp.allow_non_loopback: true if you really mean it", c.Listen)
		}
		if !isLoopbackURL(c.PublicURL) {
			bad("dev_idp", "the embedded development login provider refuses to serve the non-loopback public_url %q (a proxy would expose it); configure an oidc section, or set dev_idp.allow_non_loopback: true if you really mean it", c.PublicURL)
		}
	}
	return errors.Join(errs...)
}

// checkCAFile tells that a backend's ca_file can be read and holds at
// least one PEM certificate.
func checkCAFile(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if !x509.NewCertPool().AppendCertsFromPEM(raw) {
		return fmt.Errorf("%s holds no PEM certificate (want one or more -----BEGIN CERTIFICATE----- blocks)", path)
	}
	return nil
}

// isLoopbackURL reports whether an absolute URL names a loopback host.
func isLoopbackURL(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return false
	}
	port := u.Port()
	if port == "" {
		port = "80"
	}
	return IsLoopback(net.JoinHostPort(u.Hostname(), port))
}

// ParseCIDROrIP parses a CIDR ("10.0.0.0/8") or a single address
// ("10.0.0.1", a /32 or /128).
func ParseCIDROrIP(s string) (*net.IPNet, error) {
	if _, n, err := net.ParseCIDR(s); err == nil {
		return n, nil
	}
	ip := net.ParseIP(s)
	if ip == nil {
		return nil, fmt.Errorf("want a CIDR such as 10.0.0.0/8 or an address, got %q", s)
	}
	bits := 128
	if ip4 := ip.To4(); ip4 != nil {
		ip, bits = ip4, 32
	}
	return &net.IPNet{IP: ip, Mask: net.CIDRMask(bits, bits)}, nil
}

// validOrigin reports whether o is a browser origin: http(s), a host, an
// optional port, nothing else.
func validOrigin(o string) bool {
	u, err := url.Parse(o)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" &&
		u.Path == "" && u.RawQuery == "" && u.Fragment == "" && u.User == nil && u.Scheme+"://"+u.Host == o
}

// IsLoopback reports whether a listen address only accepts local connections.
func IsLoopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
