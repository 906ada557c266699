package lease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
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

	linger time.Duration // tests lengthen releaseLinger
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
	// Fresh tells that no request waits ahead of this one on this replica
	// (it is not served from a local queue, which has wait entries for the
	// script to move). A fresh request may be handed a lease this store
	// released a moment ago instead of asking Redis (see Acquire).
	Fresh bool
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

// released is a lease ReleaseSoon let go of at a time, not yet sent.
type released struct {
	Lease
	at time.Time
}

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
	rdb     redis.UniversalClient
	o       Options
	log     *slog.Logger
	channel string
	// waitChannel carries the names of backends that a refused request
	// now waits for (acquireScript), so that no replica hands over a
	// slot of theirs (handOver).
	waitChannel string
	memberID    string // "<replica>|<nonce>|", the start of every lease member
	seq         atomic.Uint64
	live        atomic.Int64
	renewals    atomic.Int64 // renewal calls sent, for the command-count test
	// handedOver counts leases passed from one request to the next
	// without a round trip (handOver).
	handedOver atomic.Int64

	mu      sync.Mutex
	leases  map[string]map[string]struct{}  // backend → members held
	waits   map[string]map[string]waitState // backend → queue → entry
	orphans map[string][]orphan             // backend → members to delete
	// giveBack holds the leases released by ReleaseSoon that no call has
	// sent yet, oldest first; awaited records when a release of each
	// backend was last announced (someone waited for it).
	giveBack []released
	// lingerArmed is set while the flusher's timer runs for giveBack, so
	// that a release does not wake the flusher when it need not.
	lingerArmed bool
	awaited     map[string]time.Time
	gen         uint64
	started     bool
	closed      bool
	cancel      context.CancelFunc
	ps          *redis.PubSub
	wg          sync.WaitGroup

	renewedOnce chan struct{} // closed after the first successful renewal
	subscribed  chan struct{} // closed once the subscription is confirmed
	flushSoon   chan struct{} // wakes the flusher to send giveBack after releaseLinger
	flushNow    chan struct{} // wakes the flusher to send giveBack at once
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
	if o.linger <= 0 {
		o.linger = releaseLinger
	}
	var nonce [4]byte
	_, _ = rand.Read(nonce[:])
	s := &Store{
		rdb:         rdb,
		o:           o,
		log:         o.Log.With("component", "lease", "replica", o.Replica),
		channel:     o.Prefix + "lease-released",
		waitChannel: o.Prefix + "lease-released" + waitingSuffix,
		memberID:    o.Replica + "|" + hex.EncodeToString(nonce[:]) + "|",
		leases:      map[string]map[string]struct{}{},
		waits:       map[string]map[string]waitState{},
		orphans:     map[string][]orphan{},
		awaited:     map[string]time.Time{},
		renewedOnce: make(chan struct{}),
		flushSoon:   make(chan struct{}, 1),
		flushNow:    make(chan struct{}, 1),
		subscribed:  make(chan struct{}),
		done:        make(chan struct{}),
	}
	s.live.Store(1)
	return s
}

func (s *Store) leaseKey(b string) string   { return s.o.Prefix + "lease:" + b }
func (s *Store) waitKey(b string) string    { return s.o.Prefix + "lease-wait:" + b }
func (s *Store) waitExpKey(b string) string { return s.o.Prefix + "lease-waitexp:" + b }
func (s *Store) replicasKey() string        { return s.o.Prefix + "lease-replicas" }
func (s *Store) waitMember(queue string) string {
	return s.o.Replica + "/" + queue
}

// Channel returns the pub/sub channel that release notifications use.
func (s *Store) Channel() string { return s.channel }

