package budget

import (
	"context"
	"sync"
	"time"
)

// NewMemory returns a Store for a single replica without Redis: the state
// lives in this process, exact, and is rebuilt from spend after a restart.
// It panics on a nil Spender, a programming error.
func NewMemory(spend Spender) *Store {
	return newStore(&memoryEngine{windows: map[string]*memWindow{}}, spend, nil)
}

// memoryEngine holds what the Redis scripts hold, under one mutex: every
// call is short and touches a few windows.
type memoryEngine struct {
	mu        sync.Mutex
	windows   map[string]*memWindow // by window.name
	nextSweep time.Time
}

type memWindow struct {
	known    bool // spent was built from the Spender
	spent    int64
	renews   time.Time // zero for a total budget
	reserved int64     // Σ res
	res      map[string]memReservation
	earliest time.Time // no deadline in res comes before it
}

type memReservation struct {
	amount   int64
	deadline time.Time
}

// sweepEvery is how often reserve drops the windows that ended over two
// days ago, as their Redis keys would expire.
const sweepEvery = time.Minute

func (e *memoryEngine) window(w window) *memWindow {
	mw := e.windows[w.name]
	if mw == nil {
		mw = &memWindow{renews: w.renews, res: map[string]memReservation{}}
		e.windows[w.name] = mw
	}
	return mw
}

// purge removes the reservations whose deadline is at or before now.
func (mw *memWindow) purge(now time.Time) {
	if len(mw.res) == 0 || now.Before(mw.earliest) {
		return
	}
	var earliest time.Time
	for id, r := range mw.res {
		if !r.deadline.After(now) {
			delete(mw.res, id)
			mw.reserved -= r.amount
		} else if earliest.IsZero() || r.deadline.Before(earliest) {
			earliest = r.deadline
		}
	}
	mw.earliest = earliest
}

// lookup returns the windows' state, or the indexes of those whose spent
// is unknown. Called with e.mu held.
func (e *memoryEngine) lookup(ws []window, now time.Time) ([]*memWindow, []int) {
	mws := make([]*memWindow, len(ws))
	var missing []int
	for i, w := range ws {
		mws[i] = e.window(w)
		if !mws[i].known {
			missing = append(missing, i)
		}
	}
	if missing != nil {
		return nil, missing
	}
	for _, mw := range mws {
		mw.purge(now)
	}
	return mws, nil
}

func (e *memoryEngine) reserve(_ context.Context, id string, ws []window, amount int64, ttl time.Duration, now time.Time) (reserveResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sweep(now)
	mws, missing := e.lookup(ws, now)
	if missing != nil {
		return reserveResult{missing: missing}, nil
	}
	if amount > 0 {
		for i, mw := range mws {
			if mw.spent+mw.reserved+amount > ws[i].limit.Amount {
				return reserveResult{refused: i, spent: mw.spent, reserved: mw.reserved}, nil
			}
		}
	}
	deadline := now.Add(ttl)
	for _, mw := range mws {
		if old, ok := mw.res[id]; ok {
			mw.reserved -= old.amount
		}
		mw.res[id] = memReservation{amount: amount, deadline: deadline}
		mw.reserved += amount
		if mw.earliest.IsZero() || deadline.Before(mw.earliest) {
			mw.earliest = deadline
		}
	}
	return reserveResult{refused: -1}, nil
}

func (e *memoryEngine) setSpent(_ context.Context, ws []window, spent []int64, _ time.Time) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, w := range ws {
		if mw := e.window(w); !mw.known {
			mw.known, mw.spent = true, spent[i]
		}
	}
	return nil
}

func (e *memoryEngine) settle(_ context.Context, id string, ws []window, cost int64) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, w := range ws {
		mw := e.windows[w.name]
		if mw == nil {
			continue // swept: the window ended days ago
		}
		if r, ok := mw.res[id]; ok {
			delete(mw.res, id)
			mw.reserved -= r.amount
		}
		if mw.known {
			mw.spent += cost
		}
	}
	return nil
}

func (e *memoryEngine) status(_ context.Context, ws []window, now time.Time) ([]int, []State, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	mws, missing := e.lookup(ws, now)
	if missing != nil {
		return missing, nil, nil
	}
	states := make([]State, len(ws))
	for i, mw := range mws {
		states[i] = State{Limit: ws[i].limit, Spent: mw.spent, Reserved: mw.reserved, Renews: ws[i].renews}
	}
	return nil, states, nil
}

// sweep drops, at most once a sweepEvery, the windows that ended over two
// days ago and those left unbuilt and empty. Called with e.mu held.
func (e *memoryEngine) sweep(now time.Time) {
	if now.Before(e.nextSweep) {
		return
	}
	e.nextSweep = now.Add(sweepEvery)
	for name, mw := range e.windows {
		ended := !mw.renews.IsZero() && !now.Before(mw.renews.Add(48*time.Hour))
		if ended || !mw.known && len(mw.res) == 0 {
			delete(e.windows, name)
		}
	}
}
