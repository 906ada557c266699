// What a configuration gets when a key is left out, and the environment's
// overrides.

package config

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

func (c *Config) applyEnv() {
	if v := os.Getenv("MOONJI_LISTEN"); v != "" {
		c.Listen = v
	}
	if v := os.Getenv("MOONJI_DATABASE_URL"); v != "" {
		c.DatabaseURL = v
	}
	if v, ok := os.LookupEnv("MOONJI_REDIS_URL"); ok {
		c.RedisURL = v
	}
	if v := os.Getenv("MOONJI_JOURNAL_DIR"); v != "" {
		c.JournalDir = v
	}
	if v := os.Getenv("MOONJI_REPLICA_ID"); v != "" {
		c.ReplicaID = v
	}
	if v := os.Getenv("MOONJI_PUBLIC_URL"); v != "" {
		c.PublicURL = v
	}
	if v := os.Getenv("MOONJI_ENGINE_TOKEN"); v != "" {
		c.Engine.Token = v
	}
}

// currencyCode is what Currency may be.
var currencyCode = regexp.MustCompile(`^[A-Z]{3}$`)

func (c *Config) applyDefaults() {
	if c.Currency == "" {
		c.Currency = "USD"
	}
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8080"
	}
	if c.DatabaseURL == "" {
		c.DatabaseURL = "sqlite://data/moonji.db"
	}
	if c.JournalDir == "" {
		c.JournalDir = filepath.Join("data", "journal")
		if driver, path, err := DatabaseDriver(c.DatabaseURL); err == nil && driver == "sqlite" {
			path, _, _ = strings.Cut(path, "?")
			c.JournalDir = filepath.Join(filepath.Dir(path), "journal")
		}
	}
	if c.RedisPrefix == "" {
		c.RedisPrefix = "moonji:"
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 10 * time.Second
	}
	if c.Health.Backoff == 0 {
		c.Health.Backoff = time.Second
	}
	if c.Health.MaxBackoff == 0 {
		c.Health.MaxBackoff = 30 * time.Second
	}
	if c.Health.ProbeTimeout == 0 {
		c.Health.ProbeTimeout = 2 * time.Second
	}
	if c.RateLimit.RequestsPerMinute == 0 {
		c.RateLimit.RequestsPerMinute = 60
	}
	if c.RateLimit.UnauthenticatedPerMinute == 0 {
		c.RateLimit.UnauthenticatedPerMinute = 120
	}
	if c.StreamWriteTimeout == 0 {
		c.StreamWriteTimeout = DefaultStreamWriteTimeout
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.Keys.MaxPerPerson == 0 {
		c.Keys.MaxPerPerson = 20
	}
	if c.Keys.MaxRPM == 0 {
		c.Keys.MaxRPM = c.RateLimit.RequestsPerMinute
	}
	if c.Chat.ContextTokens == 0 {
		c.Chat.ContextTokens = DefaultChatContextTokens
	}
	if c.Attachments.MaxBytes == 0 {
		c.Attachments.MaxBytes = DefaultAttachmentBytes
	}
	if c.Attachments.MaxPerMessage == 0 {
		c.Attachments.MaxPerMessage = DefaultAttachmentsPer
	}
	l, d := &c.Limits, DefaultLimits
	for _, f := range []struct {
		v   *int
		def int
	}{
		{&l.ChatGenerationsPerPerson, d.ChatGenerationsPerPerson}, {&l.EventStreamsPerPerson, d.EventStreamsPerPerson},
		{&l.ConversationsPerMinute, d.ConversationsPerMinute}, {&l.ConversationsPerPerson, d.ConversationsPerPerson},
		{&l.SearchesPerMinute, d.SearchesPerMinute},
	} {
		if *f.v == 0 {
			*f.v = f.def
		}
	}
	if len(c.Backends) == 0 && len(c.Models) == 0 {
		c.Backends = []Backend{{Name: "demo", Kind: KindBuiltin, TokensPerSecond: 30}}
		c.Models = []Model{{Name: DemoModel, Backend: "demo"}}
	}
	for i := range c.Backends {
		b := &c.Backends[i]
		if b.Kind == "" {
			b.Kind = KindOpenAI
		}
		if b.MaxConcurrency == 0 {
			b.MaxConcurrency = 16
		}
		if b.Weight == 0 {
			b.Weight = 1
		}
		if len(b.APIs) == 0 {
			b.APIs = []string{"chat"}
			if b.Kind == KindBuiltin {
				b.APIs = []string{"chat", "responses", "embeddings", "completions"}
			}
		}
		if b.MaxQueue == 0 && !b.maxQueueSet {
			b.MaxQueue = 32
		}
		if b.QueueTimeout == 0 {
			b.QueueTimeout = 30 * time.Second
		}
		if b.Kind == KindBuiltin && b.TokensPerSecond == 0 {
			b.TokensPerSecond = 30
		}
		if b.Kind == KindEngine {
			if b.Link.QueueSize == 0 {
				b.Link.QueueSize = 256
			}
			if b.Link.MessageTTL == 0 {
				b.Link.MessageTTL = 10 * time.Second
			}
			if b.Link.PingInterval == 0 {
				b.Link.PingInterval = 5 * time.Second
			}
		}
	}
	if c.Stop.TTL == 0 {
		c.Stop.TTL = 10 * time.Minute
	}
	if c.Stop.AckTimeout == 0 {
		c.Stop.AckTimeout = 2 * time.Second
	}
	if c.Stop.PingInterval == 0 {
		c.Stop.PingInterval = time.Second
	}
	if c.DevIDP.AdminEmail == "" {
		c.DevIDP.AdminEmail = "admin@localhost"
	}
	if c.PublicURL == "" {
		c.PublicURL = "http://" + c.Listen
	}
	if c.ReplicaID == "" {
		host, _ := os.Hostname()
		c.ReplicaID = host + "/" + c.Listen
	}
	c.PublicURL = strings.TrimRight(c.PublicURL, "/")
	if c.OIDC != nil && len(c.OIDC.Scopes) == 0 {
		c.OIDC.Scopes = []string{"openid", "profile", "email"}
	}
}