// Start loads the scripts and starts the renewal loop (leases, wait entries
// and this replica's liveness) and the subscriber for release
// notifications. It returns once the first renewal has succeeded and the
// subscription is confirmed, or with an error when ctx ends first; either
// way the loops keep running and retrying until Close, because a replica
// must be able to start while Redis is down.
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
	s.mu.Unlock()

	// Outside the lock: with Redis down this dials for a while. go-redis
	// records the channel even when this first attempt fails and
	// subscribes again on every reconnection.
	ps := s.rdb.Subscribe(loopCtx, s.channel, s.waitChannel)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = ps.Close()
		return ErrClosed
	}
	s.ps = ps
	s.wg.Add(3)
	s.mu.Unlock()
	go s.renewLoop(loopCtx)
	go s.receive(loopCtx)
	go s.flusher(loopCtx)

	for _, ch := range []chan struct{}{s.renewedOnce, s.subscribed} {
		select {
		case <-ch:
		case <-s.done:
			return ErrClosed
		case <-ctx.Done():
			last := errors.New("no answer yet")
			if p := s.lastErr.Load(); p != nil {
				last = *p
			}
			return fmt.Errorf("lease: Redis not ready: %w (last error: %w)", ctx.Err(), last)
		}
	}
	return nil
}

// Acquire tries to take one slot on one of req.Candidates, in one round trip
// (one EVALSHA over the candidates' keys). A slot is free for this request
// only if it is not owed to an older waiting queue (see the package doc);
// among candidates with a free slot it picks the least loaded relative to
// Max×Weight, ties broken at random in proportion to Weight. On a grant the
// queue's wait entries move to req.Next (or go when Next is zero); on a
// refusal they are set to req.Arrival. A Fresh request may instead be
// handed, with no round trip, a lease of one of its candidates that
// ReleaseSoon let go of a moment ago (handOver).
//
// It returns the index into req.Candidates of the granted backend and its
// lease, or -1 and the zero Lease when no candidate is free. The error is
// non-nil only when Redis failed; the caller then falls back to a share of
// Max per replica (see LiveReplicas). If the call failed without an answer,
// a lease Redis may have granted anyway is deleted by the next renewal.
func (s *Store) Acquire(ctx context.Context, req Request) (int, Lease, error) {
	n := len(req.Candidates)
	if n == 0 {
		return -1, Lease{}, errors.New("lease: acquire without candidates")
	}
	if s.isClosed() {
		return -1, Lease{}, ErrClosed
	}
	if req.Fresh {
		if i, l, ok := s.handOver(req.Candidates); ok {
			return i, l, nil
		}
	}
	arrival := req.Arrival
	if arrival.IsZero() {
		arrival = time.Now()
	}
	next := "0"
	if !req.Next.IsZero() {
		// At least 1: "0" means no next request.
		next = strconv.FormatInt(max(req.Next.UnixMilli(), 1), 10)
	}
	member := s.memberID + strconv.FormatUint(s.seq.Add(1), 10)
	// The leases released since the last call go with this one: a release
	// costs no round trip of its own while requests keep coming.
	s.mu.Lock()
	back := s.giveBack
	s.giveBack = nil
	s.mu.Unlock()
	keys := make([]string, 0, 3*n+2*len(back))
	args := make([]any, 0, 8+3*n+2*len(back))
	args = append(args, s.waitMember(req.Queue), member, arrival.UnixMilli(), next,
		s.o.TTL.Milliseconds(), mrand.Float64(), s.channel, len(back))
	for _, b := range req.Candidates {
		keys = append(keys, s.leaseKey(b.Name), s.waitKey(b.Name), s.waitExpKey(b.Name))
		w := b.Weight
		if w <= 0 {
			w = 1
		}
		args = append(args, b.Name, max(b.Max, 1), w)
	}
	for _, l := range back {
		keys = append(keys, s.leaseKey(l.backend), s.waitKey(l.backend))
		args = append(args, l.member, l.backend)
	}
	chosen, err := acquireScript.Run(ctx, s.rdb, keys, args...).Int()
	if err != nil {
		s.mu.Lock()
		if !isServerError(err) {
			for _, b := range req.Candidates {
				s.orphanLocked(b.Name, member)
			}
		}
		s.orphanAllLocked(back)
		s.mu.Unlock()
		return -1, Lease{}, fmt.Errorf("lease: acquire for queue %q on %d backends: %w", req.Queue, n, err)
	}
	if chosen < 0 || chosen > n {
		return -1, Lease{}, fmt.Errorf("lease: acquire script returned %d for %d candidates", chosen, n)
	}

	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, b := range req.Candidates {
		if chosen != 0 && req.Next.IsZero() {
			s.forgetWaitLocked(b.Name, req.Queue)
		} else {
			s.gen++
			m := s.waits[b.Name]
			if m == nil {
				m = map[string]waitState{}
				s.waits[b.Name] = m
			}
			m[req.Queue] = waitState{gen: s.gen, touched: now}
		}
	}
	if chosen == 0 {
		return -1, Lease{}, nil
	}
	l := Lease{backend: req.Candidates[chosen-1].Name, member: member}
	if s.closed {
		// Close has already sent what it held; this lease would never be
		// renewed. It lapses within TTL, or the caller's Release frees it.
		return chosen - 1, l, nil
	}
	m := s.leases[l.backend]
	if m == nil {
		m = map[string]struct{}{}
		s.leases[l.backend] = m
	}
	m[l.member] = struct{}{}
	return chosen - 1, l, nil
}

