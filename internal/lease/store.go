package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"moonji/internal/redissub"
)

// DefaultTTL is the lease lifetime when Options.TTL is zero: long enough
// that a Redis hiccup of a few seconds costs nothing (renewal every TTL/3
// gets two more tries before anything lapses), short enough that a dead
// replica's slots come back quickly.
const DefaultTTL = 10 * time.Second

// ErrClosed is returned by calls on a closed Store.
var ErrClosed = errors.New("lease: store closed")

// Options configures a Store.
type Options struct {
	// Prefix starts every key and channel name, e.g. "moonji:". Tests use
	// a fresh random prefix so that they cannot see each other.
	Prefix string
	// Replica is this replica's id, unique among live processes. It must
	// be non-empty and contain neither '/' nor '|', which separate the
	// parts of member names.
	Replica string
	// TTL is how long leases, wait entries and the replica's liveness last
	// unless renewed (default DefaultTTL); they are renewed every TTL/3.
	// Give every replica the same TTL.
	TTL time.Duration
	// WaitIdle is how long a queue's wait entry is kept alive without an
	// Acquire for that queue (default 6×TTL). It guards against a caller
	// that forgets ClearWait: a wait entry renewed for ever would keep one
	// slot owed to nobody. A waiting queue must therefore retry at least
	// this often, which it does anyway since notifications can be missed.
	WaitIdle time.Duration
	// Log receives connection and renewal events (default slog.Default()).
	Log *slog.Logger
	// OnReleased is called from the store's subscriber goroutine with a
	// backend's name whenever a replica (this one included) freed capacity
	// of that backend while some queue waited for it, so that waiting
	// replicas try again at once. Releases nobody waits for publish
	// nothing. It must be fast and must not block.
	OnReleased func(backend string)

	releaseDelay time.Duration // tests lengthen the package's releaseDelay
}

// Backend is one candidate for a request.
type Backend struct {
	Name string
	// Max is the backend's max_concurrency for the whole deployment;
	// values below 1 are treated as 1.
	Max int
	// Weight scales the backend's share: candidates are compared by
	// leases/(Max×Weight) and ties are broken at random in proportion to
	// Weight. Values <= 0 are treated as 1.
	Weight float64
}

// Request is one request asking for a slot.
type Request struct {
	// Queue is the local queue the request waits in (a model pool's
	// name); the store qualifies it with Options.Replica.
	Queue string
	// Candidates are the backends that may serve the request, already
	// filtered for health by the caller; at least one, with distinct
	// names. When a backend drops out of a waiting queue's candidates,
	// call ClearWait for it: the queue's entry there would otherwise keep
	// a slot owed until Options.WaitIdle.
	Candidates []Backend
	// Arrival is when the request arrived (wall clock): its place in the
	// cross-replica FIFO. A newcomer passes time.Now(); zero means now.
	Arrival time.Time
	// Next is the arrival of the request behind this one in the same
	// local queue, or zero if there is none.
	Next time.Time
}

// Lease is one slot held on a backend. The zero Lease holds nothing.
type Lease struct {
	backend string
	member  string
}

// Backend returns the name of the backend the slot is on.
func (l Lease) Backend() string { return l.backend }

// IsZero reports whether l is the zero Lease.
func (l Lease) IsZero() bool { return l.member == "" }

// waitState is this store's record of one of its wait entries.
type waitState struct {
	gen     uint64    // changes whenever the entry is set again
	touched time.Time // last Acquire that set it, for Options.WaitIdle
}

// orphan is a lease member whose acquire or release failed without an
// answer: Redis may hold it, so the next renewal deletes it.
type orphan struct {
	member string
	at     time.Time
}

// Store holds concurrency slots as leases in Redis. It is safe for
// concurrent use.
type Store struct {
	rdb      redis.UniversalClient
	o        Options
	log      *slog.Logger
	channel  string // release notifications
	memberID string // "<replica>|<nonce>|", the start of every lease member
	seq      atomic.Uint64
	live     atomic.Int64
	renewals atomic.Int64 // renewal calls sent, for the command-count test

	mu      sync.Mutex
	leases  map[string]map[string]struct{}  // backend → members held
	waits   map[string]map[string]waitState // backend → queue → entry
	orphans map[string][]orphan             // backend → members to delete
	// giveBack holds the leases released by ReleaseSoon that no call has
	// sent yet.
	giveBack []Lease
	gen      uint64
	started  bool
	closed   bool
	cancel   context.CancelFunc
	sub      *redissub.Sub
	wg       sync.WaitGroup

	renewedOnce chan struct{} // closed after the first successful renewal
	flushSoon   chan struct{} // wakes the flusher to send giveBack after releaseDelay
	done        chan struct{} // closed by stop, so that Start does not wait for ever
	lastErr     atomic.Pointer[error]
}

