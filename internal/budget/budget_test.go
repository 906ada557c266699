package budget

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"moonji/internal/testredis"
)

// at is the tests' now: a Sunday afternoon in December.
var at = time.Date(2026, 12, 6, 15, 4, 0, 0, time.UTC)

// spender is a Spender whose answers the test sets, counting its calls.
type spender struct {
	mu    sync.Mutex
	spent map[string]int64 // by "<scope>:<id>"
	err   error
	calls []string // "<scope>:<id> since <RFC 3339 or zero>"
}

func newSpender() *spender { return &spender{spent: map[string]int64{}} }

func (s *spender) set(scope Scope, id uint, v int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.spent[fmt.Sprintf("%s:%d", scope, id)] = v
}

func (s *spender) Spent(_ context.Context, l Limit, since time.Time) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := fmt.Sprintf("%s:%d", l.Scope, l.ID)
	when := "zero"
	if !since.IsZero() {
		when = since.Format(time.RFC3339)
	}
	s.calls = append(s.calls, k+" since "+when)
	return s.spent[k], s.err
}

func (s *spender) Calls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.calls...)
}

// forEachStore runs fn on a memory store and, through testredis.ForEach,
// on miniredis and the real Redis. open returns a replica of one
// deployment: on Redis a store with a client of its own on the same Redis
// and prefix; in memory the first store opened, which is all one replica
// can share.
func forEachStore(t *testing.T, fn func(t *testing.T, open func(Spender) *Store)) {
	t.Run("memory", func(t *testing.T) {
		var s *Store
		fn(t, func(sp Spender) *Store {
			if s == nil {
				s = NewMemory(sp)
			}
			return s
		})
	})
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		fn(t, func(sp Spender) *Store { return newRedisStore(t, be, sp, nil) })
	})
}

func newRedisStore(t *testing.T, be *testredis.Backend, sp Spender, adjust func(*redis.Options)) *Store {
	t.Helper()
	opts := be.Options()
	if adjust != nil {
		adjust(opts)
	}
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { _ = rdb.Close() })
	return NewRedis(rdb, be.Prefix, sp, testredis.Logger(t))
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustReserve(t *testing.T, s *Store, id string, limits []Limit, amount int64, now time.Time) *Reservation {
	t.Helper()
	r, ref, err := s.Reserve(ctxT(t), id, limits, amount, time.Minute, now)
	if err != nil || ref != nil {
		t.Fatalf("Reserve(%s, %d) = refusal %+v, error %v; want it to fit", id, amount, ref, err)
	}
	return r
}

func mustRefuse(t *testing.T, s *Store, id string, limits []Limit, amount int64, now time.Time) *Refusal {
	t.Helper()
	r, ref, err := s.Reserve(ctxT(t), id, limits, amount, time.Minute, now)
	if err != nil || ref == nil || r != nil {
		t.Fatalf("Reserve(%s, %d) = %v, refusal %+v, error %v; want a refusal", id, amount, r, ref, err)
	}
	return ref
}

// status returns each limit's spent and reserved as "spent/reserved".
func status(t *testing.T, s *Store, limits []Limit, now time.Time) string {
	t.Helper()
	states, err := s.Status(ctxT(t), limits, now)
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	parts := make([]string, len(states))
	for i, st := range states {
		if st.Limit != limits[i] {
			t.Errorf("state %d is for %v, want %v", i, st.Limit, limits[i])
		}
		parts[i] = fmt.Sprintf("%d/%d", st.Spent, st.Reserved)
	}
	return strings.Join(parts, " ")
}

func TestWindow(t *testing.T) {
	day := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	month := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		period        Period
		now           time.Time
		start, renews time.Time
	}{
		{PeriodDay, at, day.AddDate(0, 0, -1), day},
		{PeriodMonth, at, month.AddDate(0, -1, 0), month},
		{PeriodTotal, at, time.Time{}, time.Time{}},
		// 23:30 in UTC−5 is the next day in UTC.
		{PeriodDay, time.Date(2026, 12, 6, 23, 30, 0, 0, time.FixedZone("", -5*3600)), day, day.AddDate(0, 0, 1)},
		{PeriodDay, day, day, day.AddDate(0, 0, 1)}, // midnight belongs to the new day
	} {
		start, renews := Limit{Period: c.period}.Window(c.now)
		if !start.Equal(c.start) || !renews.Equal(c.renews) {
			t.Errorf("%s at %v: window [%v, %v), want [%v, %v)", c.period, c.now, start, renews, c.start, c.renews)
		}
	}
	for _, s := range []string{"day", "month", "total"} {
		if p, err := ParsePeriod(s); err != nil || string(p) != s {
			t.Errorf("ParsePeriod(%q) = %q, %v", s, p, err)
		}
	}
	if _, err := ParsePeriod("week"); err == nil {
		t.Error("ParsePeriod(week) did not fail")
	}
}

