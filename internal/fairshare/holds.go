// Package fairshare bounds what one person holds of a replica's shared
// resources at once — open event streams, running requests — and ends all
// of it when their access is withdrawn. A hold is in memory: it is what
// this replica's goroutines and sockets serve, and it goes when they do.
package fairshare

import (
	"sort"
	"sync"
)

// Holds counts each person's holds of one resource on this replica.
type Holds struct {
	max int // 0: no bound

	mu       sync.Mutex
	byPerson map[uint]map[*hold]struct{}
}

// hold is one thing a person holds; end takes it from them.
type hold struct {
	end func()
}

// New returns Holds of at most max per person (0: no bound, only End).
func New(max int) *Holds {
	return &Holds{max: max, byPerson: map[uint]map[*hold]struct{}{}}
}

// Take gives person one more hold, unless they hold max already (ok false).
// end is how End takes it from them: it must not block, and must not call
// back into these Holds (cancel a context). release gives the hold back; it
// may be called more than once.
func (h *Holds) Take(person uint, end func()) (release func(), ok bool) {
	hd := &hold{end: end}
	h.mu.Lock()
	held := h.byPerson[person]
	if h.max > 0 && len(held) >= h.max {
		h.mu.Unlock()
		return func() {}, false
	}
	if held == nil {
		held = map[*hold]struct{}{}
		h.byPerson[person] = held
	}
	held[hd] = struct{}{}
	h.mu.Unlock()
	return func() { h.release(person, hd) }, true
}

func (h *Holds) release(person uint, hd *hold) {
	h.mu.Lock()
	defer h.mu.Unlock()
	held := h.byPerson[person]
	delete(held, hd)
	if len(held) == 0 {
		delete(h.byPerson, person)
	}
}

// Max is the bound of each person's holds (0: none).
func (h *Holds) Max() int { return h.max }

// Held returns how many holds person has.
func (h *Holds) Held(person uint) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.byPerson[person])
}

// EndPerson calls the end of every hold person has, and returns how many. The
// holds stay counted until their owners release them.
func (h *Holds) EndPerson(person uint) int {
	h.mu.Lock()
	ends := make([]func(), 0, len(h.byPerson[person]))
	for hd := range h.byPerson[person] {
		ends = append(ends, hd.end)
	}
	h.mu.Unlock()
	for _, end := range ends {
		end()
	}
	return len(ends)
}

// People returns the people who hold anything now, in order.
func (h *Holds) People() []uint {
	h.mu.Lock()
	out := make([]uint, 0, len(h.byPerson))
	for p := range h.byPerson {
		out = append(out, p)
	}
	h.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
