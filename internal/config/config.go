// Package config loads Moonji's configuration: one YAML file plus a few
// environment overrides, validated at start so that a bad file fails with a
// message naming the key and the problem.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"reflect"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"moonji/internal/money"
)

// DemoModel is the name of the built-in model served in-process on the
// embedded default, so a newcomer can chat with nothing else installed.
const DemoModel = "moonji-demo"

// Backend kinds.
const (
	KindOpenAI  = "openai"  // any OpenAI-compatible server (vLLM, Ollama, llama.cpp, …)
	KindBuiltin = "builtin" // the in-process demo engine
	KindEngine  = "engine"  // a `moonji engine` behind one multiplexed WebSocket (docs/engine-protocol.md)
)

// Defaults of the top-level limits.
const (
	DefaultStreamWriteTimeout = 30 * time.Second
	// DefaultStreamKeepalive is a quarter of nginx's default
	// proxy_read_timeout (60 s), and AWS ALB's idle timeout (60 s).
	DefaultStreamKeepalive = 15 * time.Second
	// DefaultMaxBodyBytes fits a chat with a few base64 images (OpenAI
	// allows 20 MB per image) while bounding what one request can take.
	DefaultMaxBodyBytes = 32 << 20
)

// Config is the whole configuration file.
type Config struct {
	Listen string `yaml:"listen"`
	// ReplicaID names this gateway replica in the ledger; default
	// hostname/listen, which stays the same across restarts of one instance.
	ReplicaID   string `yaml:"replica_id"`
	PublicURL   string `yaml:"public_url"`
	DatabaseURL string `yaml:"database_url"`
	RedisURL    string `yaml:"redis_url"`
	// JournalDir is where this replica journals the usage rows it has
	// begun and not yet written to the database, so that no request waits
	// on the database before its answer starts and none loses its row in a
	// crash. Default: beside the SQLite file, else data/journal.
	JournalDir string `yaml:"journal_dir"`
	// RedisPrefix starts every Redis key and channel Moonji uses, so that
	// several deployments (or test runs) can share one Redis.
	RedisPrefix string `yaml:"redis_prefix"`
	// LeaseTTL is how long a backend slot held in Redis lives unless its
	// replica renews it (default 10s): with redis_url set, each backend's
	// max_concurrency holds for all replicas together, and a replica that
	// dies frees its slots within this time.
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// LocalConcurrency keeps each backend's max_concurrency per replica
	// even with redis_url set (no lease per request): for replicas that
	// each front engines of their own.
	LocalConcurrency bool      `yaml:"local_concurrency"`
	Health           Health    `yaml:"health"`
	RateLimit        RateLimit `yaml:"rate_limit"`
	Backends         []Backend `yaml:"backends"`
	Models           []Model   `yaml:"models"`
	// Currency is the one currency of every price, cost and budget (an
	// ISO 4217 code; default USD). Amounts are never converted.
	Currency string `yaml:"currency"`
	Stop     Stop   `yaml:"stop"`
	OIDC     *OIDC  `yaml:"oidc"`
	DevIDP   DevIDP `yaml:"dev_idp"`

	// StreamWriteTimeout cancels a stream whose client makes no write
	// progress (stops reading but keeps the socket open) for this long,
	// freeing its backend slot.
	StreamWriteTimeout time.Duration `yaml:"stream_write_timeout"`
	// StreamKeepalive is how long a stream may stay silent before it gets
	// an SSE comment (": keepalive"), so that a proxy's idle timeout does not
	// cut an engine that thinks; 0 turns it off, unset is the default.
	// Read it with Keepalive.
	StreamKeepalive *time.Duration `yaml:"stream_keepalive"`
	// MaxBodyBytes caps a request body; larger ones get 413. Bodies are
	// read only after the caller is authenticated.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// TrustedProxies lists the proxies (CIDRs or addresses) whose
	// X-Forwarded-For names the client; from any other peer the header is
	// ignored.
	TrustedProxies []string `yaml:"trusted_proxies"`
	CORS           CORS     `yaml:"cors"`
	Keys           Keys     `yaml:"keys"`
	Chat           Chat     `yaml:"chat"`
	Share          Share    `yaml:"share"`
	// Attachments bounds the files people attach to chat messages.
	Attachments Attachments `yaml:"attachments"`
	Limits      Limits      `yaml:"limits"`
	// Engine configures `moonji engine`; the gateway ignores it.
	Engine Engine `yaml:"engine"`
	// Retention: how long usage rows and conversations are kept.
	Retention Retention `yaml:"retention"`
	// Tracing exports OpenTelemetry traces of /v1 requests (tracing.go);
	// off unless an endpoint is set.
	Tracing Tracing `yaml:"tracing"`
}

