package ledger

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"moonji/internal/testdb"
	"moonji/models"
)

func open(t *testing.T) *Ledger {
	t.Helper()
	return openAt(t, "sqlite://"+t.TempDir()+"/l.db")
}

// openAt is a ledger over the database dbURL names (testdb's); before
// runs on the database before the ledger's goroutines start (gorm's
// callbacks may not be registered while the database is in use).
func openAt(t *testing.T, dbURL string, before ...func(*gorm.DB)) *Ledger {
	t.Helper()
	db, err := models.Open(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range before {
		f(db)
	}
	l := New(db, nil)
	t.Cleanup(func() { l.Close(); models.Close(db) })
	return l
}

func row(id string) models.Usage {
	return models.Usage{InferenceID: id, CreatedAt: time.Now().UTC(), Model: "m", Source: "api"}
}

func get(t *testing.T, l *Ledger, id string) *models.Usage {
	t.Helper()
	u, err := models.UsageByID(context.Background(), l.db, id)
	if err != nil {
		t.Fatalf("row %s: %v", id, err)
	}
	return u
}

func TestBeginFinishRecord(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		l := openAt(t, dbURL)
		if err := <-l.Begin(row("inf_1")); err != nil {
			t.Fatal(err)
		}
		if u := get(t, l, "inf_1"); u.Outcome != models.OutcomePending || u.FinishedAt != nil {
			t.Errorf("begun row = %+v", u)
		}
		done := row("inf_1")
		done.Outcome, done.CompletionTokens, done.Status = models.OutcomeSuccess, 12, 200
		l.Finish(done)
		rej := row("inf_2")
		rej.Outcome, rej.Reason = models.OutcomeRejected, "unauthorized"
		l.Record(rej)
		if err := l.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		if u := get(t, l, "inf_1"); u.Outcome != models.OutcomeSuccess || u.CompletionTokens != 12 || u.FinishedAt == nil {
			t.Errorf("finished row = %+v", u)
		}
		if u := get(t, l, "inf_2"); u.Outcome != models.OutcomeRejected || u.FinishedAt == nil {
			t.Errorf("recorded row = %+v", u)
		}
	})
}

// Many concurrent requests: every one gets exactly one final row.
func TestConcurrentRequestsOneRowEach(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		l := openAt(t, dbURL)
		var wg sync.WaitGroup
		for i := 0; i < 500; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				id := fmt.Sprintf("inf_%04d", i)
				begun := l.Begin(row(id))
				r := row(id)
				r.Outcome = models.OutcomeSuccess
				l.Finish(r)
				if err := <-begun; err != nil {
					t.Error(err)
				}
			}(i)
		}
		wg.Wait()
		l.Flush(context.Background())
		var n, pending int64
		l.db.Model(&models.Usage{}).Count(&n)
		l.db.Model(&models.Usage{}).Where("outcome <> ?", models.OutcomeSuccess).Count(&pending)
		if n != 500 || pending != 0 {
			t.Errorf("%d rows, %d not final; want 500 final", n, pending)
		}
	})
}

// One bad row in a batch does not take the others with it.
func TestBadRowDoesNotLoseItsBatch(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		l := openAt(t, dbURL)
		if err := <-l.Begin(row("inf_dup")); err != nil {
			t.Fatal(err)
		}
		// One batch, as the writer would build it, with a taken primary key
		// in the middle.
		mk := func(id string) op {
			r := row(id)
			r.Outcome = models.OutcomePending
			return op{kind: opBegin, row: r, done: make(chan error, 1)}
		}
		batch := []op{mk("inf_a"), mk("inf_dup"), mk("inf_b")}
		l.write(batch, false)
		if err := <-batch[0].done; err != nil {
			t.Errorf("inf_a: %v", err)
		}
		if err := <-batch[1].done; err == nil {
			t.Error("the duplicate row was accepted")
		}
		if err := <-batch[2].done; err != nil {
			t.Errorf("inf_b: %v", err)
		}
		get(t, l, "inf_a")
		get(t, l, "inf_b")
	})
}

func TestCloseDrains(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		db, err := models.Open(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer models.Close(db)
		l := New(db, nil)
		for i := 0; i < 100; i++ {
			r := row(fmt.Sprintf("inf_%d", i))
			r.Outcome = models.OutcomeRejected
			l.Record(r)
		}
		l.Close()
		var n int64
		db.Model(&models.Usage{}).Count(&n)
		if n != 100 {
			t.Errorf("%d rows after Close, want 100", n)
		}
		if err := <-l.Begin(row("late")); err == nil {
			t.Error("Begin after Close reported success")
		}
	})
}