func TestReserveFitsAndRefuses(t *testing.T) {
	renews := map[Period]time.Time{
		PeriodDay:   time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC),
		PeriodMonth: time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC),
		PeriodTotal: {},
	}
	forEachStore(t, func(t *testing.T, open func(Spender) *Store) {
		s := open(newSpender())
		for i, p := range []Period{PeriodDay, PeriodMonth, PeriodTotal} {
			l := []Limit{{Scope: ScopeKey, ID: uint(i + 1), Name: "ci", Amount: 100, Period: p}}
			mustReserve(t, s, "a-"+string(p), l, 60, at)
			mustReserve(t, s, "b-"+string(p), l, 40, at) // exactly the budget
			ref := mustRefuse(t, s, "c-"+string(p), l, 1, at)
			want := Refusal{Limit: l[0], Spent: 0, Reserved: 100, Left: 0, Renews: renews[p]}
			if *ref != want {
				t.Errorf("%s: refusal %+v, want %+v", p, *ref, want)
			}
			if !strings.Contains(ref.Message(), `key "ci"`) {
				t.Errorf("%s: message %q does not name the key", p, ref.Message())
			}
		}

		// The refusal names the first limit that does not fit.
		limits := []Limit{
			{Scope: ScopeKey, ID: 10, Name: "k", Amount: 1000, Period: PeriodDay},
			{Scope: ScopePerson, ID: 10, Name: "ann@example.com", Amount: 50, Period: PeriodMonth},
			{Scope: ScopeTeam, ID: 10, Name: "ml", Amount: 20, Period: PeriodTotal},
		}
		mustReserve(t, s, "d", limits, 10, at)
		ref := mustRefuse(t, s, "e", limits, 45, at)
		if ref.Limit != limits[1] || ref.Reserved != 10 || ref.Left != 40 || !ref.Renews.Equal(renews[PeriodMonth]) {
			t.Errorf("refusal %+v, want the person's month with 10 reserved, 40 left", *ref)
		}

		if r, ref, err := s.Reserve(ctxT(t), "none", nil, 10, time.Minute, at); r != nil || ref != nil || err != nil {
			t.Errorf("Reserve with no limits = %v, %v, %v; want nothing", r, ref, err)
		}
		bad := []Limit{{Scope: "org", ID: 1, Amount: 1, Period: PeriodDay}}
		if _, _, err := s.Reserve(ctxT(t), "bad", bad, 1, time.Minute, at); err == nil || errors.Is(err, ErrUnavailable) {
			t.Errorf("Reserve with an unknown scope: %v, want a plain error", err)
		}
	})
}

func TestAllOrNothing(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func(Spender) *Store) {
		sp := newSpender()
		sp.set(ScopeTeam, 3, 495) // the team has 5 left this month
		s := open(sp)
		limits := []Limit{
			{Scope: ScopeKey, ID: 1, Name: "k", Amount: 100, Period: PeriodDay},
			{Scope: ScopePerson, ID: 2, Name: "p", Amount: 200, Period: PeriodTotal},
			{Scope: ScopeTeam, ID: 3, Name: "t", Amount: 500, Period: PeriodMonth},
		}
		ref := mustRefuse(t, s, "big", limits, 10, at)
		if ref.Limit != limits[2] || ref.Spent != 495 || ref.Left != 5 {
			t.Errorf("refusal %+v, want the team's with 495 spent, 5 left", *ref)
		}
		if got := status(t, s, limits, at); got != "0/0 0/0 495/0" {
			t.Errorf("after a refusal: %s, want nothing reserved anywhere", got)
		}
		r := mustReserve(t, s, "small", limits, 5, at)
		if got := status(t, s, limits, at); got != "0/5 0/5 495/5" {
			t.Errorf("after a reservation: %s", got)
		}
		r.Settle(ctxT(t), 5)
		if got := status(t, s, limits, at); got != "5/0 5/0 500/0" {
			t.Errorf("after its settle: %s", got)
		}
	})
}

