package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"moonji/internal/metrics"
	"moonji/internal/testdb"
	"moonji/models"
)

// A stop for an id nobody began waits up to RowWait for its row (another
// replica may not have written it yet), polling the database; a flood of
// made-up ids must not make every one of them do so: past maxRowWaits at
// once, a stop is answered from what the database has now.
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