// handOver passes a lease that ReleaseSoon let go of a moment ago, and
// that no call has sent back yet, to a fresh request for the same backend:
// the slot stays taken in Redis and changes hands here, with no round trip.
// At a steady rate of requests most slots go from one request to the next
// this way. It is not done while anyone may wait for the backend (a
// release or a refusal of it was announced within awaitedFor, here or on
// another replica): the freed slot is owed to the oldest waiter, whom only
// the acquire script can find. The backend is the lease's, not the least
// loaded of the candidates: a slot just freed on it makes it no more
// loaded than when that request took it.
func (s *Store) handOver(cands []Backend) (int, Lease, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return -1, Lease{}, false
	}
	now := time.Now()
	for j := len(s.giveBack) - 1; j >= 0; j-- {
		l := s.giveBack[j]
		i := slices.IndexFunc(cands, func(b Backend) bool { return b.Name == l.backend })
		if i < 0 || now.Sub(s.awaited[l.backend]) < awaitedFor {
			continue
		}
		s.giveBack = slices.Delete(s.giveBack, j, j+1)
		m := s.leases[l.backend]
		if m == nil {
			m = map[string]struct{}{}
			s.leases[l.backend] = m
		}
		m[l.member] = struct{}{}
		s.handedOver.Add(1)
		return i, l.Lease, true
	}
	return -1, Lease{}, false
}

// awaitedRecently reports whether someone waited for backend within
// awaitedFor, as far as this store heard.
func (s *Store) awaitedRecently(backend string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Since(s.awaited[backend]) < awaitedFor
}

// Release frees the lease (ZREM, and a notification on the store's channel
// if anyone waits for the backend) and stops renewing it, in one call that
// also sends the leases ReleaseSoon still holds. It is safe to call twice;
// the second call and a zero Lease do nothing. If Redis does not answer,
// the lease is still forgotten here: the next renewal deletes it, or else
// it lapses within TTL.
func (s *Store) Release(ctx context.Context, l Lease) error {
	s.forget(l)
	return s.Flush(ctx)
}

// ReleaseSoon frees the lease like Release, without waiting for Redis: the
// next Acquire carries the release, or, when none comes within
// releaseLinger, the store sends it alone (at once if another request was
// recently waiting for the backend, since it may be waiting still). On a
// store that is not running it is Release with a timeout of TTL/3.
func (s *Store) ReleaseSoon(l Lease) {
	s.mu.Lock()
	if !s.started || s.closed {
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), s.o.TTL/3)
		defer cancel()
		if err := s.Release(ctx, l); err != nil {
			s.log.Warn("lease release failed; it lapses within the TTL", "backend", l.backend, "err", err)
		}
		return
	}
	held := s.forgetLocked(l)
	awaited := time.Since(s.awaited[l.backend]) < awaitedFor
	armed := s.lingerArmed
	s.mu.Unlock()
	if !held || (armed && !awaited) {
		return // the flusher's timer already runs: it sends this one in time
	}
	wake := s.flushSoon
	if awaited {
		wake = s.flushNow
	}
	select {
	case wake <- struct{}{}:
	default:
	}
}

// releaseLinger is how long a lease released with ReleaseSoon may wait for
// an Acquire to carry it, or for a request to take it over (handOver),
// before it is sent alone. At 2 ms, at 1,000 requests a second, a release
// went alone often enough that 0.58 round trips per request were left
// (BENCHMARKS.md §19); meanwhile the slot only looks taken to the other
// replicas, and as soon as anyone waits for the backend (an announcement
// on either channel) its lingering releases are sent at once. awaitedFor
// is how long after such an announcement releases of that backend are
// sent at once and not handed over.
const (
	releaseLinger = 20 * time.Millisecond
	awaitedFor    = time.Second
)

