package stop

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"moonji/internal/redissub"
)

// DefaultPrefix starts every Redis channel and key name the bus uses.
const DefaultPrefix = "moonji:"

// RedisOptions configures a RedisBus. Zero values take the defaults.
type RedisOptions struct {
	// Prefix starts the channel and key names (default DefaultPrefix).
	// Tests use a fresh prefix so that they cannot see each other.
	Prefix string
	// KeyTTL is how long the stop key lives (default DefaultTTL). Keep it
	// equal to the Holder's TTL.
	KeyTTL time.Duration
	// MinBackoff and MaxBackoff bound the wait between reconnection
	// attempts (defaults 50 ms and 500 ms); the wait doubles after each
	// failure, with jitter so that replicas do not retry in lockstep
	// (package redissub keeps the subscription). The short cap is what
	// lets stops reach this replica within 2 s of Redis coming back after
	// an outage of any length (go-redis may add up to 1 s of its own: its
	// pool refuses to dial after many failures until a probe, once a
	// second, gets through). With 5 s, a replica still sleeping off a long
	// outage came back up to 5 s late; two dials a second while Redis is
	// away cost nothing.
	MinBackoff time.Duration
	MaxBackoff time.Duration
	// PingInterval is how long the subscription may stay silent before a
	// PING checks that the connection is still alive (default 1 s). A
	// second silent interval after a PING means a half-open connection,
	// which is then replaced: a stop is never deaf for much longer than
	// twice this, and the PINGs keep an idle connection from being
	// dropped by a NAT or load balancer in the first place.
	PingInterval time.Duration
	// Logger receives connection events (default slog.Default()).
	Logger *slog.Logger
	// OnResubscribed, if set, is called after every re-subscription (not
	// the first), for metrics.
	OnResubscribed func()
}

func (o RedisOptions) withDefaults() RedisOptions {
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.KeyTTL <= 0 {
		o.KeyTTL = DefaultTTL
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 50 * time.Millisecond
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(500*time.Millisecond, o.MinBackoff)
	}
	if o.PingInterval <= 0 {
		o.PingInterval = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o
}

// RedisBus is a Bus over Redis pub/sub: one subscription per replica on the
// channel "<prefix>stop", and for every stop a key "<prefix>stops:<id>" (the
// set of its stops, keyMember) written in the same MULTI as the PUBLISH, so
// the key exists before any replica can receive the message. It implements
// KeyStore with that key.
type RedisBus struct {
	client  redis.UniversalClient
	opts    RedisOptions
	channel string
	log     *slog.Logger

	mu      sync.Mutex
	sub     *redissub.Sub // set by Start
	started bool
	closed  bool
}

// NewRedisBus returns a RedisBus over client. The client stays the caller's
// to close.
func NewRedisBus(client redis.UniversalClient, opts RedisOptions) *RedisBus {
	opts = opts.withDefaults()
	return &RedisBus{
		client:  client,
		opts:    opts,
		channel: opts.Prefix + "stop",
		log:     opts.Logger.With("component", "stop.redisbus"),
	}
}

// Channel returns the pub/sub channel name.
func (b *RedisBus) Channel() string { return b.channel }

// StopKey returns the Redis key that records the stops of id: a set of
// keyMember strings. (Not "stop:<id>", the string key of the v1 wire format,
// so that a replica of each kind never meets the other's type.)
func (b *RedisBus) StopKey(id string) string { return b.opts.Prefix + "stops:" + id }

// Start subscribes and returns once Redis has confirmed the subscription
// (anything published before that is lost to this replica). If ctx ends
// first, Start returns an error but keeps trying in the background until
// Close; h.Subscribed reports when it succeeds.
func (b *RedisBus) Start(ctx context.Context, h Handler) error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return ErrClosed
	}
	if b.started {
		b.mu.Unlock()
		return errors.New("stop: RedisBus already started")
	}
	b.started = true
	// Callbacks run on the subscription's goroutine and may call Ready,
	// which waits for b.mu: b.sub is set before they can see it.
	b.sub = redissub.Start(b.client, redissub.Options{
		Channel:      b.channel,
		PingInterval: b.opts.PingInterval,
		MinBackoff:   b.opts.MinBackoff,
		MaxBackoff:   b.opts.MaxBackoff,
		Log:          b.log,
		OnSubscribed: func(first bool) {
			if !first && b.opts.OnResubscribed != nil {
				b.opts.OnResubscribed()
			}
			if h.Subscribed != nil {
				h.Subscribed()
			}
		},
		OnMessage: func(payload string) {
			m, err := decodeMessage(payload)
			if err != nil {
				b.log.Warn("ignoring stop bus message", "channel", b.channel, "err", err)
				return
			}
			if h.Message != nil {
				h.Message(m)
			}
		},
	})
	sub := b.sub
	b.mu.Unlock()

	select {
	case <-sub.Ready():
		return nil
	case <-ctx.Done():
		_, last := sub.Down()
		if last == nil {
			last = errors.New("no answer yet")
		}
		return fmt.Errorf("stop: subscription to %q not confirmed: %w (last Redis error: %w)", b.channel, ctx.Err(), last)
	}
}

