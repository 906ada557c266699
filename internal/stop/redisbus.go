package stop

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
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
	// attempts (defaults 50 ms and 5 s); the wait doubles after each
	// failure, with jitter so that replicas do not retry in lockstep.
	MinBackoff time.Duration
	MaxBackoff time.Duration
	// PingInterval is how long the subscription may stay silent before a
	// PING checks that the connection is still alive (default 15 s). A
	// second silent interval after a PING means a half-open connection,
	// which is then replaced.
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
		o.MaxBackoff = max(5*time.Second, o.MinBackoff)
	}
	if o.PingInterval <= 0 {
		o.PingInterval = 15 * time.Second
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
	ps      *redis.PubSub
	started bool
	closed  bool
	cancel  context.CancelFunc
	lastErr error
	// downSince is zero while the subscription is confirmed, else when it
	// was lost (or when Start began).
	downSince time.Time
	wg        sync.WaitGroup
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
	b.downSince = time.Now()
	b.lastErr = errors.New("not yet subscribed")
	loopCtx, cancel := context.WithCancel(context.Background())
	b.cancel = cancel
	b.mu.Unlock()

	// Outside the lock: with Redis down this dials for a while, and Ready
	// and Publish must not wait for it. go-redis records the channel even
	// when this first attempt fails, and subscribes again on every
	// reconnection.
	ps := b.client.Subscribe(loopCtx, b.channel)
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		_ = ps.Close()
		return ErrClosed
	}
	b.ps = ps
	ready := make(chan struct{})
	b.wg.Add(1)
	b.mu.Unlock()

	go b.receive(loopCtx, h, ready)

	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		b.mu.Lock()
		last := b.lastErr
		b.mu.Unlock()
		return fmt.Errorf("stop: subscription to %q not confirmed: %w (last Redis error: %w)", b.channel, ctx.Err(), last)
	}
}

// receive is the single goroutine that reads the subscription. go-redis
// reconnects and re-subscribes inside Receive after a connection error; this
// loop adds the back-off between attempts and notices each new confirmation.
func (b *RedisBus) receive(ctx context.Context, h Handler, ready chan struct{}) {
	defer b.wg.Done()
	first := true
	connected := false
	pingSent := false
	backoff := b.opts.MinBackoff
	for {
		b.mu.Lock()
		ps := b.ps
		b.mu.Unlock()

		msg, err := ps.ReceiveTimeout(ctx, b.opts.PingInterval)
		if ctx.Err() != nil {
			return
		}
		if err != nil && isTimeout(err) {
			if !pingSent {
				// Silence is normal; make the server speak to prove the
				// connection is alive.
				pingSent = true
				if err = ps.Ping(ctx); err == nil {
					continue
				}
			} else {
				// The PING went unanswered: a half-open connection that
				// go-redis would keep, since it treats read timeouts as
				// harmless. Replace the whole subscription.
				b.log.Warn("stop subscription silent after PING; resubscribing", "channel", b.channel)
				b.setDown(errors.New("no answer to PING"))
				b.replacePubSub(ctx)
				pingSent = false
				connected = false
				continue
			}
		}
		if err != nil {
			b.setDown(err)
			if connected {
				b.log.Warn("stop subscription lost; reconnecting", "channel", b.channel, "err", err)
			} else {
				b.log.Debug("stop subscription still down", "channel", b.channel, "err", err, "backoff", backoff)
			}
			connected = false
			pingSent = false
			if !sleepCtx(ctx, jitter(backoff)) {
				return
			}
			backoff = min(backoff*2, b.opts.MaxBackoff)
			continue
		}

		backoff = b.opts.MinBackoff
		pingSent = false
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind != "subscribe" || m.Channel != b.channel {
				continue
			}
			connected = true
			b.mu.Lock()
			b.downSince = time.Time{}
			b.mu.Unlock()
			if first {
				first = false
				b.log.Debug("stop subscription confirmed", "channel", b.channel)
			} else {
				b.log.Info("stop subscription restored", "channel", b.channel)
				if b.opts.OnResubscribed != nil {
					b.opts.OnResubscribed()
				}
			}
			if h.Subscribed != nil {
				h.Subscribed()
			}
			if ready != nil {
				close(ready)
				ready = nil
			}
		case *redis.Message:
			dm, err := decodeMessage(m.Payload)
			if err != nil {
				b.log.Warn("ignoring stop bus message", "channel", m.Channel, "err", err)
				continue
			}
			if h.Message != nil {
				h.Message(dm)
			}
		case *redis.Pong:
			// Only proves the connection is alive.
		}
	}
}

// setDown records that the subscription is not working, and why.
func (b *RedisBus) setDown(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lastErr = err
	if b.downSince.IsZero() {
		b.downSince = time.Now()
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
	case !b.downSince.IsZero():
		return fmt.Errorf("stop: subscription to %q down for %v: %w",
			b.channel, time.Since(b.downSince).Round(time.Millisecond), b.lastErr)
	}
	return nil
}

// replacePubSub closes the current subscription and opens a new one on a
// fresh connection.
func (b *RedisBus) replacePubSub(ctx context.Context) {
	ps := b.client.Subscribe(ctx, b.channel)
	b.mu.Lock()
	if b.closed {
		// Close has taken care of the current subscription; the new one
		// would leak.
		b.mu.Unlock()
		_ = ps.Close()
		return
	}
	old := b.ps
	b.ps = ps
	b.mu.Unlock()
	_ = old.Close()
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

// Close ends the subscription and waits for the receiver to return. It does
// not close the Redis client.
func (b *RedisBus) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	cancel, ps := b.cancel, b.ps
	b.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	var err error
	if ps != nil {
		// Closing the connection unblocks a receive that is waiting for
		// data; the cancelled context alone would not.
		err = ps.Close()
	}
	b.wg.Wait()
	if err != nil {
		return fmt.Errorf("stop: close subscription: %w", err)
	}
	return nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// jitter returns a duration in [d/2, d).
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2)
}

// sleepCtx waits for d and reports false if ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