// forget stops renewing l and queues its release for the next call.
func (s *Store) forget(l Lease) {
	s.mu.Lock()
	s.forgetLocked(l)
	s.mu.Unlock()
}

// forgetLocked is forget; it reports false when l is zero or not held
// (released already).
func (s *Store) forgetLocked(l Lease) bool {
	if l.IsZero() {
		return false
	}
	m := s.leases[l.backend]
	if _, ok := m[l.member]; !ok {
		return false
	}
	delete(m, l.member)
	if len(m) == 0 {
		delete(s.leases, l.backend)
	}
	s.giveBack = append(s.giveBack, released{l, time.Now()})
	return true
}

// Flush sends the releases that no call has carried yet, in one call. If
// Redis does not answer they are left to the next renewal, which deletes
// them.
func (s *Store) Flush(ctx context.Context) error {
	s.mu.Lock()
	back := s.giveBack
	s.giveBack = nil
	s.mu.Unlock()
	return s.send(ctx, back)
}

// flushLingered sends, in one call, the releases that have waited at least
// half the linger by now, and returns when the oldest of those left will
// have waited the whole linger (zero if none is left). Sending those of
// half the linger too gathers releases that came close together into one
// call rather than one each.
func (s *Store) flushLingered(ctx context.Context, now time.Time) (time.Time, error) {
	s.mu.Lock()
	cut := now.Add(-s.o.linger / 2)
	n := 0
	for n < len(s.giveBack) && !s.giveBack[n].at.After(cut) {
		n++
	}
	back := slices.Clone(s.giveBack[:n])
	s.giveBack = slices.Delete(s.giveBack, 0, n)
	var next time.Time
	if len(s.giveBack) > 0 {
		next = s.giveBack[0].at.Add(s.o.linger)
	}
	s.lingerArmed = !next.IsZero()
	s.mu.Unlock()
	return next, s.send(ctx, back)
}

// send releases back in one call (nothing if it is empty).
func (s *Store) send(ctx context.Context, back []released) error {
	if len(back) == 0 {
		return nil
	}
	keys := make([]string, 0, 2*len(back))
	args := make([]any, 0, 1+2*len(back))
	args = append(args, s.channel)
	for _, l := range back {
		keys = append(keys, s.leaseKey(l.backend), s.waitKey(l.backend))
		args = append(args, l.member, l.backend)
	}
	if err := releaseScript.Run(ctx, s.rdb, keys, args...).Err(); err != nil {
		s.mu.Lock()
		s.orphanAllLocked(back)
		s.mu.Unlock()
		if len(back) == 1 {
			return fmt.Errorf("lease: release on %q: %w", back[0].backend, err)
		}
		return fmt.Errorf("lease: release %d leases: %w", len(back), err)
	}
	return nil
}

// flusher sends the releases of ReleaseSoon that neither an Acquire
// carried nor a request took over (handOver) within the linger — each
// lease's own, counted from its release, so that at a steady rate of
// requests the leases released last stay to be handed on while those no
// request took go back — and all of them at once when someone waits.
func (s *Store) flusher(ctx context.Context) {
	defer s.wg.Done()
	linger := time.NewTimer(s.o.linger)
	linger.Stop()
	for {
		all := false
		select {
		case <-ctx.Done():
			return // Close sends what is left
		case <-s.flushNow:
			all = true
		case <-s.flushSoon:
			s.mu.Lock()
			arm := !s.lingerArmed && len(s.giveBack) > 0
			var due time.Time
			if arm {
				s.lingerArmed, due = true, s.giveBack[0].at.Add(s.o.linger)
			}
			s.mu.Unlock()
			if arm {
				linger.Reset(time.Until(due))
			}
			continue
		case <-linger.C:
		}
		fctx, cancel := context.WithTimeout(ctx, s.o.TTL/3)
		var err error
		if all {
			err = s.Flush(fctx)
		} else {
			var next time.Time
			// (flushLingered keeps lingerArmed true exactly when next is set.)
			if next, err = s.flushLingered(fctx, time.Now()); !next.IsZero() {
				linger.Reset(time.Until(next))
			}
		}
		cancel()
		if err != nil && ctx.Err() == nil {
			s.log.Warn("lease release failed; the next renewal deletes the leases", "err", err)
		}
	}
}

