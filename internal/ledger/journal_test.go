package ledger

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"moonji/internal/journal"
	"moonji/internal/testdb"
	"moonji/models"
)

// openJournaled is a ledger over the database dbURL names whose Begins go
// to a real journal, with pending rows deferred by after.
func openJournaled(t *testing.T, dbURL string, after time.Duration) (*Ledger, *journal.Journal, string) {
	t.Helper()
	l := openAt(t, dbURL)
	dir := t.TempDir()
	j, left, err := journal.Open(dir, "replica-a", nil)
	if err != nil || len(left) != 0 {
		t.Fatalf("journal: %v %v", left, err)
	}
	t.Cleanup(func() { j.Close() })
	l.UseJournal(j, after)
	return l, j, dir
}

func count(t *testing.T, l *Ledger) int64 {
	t.Helper()
	var n int64
	if err := l.db.Model(&models.Usage{}).Count(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// With a journal, Begin is safe at once (no database wait); a request that
// ends before pendingAfter is one final insert, never a pending row, and
// Running knows it meanwhile.
func TestJournaledShortRequestIsOneInsert(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		l, j, _ := openJournaled(t, dbURL, time.Hour)
		var statements, rows int
		var mu sync.Mutex
		l.OnWrite(func(n int, _ time.Duration, _ error) { mu.Lock(); statements++; rows += n; mu.Unlock() })
		uid := uint(3)
		r := row("short")
		r.UserID = &uid
		select {
		case err := <-l.Begin(r):
			if err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatal("a journaled Begin made its caller wait")
		}
		if u, ok := l.Running("short"); !ok || *u.UserID != 3 || u.Outcome != models.OutcomePending {
			t.Errorf("Running = %+v %v", u, ok)
		}
		if j.Open() != 1 {
			t.Errorf("journal open = %d", j.Open())
		}
		// A row queued after the Begin is written in the Begin's batch or a
		// later one, and the pending row stays deferred all the same.
		other := row("other")
		other.Outcome = models.OutcomeRejected
		l.Record(other)
		waitUntil(t, "the other row, written", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return rows == 1
		})
		if n := count(t, l); n != 1 {
			t.Fatalf("%d rows before the Finish; the pending row should wait", n)
		}
		done := r
		done.Outcome, done.Status, done.CompletionTokens = models.OutcomeSuccess, 200, 5
		l.Finish(done)
		// The row is visible once committed; the writer's bookkeeping (the
		// journal, Running, OnWrite, in that order) follows the commit.
		waitUntil(t, "the final row, written", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return rows > 1 && count(t, l) == 2
		})
		if u := get(t, l, "short"); u.Outcome != models.OutcomeSuccess || u.CompletionTokens != 5 {
			t.Errorf("row = %+v", u)
		}
		mu.Lock()
		if rows != 2 {
			t.Errorf("%d rows written for one request and one rejection, want one final insert each", rows)
		}
		mu.Unlock()
		if _, ok := l.Running("short"); ok {
			t.Error("Running still knows a written row")
		}
		if j.Open() != 0 {
			t.Errorf("journal open = %d after the row was written", j.Open())
		}
	})
}

// A request still running pendingAfter later gets its pending row then, and
// its Finish updates it.
func TestJournaledLongRequestGetsItsPendingRow(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		l, j, _ := openJournaled(t, dbURL, 50*time.Millisecond)
		if err := <-l.Begin(row("long")); err != nil {
			t.Fatal(err)
		}
		// The journal learns the row is written just after its commit.
		waitUntil(t, "the pending row, and the journal closing its record", func() bool { return count(t, l) == 1 && j.Open() == 0 })
		if u := get(t, l, "long"); u.Outcome != models.OutcomePending {
			t.Errorf("row = %+v", u)
		}
		done := row("long")
		done.Outcome, done.Status = models.OutcomeStopped, 200
		l.Finish(done)
		if err := l.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		if u := get(t, l, "long"); u.Outcome != models.OutcomeStopped || u.FinishedAt == nil {
			t.Errorf("row = %+v", u)
		}
		if n := count(t, l); n != 1 {
			t.Errorf("%d rows", n)
		}
	})
}

// Flush and Close write the deferred Begins as pending rows.
func TestFlushAndCloseWriteDeferredRows(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		l, _, _ := openJournaled(t, dbURL, time.Hour)
		<-l.Begin(row("a"))
		if err := l.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		if u := get(t, l, "a"); u.Outcome != models.OutcomePending {
			t.Errorf("after Flush: %+v", u)
		}
		<-l.Begin(row("b"))
		l.Close()
		if u := get(t, l, "b"); u.Outcome != models.OutcomePending {
			t.Errorf("after Close: %+v", u)
		}
	})
}

// Many requests at once, short and long: one row each, the right one. The
// short ones finish at once (one final insert each); the long ones once
// their pending row is written, which their Finish then updates.
func TestJournaledManyRequests(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		l, j, _ := openJournaled(t, dbURL, 20*time.Millisecond)
		const n = 400
		long := make(chan struct{})
		var wg, begun sync.WaitGroup
		begun.Add(n)
		for i := range n {
			wg.Go(func() {
				r := row(fmt.Sprintf("r%03d", i))
				if err := <-l.Begin(r); err != nil {
					t.Error(err)
				}
				begun.Done()
				if i%2 == 1 {
					<-long
				}
				r.Outcome, r.CompletionTokens = models.OutcomeSuccess, i
				l.Finish(r)
			})
		}
		begun.Wait()
		waitUntil(t, "the long requests' pending rows, written", func() bool {
			for i := 1; i < n; i += 2 {
				if _, ok := l.Running(fmt.Sprintf("r%03d", i)); ok {
					return false
				}
			}
			return true
		})
		close(long)
		wg.Wait()
		if err := l.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		if c := count(t, l); c != n {
			t.Fatalf("%d rows for %d requests", c, n)
		}
		for i := range n {
			if u := get(t, l, fmt.Sprintf("r%03d", i)); u.Outcome != models.OutcomeSuccess || u.CompletionTokens != i {
				t.Fatalf("r%03d = %+v", i, u)
			}
		}
		if j.Open() != 0 {
			t.Errorf("journal open = %d", j.Open())
		}
		if len(l.running) != 0 {
			t.Errorf("running = %d", len(l.running))
		}
	})
}

// A journal that cannot write makes Begin wait for the database, as
// without one: the row is never only in memory.
func TestJournalFailureFallsBackToTheDatabase(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		l := openAt(t, dbURL)
		l.UseJournal(failingJournal{}, time.Hour)
		if err := <-l.Begin(row("x")); err != nil {
			t.Fatal(err)
		}
		if u := get(t, l, "x"); u.Outcome != models.OutcomePending {
			t.Errorf("row = %+v", u)
		}
	})
}

type failingJournal struct{}

func (failingJournal) Begin(*models.Usage) error { return errors.New("disk full") }
func (failingJournal) Durable(...string)         {}
func (failingJournal) Final(*models.Usage) error { return errors.New("disk full") }
func (failingJournal) Finals(func([]models.Usage) error) error {
	return nil
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
