package ledger

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"moonji/models"
)

func open(t *testing.T) *Ledger {
	t.Helper()
	db, err := models.Open("sqlite://" + t.TempDir() + "/l.db")
	if err != nil {
		t.Fatal(err)
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
	l := open(t)
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
}

// Many concurrent requests: every one gets exactly one final row.
func TestConcurrentRequestsOneRowEach(t *testing.T) {
	l := open(t)
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
}

// One bad row in a batch does not take the others with it.
func TestBadRowDoesNotLoseItsBatch(t *testing.T) {
	l := open(t)
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
	l.write(batch)
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
}

func TestCloseDrains(t *testing.T) {
	db, err := models.Open("sqlite://" + t.TempDir() + "/l.db")
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
}