// countStatements counts the INSERT and UPDATE statements run on db.
func countStatements(db *gorm.DB, inserts, updates *atomic.Int64) {
	// The rollup's statements (one per table per batch) are counted apart.
	db.Callback().Create().Before("gorm:create").Register("count_insert", func(db *gorm.DB) {
		if db.Statement.Table == "usages" {
			inserts.Add(1)
		}
	})
	db.Callback().Update().Before("gorm:update").Register("count_update", func(*gorm.DB) { updates.Add(1) })
	// Rows go in as JSON, through Exec (rowsjson.go).
	db.Callback().Raw().Before("gorm:raw").Register("count_raw", func(db *gorm.DB) {
		if strings.HasPrefix(db.Statement.SQL.String(), "INSERT ") && strings.Contains(db.Statement.SQL.String(), " INTO usages ") {
			inserts.Add(1)
		}
	})
}

// A batch costs a few statements, not one per row: multi-row INSERTs for
// pending rows, multi-row upserts for their Finishes. A statement writes at
// most 64 rows on SQLite (sqliteStatementRows) and 32 on PostgreSQL
// (pgStatementRows), whatever their number.
func TestBatchIsAFewStatements(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		inserts, updates := new(atomic.Int64), new(atomic.Int64)
		l := openAt(t, dbURL, func(db *gorm.DB) { countStatements(db, inserts, updates) })
		const n = 100
		want := int64(4) // PostgreSQL: 32 + 32 + 32 + 4
		if l.db.Dialector.Name() == "sqlite" {
			want = 2 // 64 + 36
		}
		var begins, finishes []op
		for i := range n {
			r := row(fmt.Sprintf("inf_%03d", i))
			r.Outcome = models.OutcomePending
			begins = append(begins, op{kind: opBegin, row: r, done: make(chan error, 1)})
			f := row(r.InferenceID)
			f.Outcome, f.Status, f.CompletionTokens, f.Backend = models.OutcomeSuccess, 200, i, "b"
			now := time.Now().UTC()
			f.FinishedAt = &now
			finishes = append(finishes, op{kind: opFinish, row: f})
		}
		l.write(begins, false)
		for _, o := range begins {
			if err := <-o.done; err != nil {
				t.Fatal(err)
			}
		}
		if got := inserts.Load(); got != want {
			t.Errorf("%d INSERT statements for %d pending rows, want %d", got, n, want)
		}
		inserts.Store(0)
		l.write(finishes, false)
		if got, up := inserts.Load(), updates.Load(); got != want || up != 0 {
			t.Errorf("%d upserts and %d UPDATEs for %d finishes, want %d and 0", got, up, n, want)
		}
		var total, final int64
		l.db.Model(&models.Usage{}).Count(&total)
		l.db.Model(&models.Usage{}).Where("outcome = ? AND finished_at IS NOT NULL AND backend = ?", models.OutcomeSuccess, "b").Count(&final)
		if total != n || final != n {
			t.Errorf("%d rows, %d final; want %d final", total, final, n)
		}
		if u := get(t, l, "inf_042"); u.CompletionTokens != 42 || u.Status != 200 || u.Model != "m" {
			t.Errorf("finished row = %+v", u)
		}
		if len(l.begun) != 0 {
			t.Errorf("%d begun ids remembered after their finishes", len(l.begun))
		}
	})
}

// A Finish whose Begin failed must not create a row, nor touch the row that
// made the Begin fail (another request's, with the same id).
func TestFinishAfterFailedBeginCreatesNothing(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		l := openAt(t, dbURL)
		// Someone else's finished row holds the id.
		theirs := row("inf_taken")
		theirs.Outcome, theirs.Status, theirs.CompletionTokens = models.OutcomeSuccess, 200, 7
		l.Record(theirs)
		if err := l.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := <-l.Begin(row("inf_taken")); err == nil {
			t.Fatal("a Begin on a taken id succeeded")
		}
		mine := row("inf_taken")
		mine.Outcome, mine.Status, mine.Reason = models.OutcomeError, 500, "internal_error"
		l.Finish(mine)
		// A Finish whose Begin never reached the database at all.
		ghost := row("inf_ghost")
		ghost.Outcome = models.OutcomeSuccess
		l.Finish(ghost)
		if err := l.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		if _, err := models.UsageByID(context.Background(), l.db, "inf_ghost"); err == nil {
			t.Error("a Finish without a committed Begin created a row")
		}
		// The plain UPDATE path still finishes the row with that id: the same
		// as before batching. What matters is that no upsert ran for it.
		var n int64
		l.db.Model(&models.Usage{}).Count(&n)
		if n != 1 {
			t.Errorf("%d rows, want 1", n)
		}
	})
}

