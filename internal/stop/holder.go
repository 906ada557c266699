package stop

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultTTL is how long a stop signal is remembered when NewHolder is given
// no TTL. It matches the Redis key TTL so that both forget at about the same
// time.
const DefaultTTL = 10 * time.Minute

// defaultShards is the number of independently locked parts of a Holder.
// BenchmarkStopped compares it with a single RWMutex: under parallel readers
// one RWMutex makes every core write the same reader counter, which the
// shards avoid.
const defaultShards = 32

// maxSweep caps the janitor interval so that a long TTL does not let expired
// entries pile up for long.
const maxSweep = 30 * time.Second

// Holder keeps in-memory stop signals keyed by inference id.
//
// Stopped is a map look-up under a read lock: no I/O, no clock read and no
// allocation, so the stream relay can call it for every token. Entries are
// forgotten by a janitor goroutine once they are older than the TTL, so an
// entry lives between TTL and TTL plus one sweep interval (at most TTL/4,
// capped at 30 s). That slack is harmless because inference ids are never
// reused. Close stops the janitor.
type Holder struct {
	ttl    time.Duration
	sweep  time.Duration
	seed   maphash.Seed
	mask   uint64
	shards []shard

	closeOnce sync.Once
	done      chan struct{}
	janitor   sync.WaitGroup
}

// shard is one independently locked part of a Holder.
type shard struct {
	mu sync.RWMutex
	// stops maps an id to the unix-nano time after which it may be forgotten.
	stops map[string]int64
	// watchers holds the callbacks of ids that are watched but not stopped.
	watchers map[string][]*watcher
	// peak is the largest len(stops) since the map was last rebuilt; Go
	// maps never give memory back on delete, so the janitor rebuilds a map
	// that has shrunk well below its peak.
	peak      int
	peakWatch int
	// pad keeps neighbouring shards' locks off the same cache line.
	_ [64]byte
}

// watcher is one Watch registration. state moves once from watchActive to
// watchFired (Stop won) or watchCancelled (unwatch won), so onStop runs at
// most once.
type watcher struct {
	state  atomic.Int32
	onStop func()
}

const (
	watchActive int32 = iota
	watchFired
	watchCancelled
)

// NewHolder returns a Holder that forgets stop signals after ttl (DefaultTTL
// when ttl <= 0) and starts its janitor goroutine.
func NewHolder(ttl time.Duration) *Holder {
	return newHolder(ttl, defaultShards)
}

// newHolder is NewHolder with a chosen shard count (rounded up to a power of
// two), so the benchmark can compare one lock with many.
func newHolder(ttl time.Duration, shards int) *Holder {
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	n := 1
	for n < shards {
		n <<= 1
	}
	sweep := min(max(ttl/4, time.Millisecond), maxSweep)
	h := &Holder{
		ttl:    ttl,
		sweep:  sweep,
		seed:   maphash.MakeSeed(),
		mask:   uint64(n - 1),
		shards: make([]shard, n),
		done:   make(chan struct{}),
	}
	for i := range h.shards {
		h.shards[i].stops = make(map[string]int64)
		h.shards[i].watchers = make(map[string][]*watcher)
	}
	h.janitor.Add(1)
	go h.runJanitor()
	return h
}

// TTL returns how long stop signals are kept.
func (h *Holder) TTL() time.Duration { return h.ttl }

func (h *Holder) shard(id string) *shard {
	if h.mask == 0 {
		return &h.shards[0]
	}
	return &h.shards[maphash.String(h.seed, id)&h.mask]
}

// Stopped reports whether id has been stopped. It is safe to call for every
// token: it does no I/O and does not allocate.
func (h *Holder) Stopped(id string) bool {
	s := h.shard(id)
	s.mu.RLock()
	_, ok := s.stops[id]
	s.mu.RUnlock()
	return ok
}

// Stop records a stop signal for id and reports whether it is the first one
// (a repeated stop is harmless and returns false). The watchers of id are
// called once each, from the calling goroutine, after the lock is released so
// that they may call back into the Holder.
func (h *Holder) Stop(id string) (first bool) {
	s := h.shard(id)
	s.mu.Lock()
	if _, ok := s.stops[id]; ok {
		s.mu.Unlock()
		return false
	}
	s.stops[id] = time.Now().Add(h.ttl).UnixNano()
	s.peak = max(s.peak, len(s.stops))
	ws := s.watchers[id]
	delete(s.watchers, id)
	s.mu.Unlock()
	for _, w := range ws {
		if w.state.CompareAndSwap(watchActive, watchFired) {
			w.onStop()
		}
	}
	return true
}

// Watch calls onStop once if id is, or becomes, stopped while watched. When
// id is already stopped, onStop is called before Watch returns. onStop runs
// on the goroutine that calls Stop (for a broadcast stop, the bus receiver),
// so it must not block: cancel a context or close a channel.
//
// The returned unwatch is idempotent. After it returns, onStop is not called
// unless it had already started. Always call it when the inference ends, or
// the watcher stays in memory until id is stopped.
func (h *Holder) Watch(id string, onStop func()) (unwatch func()) {
	s := h.shard(id)
	w := &watcher{onStop: onStop}
	s.mu.Lock()
	if _, ok := s.stops[id]; ok {
		s.mu.Unlock()
		w.state.Store(watchFired)
		onStop()
		return func() {}
	}
	s.watchers[id] = append(s.watchers[id], w)
	s.peakWatch = max(s.peakWatch, len(s.watchers))
	s.mu.Unlock()
	return func() {
		if !w.state.CompareAndSwap(watchActive, watchCancelled) {
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		ws := s.watchers[id]
		for i, x := range ws {
			if x == w {
				ws = append(ws[:i], ws[i+1:]...)
				break
			}
		}
		if len(ws) == 0 {
			delete(s.watchers, id)
		} else {
			s.watchers[id] = ws
		}
	}
}

// Len returns the number of stop signals currently held (expired ones count
// until the janitor removes them).
func (h *Holder) Len() int {
	n := 0
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.RLock()
		n += len(s.stops)
		s.mu.RUnlock()
	}
	return n
}

// Close stops the janitor. The Holder stays usable but no longer forgets.
func (h *Holder) Close() {
	h.closeOnce.Do(func() { close(h.done) })
	h.janitor.Wait()
}

func (h *Holder) runJanitor() {
	defer h.janitor.Done()
	t := time.NewTicker(h.sweep)
	defer t.Stop()
	for {
		select {
		case <-h.done:
			return
		case now := <-t.C:
			h.expire(now.UnixNano())
		}
	}
}

// expire removes entries whose deadline is before now, one shard at a time
// so that readers of other shards are never held up.
func (h *Holder) expire(now int64) {
	for i := range h.shards {
		s := &h.shards[i]
		s.mu.Lock()
		for id, deadline := range s.stops {
			if deadline <= now {
				delete(s.stops, id)
			}
		}
		if shouldRebuild(len(s.stops), s.peak) {
			s.stops = cloneMap(s.stops)
			s.peak = len(s.stops)
		}
		if shouldRebuild(len(s.watchers), s.peakWatch) {
			s.watchers = cloneMap(s.watchers)
			s.peakWatch = len(s.watchers)
		}
		s.mu.Unlock()
	}
}

// shouldRebuild reports whether a map that once held peak entries and now
// holds n is worth copying to give its unused buckets back to the GC.
func shouldRebuild(n, peak int) bool {
	return peak >= 64 && n <= peak/4
}

func cloneMap[V any](m map[string]V) map[string]V {
	out := make(map[string]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
