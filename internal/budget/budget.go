package budget

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"

	"moonji/internal/money"
)

// Scope is what a budget belongs to.
type Scope string

const (
	ScopeKey    Scope = "key"
	ScopePerson Scope = "person"
	ScopeTeam   Scope = "team"
)

// Period is how often a budget renews.
type Period string

const (
	PeriodDay   Period = "day"   // renews at 00:00 UTC
	PeriodMonth Period = "month" // renews on the first of the month, 00:00 UTC
	PeriodTotal Period = "total" // never renews
)

// ParsePeriod reads a period as the configuration writes it.
func ParsePeriod(s string) (Period, error) {
	switch p := Period(s); p {
	case PeriodDay, PeriodMonth, PeriodTotal:
		return p, nil
	}
	return "", fmt.Errorf("budget: unknown period %q (day, month or total)", s)
}

// DefaultTTL is how long a reservation lasts when Reserve is given no
// positive ttl: longer than any request should run.
const DefaultTTL = 30 * time.Minute

// ErrUnavailable wraps the errors of reading or writing the budgets' state:
// Redis did not answer, or the database did not say what was spent when a
// window had to be built. The caller fails closed: it refuses the requests
// that have a budget and admits those without.
var ErrUnavailable = errors.New("budget state unavailable")

// Limit is one budget that applies to a request.
type Limit struct {
	Scope  Scope
	ID     uint   // the key's, person's or team's id
	Name   string // for messages: the key's name, the person's email, the team's name
	Amount int64  // money.Amount, nano-units: the budget per period; ≤ 0 allows nothing but free requests
	Period Period
}

// Window returns the period containing now: its start and when it renews,
// in UTC. Both are the zero time for PeriodTotal (and for an unknown
// period): since the beginning, for ever.
func (l Limit) Window(now time.Time) (start, renews time.Time) {
	y, m, d := now.UTC().Date()
	switch l.Period {
	case PeriodDay:
		start = time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
		return start, start.AddDate(0, 0, 1)
	case PeriodMonth:
		start = time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)
		return start, start.AddDate(0, 1, 0)
	}
	return time.Time{}, time.Time{}
}

func (l Limit) String() string {
	return fmt.Sprintf("%s %d (%s) per %s", l.Scope, l.ID, l.Name, l.Period)
}

func (l Limit) validate() error {
	switch l.Scope {
	case ScopeKey, ScopePerson, ScopeTeam:
	default:
		return fmt.Errorf("budget: limit %v: unknown scope %q", l, l.Scope)
	}
	if _, err := ParsePeriod(string(l.Period)); err != nil {
		return fmt.Errorf("budget: limit %v: %w", l, err)
	}
	return nil
}

// Spender tells what one scope has already spent since a time: the sum of
// its final ledger rows. The database is the truth; the store asks it
// once per window, when Redis (or the memory store) has nothing for it.
type Spender interface {
	// Spent returns l's scope's spending since since; since is the zero
	// time for a total budget (everything).
	Spent(ctx context.Context, l Limit, since time.Time) (int64, error)
}

// Refusal says why Reserve refused: the first limit that did not fit.
type Refusal struct {
	Limit    Limit
	Spent    int64     // settled in the window
	Reserved int64     // held by requests still running
	Left     int64     // Amount − Spent − Reserved, at least 0
	Renews   time.Time // zero for a total budget
}

// Message says it for the client: which budget, and when it renews.
func (r *Refusal) Message() string {
	msg := fmt.Sprintf("the %s budget of %s %q does not cover this request: %s of %s left",
		r.Limit.Period, r.Limit.Scope, r.Limit.Name, money.FormatShort(r.Left), money.FormatShort(r.Limit.Amount))
	if !r.Renews.IsZero() {
		msg += ", renews " + r.Renews.Format(time.RFC3339)
	}
	return msg
}