// A failing upsert batch falls back to row-by-row UPDATEs.
func TestFinishBatchFallsBack(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		l := openAt(t, dbURL)
		for _, id := range []string{"inf_x", "inf_y"} {
			if err := <-l.Begin(row(id)); err != nil {
				t.Fatal(err)
			}
		}
		// The database refuses every multi-row upsert.
		l.db.Callback().Create().Before("gorm:create").Register("refuse_batches", func(tx *gorm.DB) {
			if rows, ok := tx.Statement.Dest.(*[]models.Usage); ok && len(*rows) > 1 {
				tx.AddError(errors.New("refused"))
			}
		})
		var batch []op
		for _, id := range []string{"inf_x", "inf_y"} {
			f := row(id)
			f.Outcome, f.Status = models.OutcomeSuccess, 200
			batch = append(batch, op{kind: opFinish, row: f})
		}
		l.write(batch, false)
		for _, id := range []string{"inf_x", "inf_y"} {
			if u := get(t, l, id); u.Outcome != models.OutcomeSuccess || u.Status != 200 {
				t.Errorf("%s = %+v", id, u)
			}
		}
	})
}

// Rows nobody waits for are held open briefly and committed together with
// what follows; a Begin ends the wait at once.
func TestLingerGroupsRows(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		l := openAt(t, dbURL)
		var mu sync.Mutex
		var commits, rows int
		l.OnWrite(func(n int, _ time.Duration, _ error) { mu.Lock(); commits++; rows += n; mu.Unlock() })
		rej := row("inf_rej")
		rej.Outcome = models.OutcomeRejected
		l.Record(rej)
		start := time.Now()
		if err := <-l.Begin(row("inf_begun")); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		mu.Lock()
		defer mu.Unlock()
		if commits != 1 || rows != 2 {
			t.Errorf("%d commits of %d rows, want the Record and the Begin in one", commits, rows)
		}
		if took > time.Second {
			t.Errorf("the Begin waited %v", took)
		}
	})
}

// TestScratchBetweenBatches: store's working storage, kept from one batch
// to the next, holds no row of the last batch, and a burst's batch of more
// than scratchRows rows is let go once written; the batches after either
// are written whole.
func TestScratchBetweenBatches(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		l := openAt(t, dbURL)
		var burst []op
		for i := range scratchRows + 1 {
			burst = append(burst, op{kind: opRecord, row: row(fmt.Sprintf("burst-%d", i))})
		}
		l.write(burst, false)
		sc := l.scratch
		if cap(sc.plan.inserts) != 0 || len(sc.final) != 0 || len(sc.merged) != 0 {
			t.Fatalf("after a batch of %d rows the scratch kept room for %d rows", len(burst), cap(sc.plan.inserts))
		}
		l.write([]op{{kind: opBegin, row: row("small-1")}, {kind: opFinish, row: row("small-1")}, {kind: opRecord, row: row("small-2")}}, false)
		sc = l.scratch
		if cap(sc.plan.inserts) == 0 {
			t.Fatal("a small batch's room was not kept")
		}
		for _, u := range sc.plan.inserts[:cap(sc.plan.inserts)] {
			if u.InferenceID != "" {
				t.Fatalf("the scratch still holds row %s after its batch", u.InferenceID)
			}
		}
		if len(sc.final) != 0 || len(sc.merged) != 0 {
			t.Fatalf("the scratch's maps hold %d and %d ids after their batch", len(sc.final), len(sc.merged))
		}
		l.write([]op{{kind: opRecord, row: row("after-1")}, {kind: opRecord, row: row("after-2")}}, false)
		for _, id := range []string{"burst-0", fmt.Sprintf("burst-%d", scratchRows), "small-1", "small-2", "after-1", "after-2"} {
			if got := get(t, l, id); got.InferenceID != id {
				t.Errorf("row %s not written", id)
			}
		}
	})
}