func TestSettle(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func(Spender) *Store) {
		s := open(newSpender())
		limits := []Limit{
			{Scope: ScopeKey, ID: 1, Name: "k", Amount: 1000, Period: PeriodDay},
			{Scope: ScopeTeam, ID: 1, Name: "t", Amount: 1000, Period: PeriodTotal},
		}
		less := mustReserve(t, s, "less", limits, 50, at)
		more := mustReserve(t, s, "more", limits, 50, at)
		if got := status(t, s, limits, at); got != "0/100 0/100" {
			t.Fatalf("reserved: %s", got)
		}
		less.Settle(ctxT(t), 30)
		if got := status(t, s, limits, at); got != "30/50 30/50" {
			t.Errorf("after settling less than reserved: %s, want 30/50", got)
		}
		more.Settle(ctxT(t), 80)
		if got := status(t, s, limits, at); got != "110/0 110/0" {
			t.Errorf("after settling more than reserved: %s, want 110/0", got)
		}
		less.Settle(ctxT(t), 500)
		more.Settle(ctxT(t), 500)
		if got := status(t, s, limits, at); got != "110/0 110/0" {
			t.Errorf("after settling twice: %s, want the first settle only", got)
		}
		var none *Reservation
		none.Settle(ctxT(t), 10) // must not panic

		// The same id reserved again replaces its reservation.
		again := mustReserve(t, s, "again", limits, 20, at)
		mustReserve(t, s, "again", limits, 30, at)
		if got := status(t, s, limits, at); got != "110/30 110/30" {
			t.Errorf("after reserving one id twice: %s, want 110/30", got)
		}
		again.Settle(ctxT(t), 25)
		if got := status(t, s, limits, at); got != "135/0 135/0" {
			t.Errorf("after its settle: %s, want 135/0", got)
		}
	})
}

func TestConcurrentReplicas(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func(Spender) *Store) {
		sp := newSpender()
		replicas := []*Store{open(sp), open(sp)}
		limits := []Limit{{Scope: ScopeTeam, ID: 7, Name: "t", Amount: 1000, Period: PeriodMonth}}
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			held    []*Reservation
			refused atomic.Int64
		)
		for i := range 200 {
			wg.Go(func() {
				r, ref, err := replicas[i%2].Reserve(context.Background(), fmt.Sprintf("req-%d", i), limits, 10, time.Minute, at)
				switch {
				case err != nil:
					t.Errorf("req-%d: %v", i, err)
				case ref != nil:
					refused.Add(1)
				default:
					mu.Lock()
					held = append(held, r)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if len(held) != 100 || refused.Load() != 100 {
			t.Fatalf("%d fit and %d were refused, want 100 and 100", len(held), refused.Load())
		}
		for _, r := range held {
			wg.Go(func() { r.Settle(context.Background(), 7) })
		}
		wg.Wait()
		if got := status(t, replicas[1], limits, at); got != "700/0" {
			t.Errorf("after settling each at 7: %s, want 700/0", got)
		}
	})
}

func TestSpentFromSpender(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func(Spender) *Store) {
		sp := newSpender()
		sp.set(ScopeKey, 4, 950)
		s := open(sp)
		day := []Limit{{Scope: ScopeKey, ID: 4, Name: "k", Amount: 1000, Period: PeriodDay}}
		ref := mustRefuse(t, s, "a", day, 60, at)
		if ref.Spent != 950 || ref.Left != 50 {
			t.Errorf("refusal %+v, want 950 spent and 50 left from the Spender", *ref)
		}
		mustReserve(t, s, "b", day, 50, at).Settle(ctxT(t), 50)
		status(t, s, day, at.Add(time.Hour))
		want := []string{"key:4 since 2026-12-06T00:00:00Z"}
		if got := sp.Calls(); !slicesEqual(got, want) {
			t.Errorf("Spender calls %q, want %q: once for the window", got, want)
		}

		// A new day asks again, from its start.
		sp.set(ScopeKey, 4, 0)
		tomorrow := at.Add(24 * time.Hour)
		mustReserve(t, s, "c", day, 500, tomorrow)
		want = append(want, "key:4 since 2026-12-07T00:00:00Z")
		if got := sp.Calls(); !slicesEqual(got, want) {
			t.Errorf("Spender calls %q, want %q", got, want)
		}
		// The old window keeps what it had.
		if got := status(t, s, day, at); got != "1000/0" {
			t.Errorf("yesterday: %s, want 1000/0", got)
		}

		total := []Limit{{Scope: ScopeTeam, ID: 4, Name: "t", Amount: 1000, Period: PeriodTotal}}
		status(t, s, total, at)
		mustReserve(t, s, "d", total, 1, tomorrow.AddDate(1, 0, 0))
		if got := sp.Calls(); len(got) != 3 || got[2] != "team:4 since zero" {
			t.Errorf("Spender calls %q, want one more for the total, since the zero time", got)
		}

		sp.mu.Lock()
		sp.err = errors.New("database is down")
		sp.mu.Unlock()
		month := []Limit{{Scope: ScopePerson, ID: 4, Name: "p", Amount: 1000, Period: PeriodMonth}}
		_, _, err := s.Reserve(ctxT(t), "e", month, 1, time.Minute, at)
		if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "database is down") {
			t.Errorf("Reserve with the Spender failing: %v, want ErrUnavailable with its cause", err)
		}
	})
}

