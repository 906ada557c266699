// Package redissub keeps one Redis pub/sub subscription alive until it is
// closed, whatever happens to the connection under it.
//
// go-redis reconnects and subscribes again by itself inside Receive after a
// connection error, but it treats a read timeout as harmless: a half-open
// connection (the server or a middlebox gone without a FIN) would be kept
// for ever, silently. So the loop here reads with a timeout; after
// PingInterval of silence it sends a PING, and after a second silent
// interval it replaces the whole subscription with one on a new
// connection. Failed attempts are retried with a doubling back-off, with
// jitter so that replicas do not retry in lockstep. A loss is logged once,
// and so is its end.
//
// Pub/sub delivers at most once: what is published while the subscription
// is down is lost to it, so its owner must not depend on every message.
package redissub

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"moonji/internal/backoff"
)

// Options configures a Sub. Zero values take the defaults.
type Options struct {
	// Channel is the channel to subscribe to.
	Channel string
	// OnMessage is called with the payload of each message on Channel.
	// OnSubscribed is called whenever Redis confirms the subscription:
	// first tells the first time from a restoration after a loss. Both are
	// called from the subscription's one goroutine, in order, and must not
	// block for long: the next message waits for them.
	OnMessage    func(payload string)
	OnSubscribed func(first bool)
	// PingInterval is how long the subscription may stay silent before a
	// PING checks that its connection is alive (default 15 s). A second
	// silent interval after the PING means a half-open connection, which is
	// then replaced.
	PingInterval time.Duration
	// MinBackoff and MaxBackoff bound the wait between reconnection
	// attempts (defaults 50 ms and 5 s).
	MinBackoff, MaxBackoff time.Duration
	// Log receives the losses and restorations (default slog.Default()).
	Log *slog.Logger
}

// Sub is one subscription and the goroutine that keeps it alive.
type Sub struct {
	rdb    redis.UniversalClient
	o      Options
	log    *slog.Logger
	ready  chan struct{}
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	ps     *redis.PubSub // the current subscription; nil before the first
	closed bool
	// downSince is zero while the subscription is confirmed, else since
	// when it has not been (Start, or the loss); lastErr says why.
	downSince time.Time
	lastErr   error
}

// errNoPong is the reason given for a subscription replaced because its
// connection stayed silent after a PING.
var errNoPong = errors.New("redissub: no answer to PING")

// Start subscribes to o.Channel on rdb, which stays the caller's to close,
// and returns at once: the subscription is made, and kept, in the
// background until Close. Ready tells when Redis first confirms it.
func Start(rdb redis.UniversalClient, o Options) *Sub {
	if o.PingInterval <= 0 {
		o.PingInterval = 15 * time.Second
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 50 * time.Millisecond
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(5*time.Second, o.MinBackoff)
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Sub{
		rdb:       rdb,
		o:         o,
		log:       o.Log.With("channel", o.Channel),
		ready:     make(chan struct{}),
		cancel:    cancel,
		downSince: time.Now(),
		lastErr:   errors.New("redissub: not yet subscribed"),
	}
	s.wg.Add(1)
	go s.loop(ctx)
	return s
}

// Ready is closed once Redis has confirmed the subscription for the first
// time; whatever was published before that is lost to it.
func (s *Sub) Ready() <-chan struct{} { return s.ready }

// Down returns the zero time and nil while the subscription is confirmed,
// and otherwise since when it has not been and the last error.
func (s *Sub) Down() (since time.Time, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.downSince.IsZero() {
		return time.Time{}, nil
	}
	return s.downSince, s.lastErr
}

// Close ends the subscription and waits for its goroutine to return; no
// callback runs after it. Calling it again does nothing.
func (s *Sub) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	ps := s.ps
	s.mu.Unlock()
	s.cancel()
	if ps != nil {
		// Closing the connection unblocks a read waiting for data; the
		// cancelled context alone would not.
		_ = ps.Close()
	}
	s.wg.Wait()
}

// loop is the goroutine reading the subscription.
func (s *Sub) loop(ctx context.Context) {
	defer s.wg.Done()
	ps := s.open(ctx)
	delay := s.o.MinBackoff
	first, connected, pingSent := true, false, false
	for ps != nil {
		msg, err := ps.ReceiveTimeout(ctx, s.o.PingInterval)
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
				s.setDown(errNoPong)
				s.log.Warn("pub/sub subscription silent after PING; subscribing again on a new connection")
				ps = s.open(ctx)
				connected, pingSent = false, false
				continue
			}
		}
		if err != nil {
			s.setDown(err)
			if connected {
				s.log.Warn("pub/sub subscription lost; reconnecting", "err", err)
			}
			connected, pingSent = false, false
			if !backoff.Sleep(ctx, backoff.Jitter(delay)) {
				return
			}
			delay = min(delay*2, s.o.MaxBackoff)
			continue
		}

		delay, pingSent = s.o.MinBackoff, false
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind != "subscribe" || m.Channel != s.o.Channel {
				continue
			}
			connected = true
			s.mu.Lock()
			s.downSince, s.lastErr = time.Time{}, nil
			s.mu.Unlock()
			if !first {
				s.log.Info("pub/sub subscription restored")
			}
			if s.o.OnSubscribed != nil {
				s.o.OnSubscribed(first)
			}
			if first {
				first = false
				close(s.ready)
			}
		case *redis.Message:
			if m.Channel == s.o.Channel && s.o.OnMessage != nil {
				s.o.OnMessage(m.Payload)
			}
		case *redis.Pong:
			// Only proves the connection is alive.
		}
	}
}

// open subscribes on a new connection and closes the subscription it
// replaces, if any; it returns nil once Close has been called. go-redis
// records the channel even when this first attempt fails and subscribes
// again on every reconnection, inside ReceiveTimeout.
func (s *Sub) open(ctx context.Context) *redis.PubSub {
	ps := s.rdb.Subscribe(ctx, s.o.Channel)
	s.mu.Lock()
	if s.closed {
		// Close has closed the current subscription; this one would leak.
		s.mu.Unlock()
		_ = ps.Close()
		return nil
	}
	old := s.ps
	s.ps = ps
	s.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
	return ps
}

// setDown records that the subscription is not working, and why.
func (s *Sub) setDown(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastErr = err
	if s.downSince.IsZero() {
		s.downSince = time.Now()
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