// Ready returns nil while the subscription is confirmed, and otherwise an
// error saying since when it is down and why. Without a subscription this
// replica cannot hear acks, so Service.Request fails fast instead of waiting
// for one; a readiness probe can use it too.
func (b *RedisBus) Ready() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.closed:
		return ErrClosed
	case !b.started:
		return errors.New("stop: RedisBus not started")
	}
	if since, err := b.sub.Down(); !since.IsZero() {
		return fmt.Errorf("stop: subscription to %q down for %v: %w",
			b.channel, time.Since(since).Round(time.Millisecond), err)
	}
	return nil
}

// Publish broadcasts m. A stop is also added to the stop key, in one
// MULTI with the PUBLISH, so that a replica that misses the message (not yet
// subscribed, disconnected, or starting the inference just now) finds the
// key and can tell whether the caller may stop it. It returns the PUBLISH's
// count of subscriptions that received m.
func (b *RedisBus) Publish(ctx context.Context, m Message) (int, error) {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return 0, ErrClosed
	}
	payload := m.encode()
	var pub *redis.IntCmd
	var err error
	if m.Kind == KindStop {
		key := b.StopKey(m.ID)
		_, err = b.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.SAdd(ctx, key, keyMember(m))
			p.Expire(ctx, key, b.opts.KeyTTL)
			pub = p.Publish(ctx, b.channel, payload)
			return nil
		})
	} else {
		pub = b.client.Publish(ctx, b.channel, payload)
		err = pub.Err()
	}
	if err != nil {
		return 0, fmt.Errorf("stop: publish %s for %s on %q: %w", m.Kind, m.ID, b.channel, err)
	}
	return int(pub.Val()), nil
}

// Stops reads the stop keys of ids with one pipeline of SMEMBERS (one round
// trip; a pipeline rather than one multi-key command so that a Redis Cluster
// can split it by slot).
func (b *RedisBus) Stops(ctx context.Context, ids []string) ([][]Message, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	cmds := make([]*redis.StringSliceCmd, len(ids))
	_, err := b.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			cmds[i] = p.SMembers(ctx, b.StopKey(id))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("stop: check %d stop keys: %w", len(ids), err)
	}
	out := make([][]Message, len(ids))
	for i, c := range cmds {
		for _, v := range c.Val() {
			if m, err := parseKeyMember(ids[i], v); err == nil {
				out[i] = append(out[i], m)
			}
		}
	}
	return out, nil
}

// Close ends the subscription and waits for its goroutine to return. It
// does not close the Redis client.
func (b *RedisBus) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	sub := b.sub
	b.mu.Unlock()
	if sub != nil {
		// Outside b.mu: a callback still running may be calling Ready.
		sub.Close()
	}
	return nil
}
