package stop

import (
	"cmp"
	"hash/maphash"
	"slices"
	"sync"
	"time"
)

// recentGenerations is how many generations a recentSet splits its
// retention into; one more, the newest, is being filled.
const recentGenerations = 4

// recentSet remembers ids, each with a 64-bit value, for at least its
// retention and at most a quarter longer, in about 16 bytes each: the
// Service's record of the inferences it finished, whose and how, one
// entry per request of the last minute (60,000 at 1,000 requests a second).
// A Holder's map kept each id's string and its expiry, ~72 bytes an id,
// which at that rate was the largest part of the live heap.
//
// An id is kept as a 64-bit keyed hash, so the set holds no string. The
// seed is random per process, so nobody outside can aim at a key; two ids
// share one with probability 2⁻⁶⁴, and Has's answer for an id never added
// is wrong with probability (ids held)/2⁶⁴, under 10⁻¹⁴ at that rate.
//
// Entries go by generation: the newest is a slice appended to; every
// retention/recentGenerations it is sorted (a look-up in an older one is a
// binary search), the oldest is dropped whole, and a new one starts sized
// for as many ids as the last one got (so it shrinks when traffic does).
type recentSet struct {
	seed maphash.Seed
	span time.Duration

	mu    sync.Mutex
	gens  [recentGenerations + 1][]recentEntry // gens[0]: the newest, unsorted
	timer *time.Timer                          // nil once closed
}

// recentEntry is one remembered id: its keyed hash and the value it was
// added with.
type recentEntry struct {
	key, val uint64
}

func compareRecent(a recentEntry, key uint64) int { return cmp.Compare(a.key, key) }

func newRecentSet(retention time.Duration) *recentSet {
	r := &recentSet{seed: maphash.MakeSeed(), span: max(retention/recentGenerations, time.Millisecond)}
	// rotate reads the timer under the lock and may run before this
	// returns; the assignment takes the lock too.
	r.mu.Lock()
	r.timer = time.AfterFunc(r.span, r.rotate)
	r.mu.Unlock()
	return r
}

// Add remembers id with val (after Close, it does nothing).
func (r *recentSet) Add(id string, val uint64) {
	k := maphash.String(r.seed, id)
	r.mu.Lock()
	if r.timer != nil {
		r.gens[0] = append(r.gens[0], recentEntry{key: k, val: val})
	}
	r.mu.Unlock()
}

// Get returns the value id was last added with, if it was added within the
// retention.
func (r *recentSet) Get(id string) (uint64, bool) {
	k := maphash.String(r.seed, id)
	r.mu.Lock()
	defer r.mu.Unlock()
	// The newest generation is unsorted: the last match is the latest Add.
	g := r.gens[0]
	for i := len(g) - 1; i >= 0; i-- {
		if g[i].key == k {
			return g[i].val, true
		}
	}
	for _, g := range r.gens[1:] {
		if i, ok := slices.BinarySearchFunc(g, k, compareRecent); ok {
			return g[i].val, true
		}
	}
	return 0, false
}

// Has reports whether id was added within the retention.
func (r *recentSet) Has(id string) bool {
	_, ok := r.Get(id)
	return ok
}

// Len returns the number of ids remembered.
func (r *recentSet) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, g := range r.gens {
		n += len(g)
	}
	return n
}

// rotate sorts the newest generation, drops the oldest and starts a new one.
func (r *recentSet) rotate() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.timer == nil {
		return // closed
	}
	// Stable, so that among equal keys the latest Add stays last.
	slices.SortStableFunc(r.gens[0], func(a, b recentEntry) int { return cmp.Compare(a.key, b.key) })
	copy(r.gens[1:], r.gens[:recentGenerations])
	r.gens[0] = make([]recentEntry, 0, len(r.gens[1]))
	r.timer.Reset(r.span)
}

// Close stops the rotation and forgets every id.
func (r *recentSet) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	r.gens = [recentGenerations + 1][]recentEntry{}
}