func TestExpiredReservationPurged(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func(Spender) *Store) {
		s := open(newSpender())
		limits := []Limit{{Scope: ScopePerson, ID: 1, Name: "p", Amount: 100, Period: PeriodDay}}
		ctx := ctxT(t)
		lost, _, err := s.Reserve(ctx, "lost", limits, 100, time.Second, at)
		if err != nil || lost == nil {
			t.Fatalf("Reserve: %v, %v", lost, err)
		}
		mustRefuse(t, s, "early", limits, 1, at.Add(999*time.Millisecond))
		if got := status(t, s, limits, at.Add(999*time.Millisecond)); got != "0/100" {
			t.Errorf("before the deadline: %s, want 0/100", got)
		}
		// At the deadline the hold is gone, as if its replica had died.
		if got := status(t, s, limits, at.Add(time.Second)); got != "0/0" {
			t.Errorf("at the deadline: %s, want 0/0", got)
		}
		mustReserve(t, s, "next", limits, 100, at.Add(time.Second))
		// A late settle of the lapsed one still adds its cost and leaves
		// the other's hold alone.
		lost.Settle(ctx, 40)
		if got := status(t, s, limits, at.Add(time.Second)); got != "40/100" {
			t.Errorf("after the late settle: %s, want 40/100", got)
		}
	})
}

func TestZeroAmounts(t *testing.T) {
	forEachStore(t, func(t *testing.T, open func(Spender) *Store) {
		sp := newSpender()
		sp.set(ScopeTeam, 2, 300)
		s := open(sp)
		nothing := []Limit{{Scope: ScopeKey, ID: 1, Name: "free only", Amount: 0, Period: PeriodDay}}
		free := mustReserve(t, s, "free", nothing, 0, at)
		ref := mustRefuse(t, s, "paid", nothing, 1, at)
		if ref.Left != 0 || ref.Spent != 0 {
			t.Errorf("refusal %+v, want nothing left", *ref)
		}
		free.Settle(ctxT(t), 0)
		if got := status(t, s, nothing, at); got != "0/0" {
			t.Errorf("after the free request: %s", got)
		}
		// Overspent (settles cost more than reserved): free still passes,
		// and a negative amount counts as 0.
		over := []Limit{{Scope: ScopeTeam, ID: 2, Name: "t", Amount: 100, Period: PeriodMonth}}
		mustReserve(t, s, "free2", over, 0, at)
		mustReserve(t, s, "negative", over, -5, at)
		if ref := mustRefuse(t, s, "paid2", over, 1, at); ref.Left != 0 || ref.Spent != 300 {
			t.Errorf("refusal %+v, want 300 spent, nothing left", *ref)
		}
	})
}

func slicesEqual(a, b []string) bool {
	return strings.Join(a, "\n") == strings.Join(b, "\n")
}