// Link tunes the connection of an `engine` backend: the queue that holds
// requests while the engine is away, and the heartbeat.
type Link struct {
	// QueueSize bounds the requests waiting for a connection (default 256);
	// beyond it a request fails at once.
	QueueSize int `yaml:"queue_size"`
	// MessageTTL is how long a request may wait for a connection (default
	// 10s); after it, it fails as engine_disconnected.
	MessageTTL time.Duration `yaml:"message_ttl"`
	// PingInterval is the heartbeat (default 5s): an engine silent for two
	// intervals is dropped and redialled.
	PingInterval time.Duration `yaml:"ping_interval"`
}

// Engine configures `moonji engine`, which serves this file's models to
// gateways over the engine protocol (docs/engine-protocol.md).
type Engine struct {
	// Token, when set, is the shared secret a gateway must send as
	// `Authorization: Bearer <token>` to connect (also MOONJI_ENGINE_TOKEN).
	Token string `yaml:"token"`
}

// Chat configures the browser chat.
type Chat struct {
	// ContextTokens bounds the earlier messages sent with a new one: the
	// oldest are left out until the estimate fits. The newest message is
	// always sent.
	ContextTokens int `yaml:"context_tokens"`
}

// Share configures share links to conversations (internal/share).
type Share struct {
	// Public lets anyone with a link open it; false (the default) asks a
	// signed-out visitor to sign in first.
	Public bool `yaml:"public"`
}

// Attachments bounds the files attached to chat messages (images and text
// files): each 0 takes its default.
type Attachments struct {
	// MaxBytes bounds one image (default 10 MiB); a text file is bounded
	// by 512 KiB too.
	MaxBytes int64 `yaml:"max_bytes"`
	// MaxPerMessage bounds the files of one message (default 4).
	MaxPerMessage int `yaml:"max_per_message"`
}

// Defaults and bounds of the attachments' limits. An image goes to the
// engine base64 in every request of its conversation: 64 MiB is far past
// what engines take.
const (
	DefaultAttachmentBytes = 10 << 20
	DefaultAttachmentsPer  = 4
	MaxAttachmentBytes     = 64 << 20
	MaxAttachmentsPerLimit = 16
)

// Limits bound what one person may hold of everyone's share (admins
// included): each 0 takes its default.
type Limits struct {
	// ChatGenerationsPerPerson bounds a person's chat replies being written
	// or waiting for a slot at once, across every replica; past it a reply
	// is refused (429 too_many_generations) before it takes a slot or a
	// queue place.
	ChatGenerationsPerPerson int `yaml:"chat_generations_per_person"`
	// EventStreamsPerPerson bounds a person's open event streams (a reply
	// followed live) on each replica; past it 429 too_many_streams.
	EventStreamsPerPerson int `yaml:"event_streams_per_person"`
	// ConversationsPerMinute and ConversationsPerPerson bound how fast a
	// person creates conversations and how many they keep (429
	// too_many_conversations).
	ConversationsPerMinute int `yaml:"conversations_per_minute"`
	ConversationsPerPerson int `yaml:"conversations_per_person"`
	// SearchesPerMinute bounds a person's history searches (429
	// too_many_searches).
	SearchesPerMinute int `yaml:"searches_per_minute"`
}

// Defaults of the per-person limits.
var DefaultLimits = Limits{ChatGenerationsPerPerson: 4, EventStreamsPerPerson: 16, ConversationsPerMinute: 30,
	ConversationsPerPerson: 10000, SearchesPerMinute: 60}

// DefaultChatContextTokens fits the context window of most small models.
const DefaultChatContextTokens = 8192

// CORS lets browser apps on other origins call /v1.
type CORS struct {
	// AllowedOrigins are exact origins (scheme://host[:port]); none by
	// default, so no other origin is granted anything.
	AllowedOrigins []string `yaml:"allowed_origins"`
}

// Keys bounds what people may do with their own API keys; admins are not
// bound by it.
type Keys struct {
	// MaxPerPerson is how many live keys a person may hold.
	MaxPerPerson int `yaml:"max_per_person"`
	// MaxRPM is the highest per-key requests-per-minute a person may set;
	// default rate_limit.requests_per_minute, so people can only lower it.
	MaxRPM int `yaml:"max_rpm"`
}

// RateLimit holds the default per-key and per-user limits.
type RateLimit struct {
	RequestsPerMinute int `yaml:"requests_per_minute"`
	TokensPerMinute   int `yaml:"tokens_per_minute"`
	// UnauthenticatedPerMinute limits requests without a valid key or
	// session per source address.
	UnauthenticatedPerMinute int `yaml:"unauthenticated_per_minute"`
}

