package lease

import (
	"context"
	"errors"
	"net"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// pingInterval is how long the subscription may stay silent before a PING
// checks that the connection is alive; a second silent interval after the
// PING means a half-open connection, which is then replaced. Missing
// notifications only delays waiting queues until their next timed retry, so
// this need not be short.
const pingInterval = 15 * time.Second

// receive is the single goroutine reading release notifications. go-redis
// reconnects and subscribes again inside Receive after a connection error;
// this loop adds a back-off between attempts and the half-open check.
func (s *Store) receive(ctx context.Context) {
	defer s.wg.Done()
	const minBackoff, maxBackoff = 50 * time.Millisecond, 5 * time.Second
	backoff := minBackoff
	first, connected, pingSent := true, false, false
	for {
		s.mu.Lock()
		ps := s.ps
		s.mu.Unlock()

		msg, err := ps.ReceiveTimeout(ctx, pingInterval)
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
				// go-redis keeps a connection that only times out; replace
				// the subscription instead.
				s.log.Warn("lease notifications silent after PING; subscribing again", "channel", s.channel)
				s.replacePubSub(ctx)
				connected, pingSent = false, false
				continue
			}
		}
		if err != nil {
			s.lastErr.Store(&err)
			if connected {
				s.log.Warn("lease notifications lost; reconnecting", "channel", s.channel, "err", err)
			}
			connected, pingSent = false, false
			if !sleepCtx(ctx, jitter(backoff)) {
				return
			}
			backoff = min(backoff*2, maxBackoff)
			continue
		}

		backoff = minBackoff
		pingSent = false
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind != "subscribe" || m.Channel != s.channel {
				continue
			}
			connected = true
			if first {
				first = false
				close(s.subscribed)
			} else {
				s.log.Info("lease notifications restored", "channel", s.channel)
			}
		case *redis.Message:
			if m.Channel != s.channel && m.Channel != s.waitChannel {
				continue
			}
			s.mu.Lock()
			if len(s.awaited) >= maxAwaited {
				// Names come from the channel, not from the configuration:
				// whatever publishes there cannot grow the map for ever.
				clear(s.awaited)
			}
			s.awaited[m.Payload] = time.Now()
			// Someone waits: what lingers of that backend goes now.
			lingering := slices.ContainsFunc(s.giveBack, func(l released) bool { return l.backend == m.Payload })
			s.mu.Unlock()
			if lingering {
				select {
				case s.flushNow <- struct{}{}:
				default:
				}
			}
			if m.Channel == s.channel && s.o.OnReleased != nil {
				s.o.OnReleased(m.Payload)
			}
		case *redis.Pong:
			// Only proves the connection is alive.
		}
	}
}

// replacePubSub closes the current subscription and opens a new one on a
// fresh connection.
func (s *Store) replacePubSub(ctx context.Context) {
	ps := s.rdb.Subscribe(ctx, s.channel, s.waitChannel)
	s.mu.Lock()
	if s.closed {
		// stop has closed the current subscription; the new one would leak.
		s.mu.Unlock()
		_ = ps.Close()
		return
	}
	old := s.ps
	s.ps = ps
	s.mu.Unlock()
	_ = old.Close()
}

// maxAwaited bounds Store.awaited, which holds one entry per backend.
const maxAwaited = 1024

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
