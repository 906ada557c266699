package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"moonji/internal/metrics"
	"moonji/internal/stop"
	"moonji/internal/testdb"
	"moonji/models"
)

// A stop that no replica takes waits up to RowWait for its row (a replica
// cut off from the bus may not have written it yet, and a 404 must take as
// long as someone else's), polling the database; a flood of made-up ids
// must not make every one of them do so: past maxRowWaits at once, a stop
// is answered from what the database has now.
func TestStopWaitsAreBounded(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		db, err := models.Open(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer models.Close(db)
		s := &Stopper{DB: db, Metrics: metrics.New(nil, nil), RowWait: time.Second}
		const flood = 4 * maxRowWaits
		// The number of stops waiting at once, sampled while they run
		// (timing would measure the database's connection storm, not the
		// waits: under -race a first query can take a second).
		var peak int64
		done := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			for {
				peak = max(peak, s.waiting.Load())
				select {
				case <-done:
					return
				case <-time.After(time.Millisecond):
				}
			}
		}()
		var wg sync.WaitGroup
		for i := range flood {
			wg.Go(func() {
				_, err := s.Stop(context.Background(), Principal{UserID: 1}, fmt.Sprintf("inf_madeup%03d", i), -1)
				if !errors.Is(err, ErrNotFound) {
					t.Errorf("made-up id %d: %v", i, err)
				}
			})
		}
		wg.Wait()
		close(done)
		<-sampled
		if peak > maxRowWaits || peak == 0 {
			t.Errorf("%d stops for made-up ids waited for a row at once; want between 1 and %d", peak, maxRowWaits)
		}
		if s.waiting.Load() != 0 {
			t.Errorf("waiting = %d after every stop returned", s.waiting.Load())
		}
	})
}

// stopPair is two replicas' stop services on one in-process bus, and a
// Stopper on the second: a stop through B of what A runs.
type stopPair struct {
	a, b *stop.Service
	s    *Stopper
}

func newStopPair(t *testing.T, db *gorm.DB, rowWait time.Duration) *stopPair {
	t.Helper()
	bus := stop.NewLocalBus()
	p := &stopPair{}
	for i, name := range []string{"A", "B"} {
		h := stop.NewHolder(0)
		svc := stop.NewService(h, bus, stop.Options{ReplicaID: name, AckTimeout: 5 * time.Second})
		if err := svc.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { svc.Close(); h.Close() })
		if i == 0 {
			p.a = svc
		} else {
			p.b = svc
		}
	}
	t.Cleanup(func() { _ = bus.Close() })
	p.s = &Stopper{DB: db, Stops: p.b, Metrics: metrics.New(nil, nil), RowWait: rowWait}
	return p
}

// pairRun is a request A runs.
type pairRun struct {
	*stop.Run
	ended chan struct{}
	seen  int // the stop's seen count, read as the gateway does (-1: none)
}

// run begins id on A for person owner; when stopped, it ends its stream,
// acknowledges and ends as the gateway does.
func (p *stopPair) run(id string, owner uint) *pairRun {
	r := &pairRun{ended: make(chan struct{}), seen: -1}
	var once sync.Once
	r.Run = p.a.BeginFresh(id, owner, func() {
		once.Do(func() {
			go func() {
				if n, ok := r.Seen(); ok {
					r.seen = n
				}
				r.Ack()
				r.EndWith(models.OutcomeStopped)
				close(r.ended)
			}()
		})
	})
	return r
}

// A stop through another replica of a request whose row is nowhere yet (its
// replica writes it 500 ms after the start) is decided by the replica that
// runs it: no row is read. Someone else's stop, of the same request or of a
// finished one whose row is stored, is answered exactly like a stop of an
// id nobody knows: not found, once RowWait is over.
func TestStopIsDecidedByTheRunningReplica(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		db, err := models.Open(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer models.Close(db)
		const rowWait = 300 * time.Millisecond
		p := newStopPair(t, db, rowWait)
		ctx := context.Background()
		alice, bob := Principal{UserID: 7}, Principal{UserID: 8}

		run := p.run("inf_young", alice.UserID)
		for _, c := range []struct {
			name string
			id   string
		}{{"bob's stop of alice's running request", "inf_young"}, {"a stop of an unknown id", "inf_nobody"}} {
			start := time.Now()
			_, err := p.s.Stop(ctx, bob, c.id, -1)
			if took := time.Since(start); !errors.Is(err, ErrNotFound) || took < rowWait {
				t.Errorf("%s: %v after %v; want not found, after RowWait (%v)", c.name, err, took, rowWait)
			}
		}
		if run.Stopped() {
			t.Fatal("bob's stop stopped alice's request")
		}

		reads := p.s.rowReads.Load()
		res, err := p.s.Stop(ctx, alice, "inf_young", 3)
		if err != nil || res.State != models.OutcomeStopped || !res.Acknowledged {
			t.Fatalf("alice's stop: %+v, %v; want stopped and acknowledged", res, err)
		}
		<-run.ended
		if run.seen != 3 {
			t.Errorf("seen = %d; want alice's 3", run.seen)
		}
		// Once ended, its replica still answers for it from memory.
		res, err = p.s.Stop(ctx, alice, "inf_young", -1)
		if err != nil || res.State != models.OutcomeStopped || !res.Acknowledged {
			t.Fatalf("alice's second stop: %+v, %v; want stopped", res, err)
		}
		if got := p.s.rowReads.Load() - reads; got != 0 {
			t.Errorf("the owner's stops read the row %d times; the running replica decides", got)
		}

		// A request finished long ago: only its stored row knows it.
		uid := alice.UserID
		if err := db.Create(&models.Usage{InferenceID: "inf_old", UserID: &uid, Outcome: models.OutcomeSuccess, CreatedAt: time.Now()}).Error; err != nil {
			t.Fatal(err)
		}
		res, err = p.s.Stop(ctx, alice, "inf_old", -1)
		if err != nil || res.State != models.OutcomeSuccess || !res.Acknowledged {
			t.Fatalf("alice's stop of her finished request: %+v, %v; want its outcome", res, err)
		}
		start := time.Now()
		_, err = p.s.Stop(ctx, bob, "inf_old", -1)
		if took := time.Since(start); !errors.Is(err, ErrNotFound) || took < rowWait {
			t.Errorf("bob's stop of alice's finished request: %v after %v; want not found, after RowWait", err, took)
		}

		// An administrator stops anyone's.
		run = p.run("inf_bobs", bob.UserID)
		res, err = p.s.Stop(ctx, Principal{UserID: 1, Admin: true}, "inf_bobs", -1)
		if err != nil || res.State != models.OutcomeStopped || !run.Stopped() {
			t.Fatalf("an administrator's stop: %+v, %v", res, err)
		}
		<-run.ended
	})
}