// ClearWait removes queue's wait entries on backends, for when the local
// queue emptied because its waiters left (a queue emptied by grants has
// already cleared them through Request.Next). Slots that were owed to the
// queue become free for others, who are notified.
func (s *Store) ClearWait(ctx context.Context, queue string, backends []string) error {
	if len(backends) == 0 {
		return nil
	}
	s.mu.Lock()
	for _, b := range backends {
		s.forgetWaitLocked(b, queue)
	}
	s.mu.Unlock()
	keys := make([]string, 0, 2*len(backends))
	args := make([]any, 0, 2+len(backends))
	args = append(args, s.waitMember(queue), s.channel)
	for _, b := range backends {
		keys = append(keys, s.waitKey(b), s.waitExpKey(b))
		args = append(args, b)
	}
	// If this fails the entries are no longer renewed and lapse within TTL.
	if err := clearScript.Run(ctx, s.rdb, keys, args...).Err(); err != nil {
		return fmt.Errorf("lease: clear wait entries of queue %q: %w", queue, err)
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
// lease still held and removes this replica's wait entries and liveness.
// What that call fails to remove lapses within TTL. It does not close the
// Redis client.
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
	cancel, ps := s.cancel, s.ps
	s.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if ps != nil {
		// Closing the connection unblocks a receive waiting for data; the
		// cancelled context alone would not.
		_ = ps.Close()
	}
	s.wg.Wait()
	return true
}

func (s *Store) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// forgetWaitLocked drops the local record of one wait entry.
func (s *Store) forgetWaitLocked(backend, queue string) {
	if m := s.waits[backend]; m != nil {
		delete(m, queue)
		if len(m) == 0 {
			delete(s.waits, backend)
		}
	}
}

// orphanLocked queues member for deletion by the next renewal.
func (s *Store) orphanLocked(backend, member string) {
	s.orphans[backend] = append(s.orphans[backend], orphan{member: member, at: time.Now()})
}

// orphanAllLocked queues leases whose release got no answer for deletion
// by the next renewal. (After an error from Redis itself too: a script
// that failed may have released some of them, and deleting a lease twice
// is harmless.)
func (s *Store) orphanAllLocked(ls []released) {
	for _, l := range ls {
		s.orphanLocked(l.backend, l.member)
	}
}

// renewItem is one lease or wait entry sent for renewal, in the order the
// renew script counts positions.
type renewItem struct {
	backend string
	member  string // lease member, or queue name for a wait entry
	wait    bool
	gen     uint64
}

// snapshotLocked builds the KEYS and ARGV of renewScript (or leaveScript)
// for everything the store holds. With renew set it leaves out wait entries
// idle for longer than WaitIdle and orphans older than TTL, which Redis has
// dropped by now, and forgets both locally.
func (s *Store) snapshotLocked(now time.Time, renew bool) ([]string, []any, []renewItem) {
	backends := map[string]struct{}{}
	for b := range s.leases {
		backends[b] = struct{}{}
	}
	for b := range s.waits {
		backends[b] = struct{}{}
	}
	for b := range s.orphans {
		backends[b] = struct{}{}
	}
	keys := []string{s.replicasKey()}
	args := []any{s.o.Replica, s.o.TTL.Milliseconds(), s.channel}
	var items []renewItem
	for b := range backends {
		keys = append(keys, s.leaseKey(b), s.waitKey(b), s.waitExpKey(b))
		args = append(args, b, len(s.leases[b]))
		for m := range s.leases[b] {
			args = append(args, m)
			items = append(items, renewItem{backend: b, member: m})
		}
		var queues []string
		for q, w := range s.waits[b] {
			if renew && now.Sub(w.touched) > s.o.WaitIdle {
				s.log.Warn("wait entry idle too long; no longer renewed (call ClearWait when a queue empties)",
					"backend", b, "queue", q, "idle", now.Sub(w.touched).Round(time.Second))
				s.forgetWaitLocked(b, q)
				continue
			}
			queues = append(queues, q)
			items = append(items, renewItem{backend: b, member: q, wait: true, gen: w.gen})
		}
		args = append(args, len(queues))
		for _, q := range queues {
			args = append(args, s.waitMember(q))
		}
		var orphans []string
		for _, o := range s.orphans[b] {
			if !renew || now.Sub(o.at) <= s.o.TTL {
				orphans = append(orphans, o.member)
			}
		}
		args = append(args, len(orphans))
		for _, m := range orphans {
			args = append(args, m)
		}
	}
	return keys, args, items
}

// renew sends one renewal for everything the store holds.
func (s *Store) renew(ctx context.Context) error {
	s.mu.Lock()
	keys, args, items := s.snapshotLocked(time.Now(), true)
	// Orphans are sent once; if this renewal fails they are sent again
	// until they are older than TTL.
	sentOrphans := s.orphans
	s.orphans = map[string][]orphan{}
	s.mu.Unlock()

	s.renewals.Add(1)
	res, err := renewScript.Run(ctx, s.rdb, keys, args...).Slice()
	if err != nil {
		s.mu.Lock()
		for b, list := range sentOrphans {
			for _, o := range list {
				if time.Since(o.at) <= s.o.TTL {
					s.orphans[b] = append(s.orphans[b], o)
				}
			}
		}
		s.mu.Unlock()
		return fmt.Errorf("lease: renew %d leases and wait entries: %w", len(items), err)
	}
	if len(res) != 2 {
		return fmt.Errorf("lease: renew script returned %d values, want 2", len(res))
	}
	live, _ := res[0].(int64)
	s.live.Store(max(live, 1))
	lost, _ := res[1].([]any)
	if len(lost) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, v := range lost {
		pos, _ := v.(int64)
		if pos < 1 || int(pos) > len(items) {
			continue
		}
		it := items[pos-1]
		if it.wait {
			// Only if no Acquire has set the entry again meanwhile.
			if w, ok := s.waits[it.backend][it.member]; ok && w.gen == it.gen {
				s.forgetWaitLocked(it.backend, it.member)
			}
			continue
		}
		if m := s.leases[it.backend]; m != nil {
			if _, ok := m[it.member]; ok {
				// The request still runs, so the backend may now serve more
				// than Max at once until it ends.
				s.log.Warn("lease expired before it could be renewed; its slot may be taken twice", "backend", it.backend)
				delete(m, it.member)
				if len(m) == 0 {
					delete(s.leases, it.backend)
				}
			}
		}
	}
	return nil
}

// renewLoop renews every TTL/3; after a failure it retries sooner, with a
// doubling back-off, so that a short outage does not eat into the leases'
// margin.
func (s *Store) renewLoop(ctx context.Context) {
	defer s.wg.Done()
	interval := s.o.TTL / 3
	backoff := min(50*time.Millisecond, interval)
	first, failing := true, false
	for {
		if first {
			// Loading the scripts up front makes the first Acquire and
			// Release single EVALSHAs too.
			if err := s.loadScripts(ctx, interval); err != nil {
				s.lastErr.Store(&err)
			}
		}
		rctx, cancel := context.WithTimeout(ctx, interval)
		err := s.renew(rctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		wait := interval
		if err != nil {
			s.lastErr.Store(&err)
			if !failing {
				s.log.Warn("lease renewal failed; retrying", "err", err)
			}
			failing = true
			wait = jitter(backoff)
			backoff = min(backoff*2, interval)
		} else {
			if failing {
				s.log.Info("lease renewal restored")
			}
			failing = false
			backoff = min(50*time.Millisecond, interval)
			if first {
				first = false
				close(s.renewedOnce)
			}
		}
		if !sleepCtx(ctx, wait) {
			return
		}
	}
}

// loadScripts loads every script in one pipeline.
func (s *Store) loadScripts(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		// Not Script.Load, which would record the empty digest of a
		// pipelined command that has not run yet.
		for _, src := range sources {
			p.ScriptLoad(ctx, src)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("lease: load scripts: %w", err)
	}
	return nil
}

// isServerError reports whether err is an answer from Redis (the command
// ran, or certainly did not) rather than a failure to get one.
func isServerError(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// jitter returns a duration in [d/2, d), so that replicas do not retry in
// lockstep.
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + mrand.N(d/2)
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