// State is one limit's spending now.
type State struct {
	Limit    Limit
	Spent    int64
	Reserved int64
	Renews   time.Time // zero for a total budget
}

// Left is what may still be reserved, at least 0.
func (s State) Left() int64 { return max(s.Limit.Amount-s.Spent-s.Reserved, 0) }

// window is one limit's current period and the name of its state.
type window struct {
	limit         Limit
	start, renews time.Time
	name          string // "budget:<scope>:<id>:<period>:<start unix>", without the prefix
}

func windowsOf(limits []Limit, now time.Time) ([]window, error) {
	ws := make([]window, len(limits))
	for i, l := range limits {
		if err := l.validate(); err != nil {
			return nil, err
		}
		start, renews := l.Window(now)
		var startUnix int64 // 0 for total: the zero time's Unix is far negative
		if !start.IsZero() {
			startUnix = start.Unix()
		}
		ws[i] = window{limit: l, start: start, renews: renews,
			name: "budget:" + string(l.Scope) + ":" + strconv.FormatUint(uint64(l.ID), 10) + ":" +
				string(l.Period) + ":" + strconv.FormatInt(startUnix, 10)}
	}
	return ws, nil
}

// keep is how long the window's state is worth keeping, from now: two
// days past its end, so that a late settle still finds it. A total
// budget's state is kept a day from when it was built and then rebuilt
// from the database, so that a settle lost to a Redis failure is not
// missing from it for ever.
func (w window) keep(now time.Time) time.Duration {
	if w.renews.IsZero() {
		return totalKeep
	}
	return w.renews.Add(48 * time.Hour).Sub(now)
}

// totalKeep is how long a total budget's state lives in Redis.
const totalKeep = 24 * time.Hour

// engine is where the state lives: Redis or this process. Each call is
// atomic over all its windows.
type engine interface {
	// reserve either reports the windows whose spent is unknown (and does
	// nothing else), or refuses at the first window that does not fit
	// (refused ≥ 0, with its spent and reserved), or reserves on all.
	reserve(ctx context.Context, id string, ws []window, amount int64, ttl time.Duration, now time.Time) (r reserveResult, err error)
	// setSpent sets the spent of the windows that still have none.
	setSpent(ctx context.Context, ws []window, spent []int64, now time.Time) error
	// settle removes reservation id from every window and adds cost to
	// the spent of those that have one.
	settle(ctx context.Context, id string, ws []window, cost int64) error
	// status reports the windows whose spent is unknown, or every
	// window's spent and live reservations.
	status(ctx context.Context, ws []window, now time.Time) (missing []int, states []State, err error)
}

type reserveResult struct {
	missing         []int
	refused         int // index in ws, or -1
	spent, reserved int64
}

// Store accounts spending against budgets. It is safe for concurrent use.
type Store struct {
	eng    engine
	spend  Spender
	log    *slog.Logger
	flight singleflight.Group // one Spender query per window at a time
}

func newStore(eng engine, spend Spender, log *slog.Logger) *Store {
	if spend == nil {
		panic("budget: nil Spender")
	}
	if log == nil {
		log = slog.Default()
	}
	return &Store{eng: eng, spend: spend, log: log.With("component", "budget")}
}

// fillAttempts bounds Reserve's and Status's rounds of building windows:
// a window built is found by the next round unless Redis lost it in
// between (a restart, a flush).
const fillAttempts = 3