// New returns a Store on rdb, which stays the caller's to close. Give rdb
// short timeouts (or ContextTimeoutEnabled with short context deadlines):
// a hung Redis should turn into a quick fallback, not a slow request. New
// panics if o.Replica is empty or contains '/' or '|', a programming error.
func New(rdb redis.UniversalClient, o Options) *Store {
	if o.Replica == "" || strings.ContainsAny(o.Replica, "/|") {
		panic(fmt.Sprintf("lease: Options.Replica %q must be non-empty and contain neither '/' nor '|'", o.Replica))
	}
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	if o.WaitIdle <= 0 {
		o.WaitIdle = 6 * o.TTL
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.releaseDelay <= 0 {
		o.releaseDelay = releaseDelay
	}
	var nonce [4]byte
	_, _ = rand.Read(nonce[:])
	s := &Store{
		rdb:         rdb,
		o:           o,
		log:         o.Log.With("component", "lease", "replica", o.Replica),
		channel:     o.Prefix + "lease-released",
		memberID:    o.Replica + "|" + hex.EncodeToString(nonce[:]) + "|",
		leases:      map[string]map[string]struct{}{},
		waits:       map[string]map[string]waitState{},
		orphans:     map[string][]orphan{},
		renewedOnce: make(chan struct{}),
		flushSoon:   make(chan struct{}, 1),
		done:        make(chan struct{}),
	}
	s.live.Store(1)
	return s
}

func (s *Store) leaseKey(b string) string   { return s.o.Prefix + "lease:" + b }
func (s *Store) waitKey(b string) string    { return s.o.Prefix + "lease-wait:" + b }
func (s *Store) waitExpKey(b string) string { return s.o.Prefix + "lease-waitexp:" + b }
func (s *Store) replicasKey() string        { return s.o.Prefix + "lease-replicas" }
func (s *Store) fenceKey() string           { return s.o.Prefix + "lease-fence" }
func (s *Store) waitMember(queue string) string {
	return s.o.Replica + "/" + queue
}

// Start loads the scripts and starts the renewal loop (leases, wait entries
// and this replica's liveness), the flusher of ReleaseSoon's releases and
// the subscription to release notifications. It returns once the first
// renewal has succeeded and the subscription is confirmed, or with an
// error when ctx ends first; either way the loops keep running and
// retrying until Close, because a replica must be able to start while
// Redis is down.
func (s *Store) Start(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	if s.started {
		s.mu.Unlock()
		return errors.New("lease: store already started")
	}
	s.started = true
	loopCtx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.sub = redissub.Start(s.rdb, redissub.Options{
		Channel:   s.channel,
		OnMessage: s.o.OnReleased,
		Log:       s.log,
	})
	s.wg.Add(2)
	s.mu.Unlock()
	go s.renewLoop(loopCtx)
	go s.flusher(loopCtx)

	renewErr := func() error {
		if p := s.lastErr.Load(); p != nil {
			return *p
		}
		return errors.New("no answer yet")
	}
	subErr := func() error {
		if _, err := s.sub.Down(); err != nil {
			return err
		}
		return errors.New("no answer yet")
	}
	for _, w := range []struct {
		ready <-chan struct{}
		err   func() error
	}{{s.renewedOnce, renewErr}, {s.sub.Ready(), subErr}} {
		select {
		case <-w.ready:
		case <-s.done:
			return ErrClosed
		case <-ctx.Done():
			return fmt.Errorf("lease: Redis not ready: %w (last error: %w)", ctx.Err(), w.err())
		}
	}
	return nil
}

// LiveReplicas returns the number of live replicas, this one included, as
// last read by the renewal loop; at least 1. While Redis is unreachable a
// replica can admit about Max/LiveReplicas() requests on its own.
func (s *Store) LiveReplicas() int {
	return int(max(s.live.Load(), 1))
}

// Held returns how many leases on backend this store holds.
func (s *Store) Held(backend string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.leases[backend])
}

// Count returns the number of live leases on backend across all replicas,
// in one Redis call; for tests and the dashboard.
func (s *Store) Count(ctx context.Context, backend string) (int, error) {
	n, err := countScript.Run(ctx, s.rdb, []string{s.leaseKey(backend)}).Int()
	if err != nil {
		return 0, fmt.Errorf("lease: count leases on %q: %w", backend, err)
	}
	return n, nil
}

// Close stops the loops, then, in one best-effort call, releases every
// lease still held or waiting to be given back and removes this replica's
// wait entries and liveness. What that call fails to remove lapses within
// TTL. It does not close the Redis client.
func (s *Store) Close() error {
	if !s.stop() {
		return nil
	}
	s.mu.Lock()
	s.orphanAllLocked(s.giveBack) // the leave deletes them with the rest
	s.giveBack = nil
	keys, args, _ := s.snapshotLocked(time.Now(), false)
	s.leases = map[string]map[string]struct{}{}
	s.waits = map[string]map[string]waitState{}
	s.orphans = map[string][]orphan{}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), s.o.TTL/3)
	defer cancel()
	if err := leaveScript.Run(ctx, s.rdb, keys, args...).Err(); err != nil {
		return fmt.Errorf("lease: release what replica %q held: %w", s.o.Replica, err)
	}
	return nil
}

// stop ends the loops without touching Redis and reports whether this call
// closed the store. Alone, it leaves the store's leases to lapse in Redis,
// as a crashed replica would.
func (s *Store) stop() bool {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return false
	}
	s.closed = true
	close(s.done)
	cancel, sub := s.cancel, s.sub
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if sub != nil {
		sub.Close()
	}
	s.wg.Wait()
	return true
}

func (s *Store) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}