// Backend is one inference engine the gateway forwards to.
type Backend struct {
	Name           string        `yaml:"name"`
	Kind           string        `yaml:"kind"`
	URL            string        `yaml:"url"`
	APIKey         string        `yaml:"api_key"`
	MaxConcurrency int           `yaml:"max_concurrency"`
	MaxQueue       int           `yaml:"max_queue"`
	QueueTimeout   time.Duration `yaml:"queue_timeout"`
	Timeout        time.Duration `yaml:"timeout"`
	// CAFile is a PEM file of the certificates that an https engine's
	// certificate must chain to, instead of the system's roots: for an
	// engine whose certificate a private CA signed (openai backends only).
	// A relative path is from the working directory.
	CAFile string `yaml:"ca_file"`
	// APIs are the OpenAI APIs the engine serves: chat, responses,
	// embeddings, completions (default [chat]; a builtin backend serves
	// all four, an engine backend only chat). /v1/responses also works on
	// a chat-only backend, translated.
	APIs []string `yaml:"apis"`
	// Weight scales the backend's share of its models' traffic (default 1),
	// for uneven hardware: a backend of weight 2 takes twice the requests of
	// one of weight 1 with the same max_concurrency.
	Weight float64 `yaml:"weight"`
	// TokensPerSecond paces the builtin engine (ignored for openai backends).
	TokensPerSecond float64 `yaml:"tokens_per_second"`
	// Link tunes the WebSocket of an engine backend.
	Link Link `yaml:"link"`

	// maxQueueSet tells an explicit max_queue: 0 (no queue) from a missing
	// one (the default).
	maxQueueSet bool
}

// UnmarshalYAML decodes a backend, noting whether max_queue was given and
// refusing unknown keys (the decoder's KnownFields does not reach inside a
// custom unmarshaler).
func (b *Backend) UnmarshalYAML(n *yaml.Node) error {
	type plain Backend
	if err := n.Decode((*plain)(b)); err != nil {
		return err
	}
	if n.Kind != yaml.MappingNode {
		return nil
	}
	known := map[string]bool{}
	t := reflect.TypeOf(plain{})
	for i := 0; i < t.NumField(); i++ {
		if tag := strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0]; tag != "" {
			known[tag] = true
		}
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		if !known[k.Value] {
			return fmt.Errorf("line %d: field %s not found in a backend", k.Line, k.Value)
		}
		if k.Value == "max_queue" {
			b.maxQueueSet = true
		}
	}
	return nil
}

// Model maps a public model name to one backend (backend) or several
// (backends), which then share its requests.
type Model struct {
	Name          string   `yaml:"name"`
	Backend       string   `yaml:"backend"`
	Backends      []string `yaml:"backends"`
	UpstreamModel string   `yaml:"upstream_model"`
	// Price is what a million tokens cost, in the deployment's currency;
	// nil: the model is free (an internal one), its rows cost 0.
	Price *Price `yaml:"price"`
	// MaxOutputTokens is the output a request that sets no limit may make:
	// what its budget reservation counts, and the max_tokens the engine is
	// given for it when the model has a price (0: DefaultMaxOutputTokens
	// reserved, and the request passes as it is).
	MaxOutputTokens int `yaml:"max_output_tokens"`
	// Vision marks a model that is sent images: the chat attaches them
	// only for such a model, and /v1 refuses an image part for another.
	Vision bool `yaml:"vision"`
}

// Price is a model's price in currency units per million tokens.
type Price struct {
	Input       float64 `yaml:"input"`
	Output      float64 `yaml:"output"`
	CachedInput float64 `yaml:"cached_input"`
}

// DefaultMaxOutputTokens is reserved for a request to a priced model that
// sets no output limit when the model configures no max_output_tokens.
const DefaultMaxOutputTokens = 4096

// MaxOutputTokensLimit bounds max_output_tokens.
const MaxOutputTokensLimit = 10_000_000

// PriceOf is the model's price in nano-units (the zero Price when free).
// The configuration was validated: the numbers convert.
func (m Model) PriceOf() money.Price {
	if m.Price == nil {
		return money.Price{}
	}
	in, _ := money.FromFloat(m.Price.Input, money.MaxPrice)
	out, _ := money.FromFloat(m.Price.Output, money.MaxPrice)
	cached, _ := money.FromFloat(m.Price.CachedInput, money.MaxPrice)
	return money.Price{Input: in, Output: out, CachedInput: cached}
}

// BackendNames lists the backends that serve the model, whichever form the
// file used.
func (m Model) BackendNames() []string {
	if len(m.Backends) > 0 {
		return m.Backends
	}
	return []string{m.Backend}
}

// knownAPIs are the values of a backend's apis.
var knownAPIs = map[string]bool{"chat": true, "responses": true, "embeddings": true, "completions": true}

// key names the i-th model in an error.
func key(i int) string { return fmt.Sprintf("models[%d]", i) }

// MaxBackendsPerModel bounds a model's backends list.
const MaxBackendsPerModel = 64