// Reserve atomically checks every limit (spent + reserved + amount ≤
// Amount for each) and, only if all fit, reserves amount against all of
// them under id (the inference id, unique) until ttl passes (DefaultTTL
// when ttl ≤ 0). A refusal names the first limit that does not fit. An
// amount of 0 always fits (a free model's request, even against a budget
// of 0) and is still reserved, so that its settle is like any other.
//
// The request is admitted when both the Refusal and the error are nil;
// with no limits the Reservation is nil too, its Settle a no-op. An error
// wrapping ErrUnavailable means the state could not be read or written.
func (s *Store) Reserve(ctx context.Context, id string, limits []Limit, amount int64, ttl time.Duration, now time.Time) (*Reservation, *Refusal, error) {
	if len(limits) == 0 {
		return nil, nil, nil
	}
	ws, err := windowsOf(limits, now)
	if err != nil {
		return nil, nil, err
	}
	amount = max(amount, 0)
	if ttl <= 0 {
		ttl = DefaultTTL
	}
	for range fillAttempts {
		r, err := s.eng.reserve(ctx, id, ws, amount, ttl, now)
		if err != nil {
			return nil, nil, err
		}
		if len(r.missing) > 0 {
			if err := s.fill(ctx, ws, r.missing, now); err != nil {
				return nil, nil, err
			}
			continue
		}
		if r.refused >= 0 {
			w := ws[r.refused]
			return nil, &Refusal{Limit: w.limit, Spent: r.spent, Reserved: r.reserved,
				Left: max(w.limit.Amount-r.spent-r.reserved, 0), Renews: w.renews}, nil
		}
		return &Reservation{store: s, id: id, windows: ws}, nil, nil
	}
	return nil, nil, fmt.Errorf("budget: reserve %s: spent lost while being built %d times: %w", id, fillAttempts, ErrUnavailable)
}

// Status returns, for each limit, what was spent in its current window and
// what running requests hold: what the /usage page shows as left.
func (s *Store) Status(ctx context.Context, limits []Limit, now time.Time) ([]State, error) {
	if len(limits) == 0 {
		return nil, nil
	}
	ws, err := windowsOf(limits, now)
	if err != nil {
		return nil, err
	}
	for range fillAttempts {
		missing, states, err := s.eng.status(ctx, ws, now)
		if err != nil {
			return nil, err
		}
		if len(missing) == 0 {
			return states, nil
		}
		if err := s.fill(ctx, ws, missing, now); err != nil {
			return nil, err
		}
	}
	return nil, fmt.Errorf("budget: status: spent lost while being built %d times: %w", fillAttempts, ErrUnavailable)
}

// fill asks the Spender what the missing windows have spent and stores it
// where nobody has yet. Callers of this replica missing the same window at
// the same time share one query.
func (s *Store) fill(ctx context.Context, ws []window, missing []int, now time.Time) error {
	sub := make([]window, len(missing))
	spent := make([]int64, len(missing))
	for j, i := range missing {
		w := ws[i]
		v, err, _ := s.flight.Do(w.name, func() (any, error) {
			return s.spend.Spent(ctx, w.limit, w.start)
		})
		if err != nil {
			return fmt.Errorf("budget: what %v spent since %s: %w: %w", w.limit, w.start.Format(time.DateOnly), ErrUnavailable, err)
		}
		sub[j], spent[j] = w, max(v.(int64), 0)
	}
	return s.eng.setSpent(ctx, sub, spent, now)
}

// Reservation is an amount held against a request's limits until Settle
// (or its ttl).
type Reservation struct {
	store   *Store
	id      string
	windows []window // the windows it was made in: a request counts in the period it began in, as its ledger row does
	settled atomic.Bool
}

// Settle replaces the reservation with the request's real cost, which may
// be more or less than was reserved, on every limit. Only the first call
// does anything; a nil Reservation does nothing. Give it a context of its
// own (context.Background with a timeout): the request's may be gone. A
// failure is logged; the reservation then lapses at its deadline, and the
// cost is missing from the window until it is rebuilt from the database.
func (r *Reservation) Settle(ctx context.Context, cost int64) {
	if r == nil || !r.settled.CompareAndSwap(false, true) {
		return
	}
	if err := r.store.eng.settle(ctx, r.id, r.windows, max(cost, 0)); err != nil {
		r.store.log.Warn("budget: settle failed; the reservation lapses at its deadline",
			"id", r.id, "cost", cost, "err", err)
	}
}