// Health configures how a backend that fails is taken out of traffic and
// probed before it takes traffic again.
type Health struct {
	// Backoff is how long a failed backend waits before its first probe
	// (default 1s); each failed probe doubles it, up to MaxBackoff (default
	// 30s).
	Backoff    time.Duration `yaml:"backoff"`
	MaxBackoff time.Duration `yaml:"max_backoff"`
	// ProbeTimeout bounds one probe, GET {url}/models (default 2s).
	ProbeTimeout time.Duration `yaml:"probe_timeout"`
}

// Stop configures the cross-replica stop signal.
type Stop struct {
	TTL        time.Duration `yaml:"ttl"`
	AckTimeout time.Duration `yaml:"ack_timeout"`
	// PingInterval is how long the stop subscription may stay silent
	// before a PING checks it; a connection still silent one interval
	// later (half-open: an idle drop without a FIN) is replaced.
	PingInterval time.Duration `yaml:"ping_interval"`
}

// OIDC configures login against an external OpenID provider. When the
// section is absent, the embedded development provider is used.
type OIDC struct {
	Issuer       string   `yaml:"issuer"`
	ClientID     string   `yaml:"client_id"`
	ClientSecret string   `yaml:"client_secret"`
	Scopes       []string `yaml:"scopes"`
	AdminClaim   string   `yaml:"admin_claim"`
	AdminValue   string   `yaml:"admin_value"`
	AdminEmails  []string `yaml:"admin_emails"`
	// TeamsClaim names a claim (e.g. groups; a dotted path works) whose
	// values place the person in teams of those names at each sign-in.
	TeamsClaim string `yaml:"teams_claim"`
}

// DevIDP configures the embedded development OpenID provider.
type DevIDP struct {
	AdminEmail string `yaml:"admin_email"`
	// AllowNonLoopback lets the dev provider run on a non-loopback listen
	// address. It exists so that doing so is a deliberate choice.
	AllowNonLoopback bool `yaml:"allow_non_loopback"`
}

// Default returns the embedded default: loopback, SQLite under ./data, no
// Redis, and the built-in demo model.
func Default() *Config {
	c := &Config{}
	c.applyDefaults()
	return c
}

// Load reads the file at path (empty: no file, the embedded default), applies
// the environment overrides and validates the result.
func Load(path string) (*Config, error) {
	if path == "" {
		return Parse(nil, "")
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return Parse(raw, path)
}

// Parse is Load of a file's bytes already read (a reload reads them once,
// to know the version of exactly what it applies); name names the file in
// errors (empty: the embedded default).
func Parse(raw []byte, name string) (*Config, error) {
	c := &Config{}
	if name != "" {
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		dec.KnownFields(true)
		if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("config %s: %w", name, err)
		}
	}
	c.applyEnv()
	c.applyDefaults()
	if err := c.Validate(); err != nil {
		if name != "" {
			return nil, fmt.Errorf("config %s: %w", name, err)
		}
		return nil, fmt.Errorf("config: %w", err)
	}
	return c, nil
}

// Complete fills in defaults and validates a configuration built in code
// (tests, embedding) the way Load does for a file.
func (c *Config) Complete() error {
	c.applyDefaults()
	return c.Validate()
}

// DatabaseDriver splits a database URL into a driver name ("sqlite" or
// "postgres") and the DSN that driver expects.
func DatabaseDriver(dbURL string) (driver, dsn string, err error) {
	switch {
	case strings.HasPrefix(dbURL, "sqlite://"):
		p := strings.TrimPrefix(dbURL, "sqlite://")
		if p == "" {
			return "", "", fmt.Errorf("sqlite URL needs a path, as in sqlite://data/moonji.db")
		}
		return "sqlite", p, nil
	case strings.HasPrefix(dbURL, "postgres://"), strings.HasPrefix(dbURL, "postgresql://"):
		return "postgres", dbURL, nil
	default:
		return "", "", fmt.Errorf("want sqlite://PATH or postgres://…, got %q", redactURL(dbURL))
	}
}

// redactURL hides a password in a URL so it can appear in an error message.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	return u.Redacted()
}

// Keepalive is the interval of a silent stream's keep-alive comments: the
// configured one, DefaultStreamKeepalive when unset, 0 when turned off.
func (c *Config) Keepalive() time.Duration {
	if c.StreamKeepalive == nil {
		return DefaultStreamKeepalive
	}
	return *c.StreamKeepalive
}

// ServedBy lists the names an engine behind backend is asked for: the
// public names of the models routed to it and their upstream names.
func (c *Config) ServedBy(backend string) []string {
	var served []string
	for _, m := range c.Models {
		for _, b := range m.BackendNames() {
			if b == backend {
				served = append(served, m.Name)
				if m.UpstreamModel != "" {
					served = append(served, m.UpstreamModel)
				}
				break
			}
		}
	}
	return served
}
