// Package ledger writes the usage ledger: exactly one row per inference
// request. Writes go through one goroutine that commits whatever has queued
// up in a single transaction (group commit), so that no request waits on the
// database on its token path and a burst of requests costs a few commits.
package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"gorm.io/gorm"

	"moonji/models"
)

// maxBatch bounds one transaction, so a backlog is drained in steps.
const maxBatch = 512

type opKind int

const (
	opBegin  opKind = iota // insert a pending row
	opFinish               // update a pending row to its final state
	opRecord               // insert a row that is already final (rejections)
)

type op struct {
	kind opKind
	row  models.Usage
	done chan error // nil when nobody waits
}

// Ledger is the asynchronous writer of usage rows.
type Ledger struct {
	db      *gorm.DB
	ops     chan op
	log     *slog.Logger
	wg      sync.WaitGroup
	mu      sync.RWMutex
	closed  bool
	onWrite func(rows int, took time.Duration, err error)
}

// New starts a ledger writing to db. Call Close to flush and stop it.
func New(db *gorm.DB, log *slog.Logger) *Ledger {
	if log == nil {
		log = slog.Default()
	}
	l := &Ledger{db: db, ops: make(chan op, 8192), log: log}
	l.wg.Add(1)
	go l.run()
	return l
}

// Begin queues the insertion of a pending row and returns a channel that
// receives the write's result. The row must be durable before its inference
// id is shown to anyone, so callers wait on it before sending the response
// headers — usually long after it has been written, since the upstream call
// runs meanwhile.
func (l *Ledger) Begin(row models.Usage) <-chan error {
	row.Outcome = models.OutcomePending
	done := make(chan error, 1)
	l.enqueue(op{kind: opBegin, row: row, done: done})
	return done
}

// Finish queues the final state of a row started with Begin.
func (l *Ledger) Finish(row models.Usage) {
	now := time.Now().UTC()
	row.FinishedAt = &now
	l.enqueue(op{kind: opFinish, row: row})
}

// Record queues a row that is final from the start, such as a rejection.
func (l *Ledger) Record(row models.Usage) {
	now := time.Now().UTC()
	row.FinishedAt = &now
	l.enqueue(op{kind: opRecord, row: row})
}

func (l *Ledger) enqueue(o op) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		err := errors.New("ledger closed")
		l.log.Error("usage row dropped: ledger closed", "inference_id", o.row.InferenceID)
		if o.done != nil {
			o.done <- err
		}
		return
	}
	l.ops <- o
}

// Flush waits until everything queued before the call is written.
func (l *Ledger) Flush(ctx context.Context) error {
	done := make(chan error, 1)
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return nil
	}
	l.ops <- op{kind: -1, done: done}
	l.mu.RUnlock()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close writes everything queued and stops the writer.
func (l *Ledger) Close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	close(l.ops)
	l.mu.Unlock()
	l.wg.Wait()
}

// OnWrite registers a hook called after every batch (for metrics).
func (l *Ledger) OnWrite(fn func(rows int, took time.Duration, err error)) { l.onWrite = fn }

func (l *Ledger) run() {
	defer l.wg.Done()
	batch := make([]op, 0, maxBatch)
	for first := range l.ops {
		batch = append(batch[:0], first)
	drain:
		for len(batch) < maxBatch {
			select {
			case o, ok := <-l.ops:
				if !ok {
					break drain
				}
				batch = append(batch, o)
			default:
				break drain
			}
		}
		l.write(batch)
	}
}

// write commits one batch. A Begin and Finish of the same row in one batch
// become a single insert of the final row.
func (l *Ledger) write(batch []op) {
	start := time.Now()
	final := make(map[string]int, len(batch)) // inference id → index of its Finish
	for i, o := range batch {
		if o.kind == opFinish {
			final[o.row.InferenceID] = i
		}
	}
	var inserts []models.Usage
	var updates []models.Usage
	merged := make(map[string]bool)
	for _, o := range batch {
		switch o.kind {
		case opBegin:
			if i, ok := final[o.row.InferenceID]; ok {
				inserts = append(inserts, batch[i].row)
				merged[o.row.InferenceID] = true
			} else {
				inserts = append(inserts, o.row)
			}
		case opRecord:
			inserts = append(inserts, o.row)
		case opFinish:
			if !merged[o.row.InferenceID] {
				updates = append(updates, o.row)
			}
		}
	}
	err := l.commit(inserts, updates)
	var failed map[string]error // per row, when the batch had to be split
	if err != nil && len(inserts)+len(updates) > 1 {
		failed = map[string]error{}
		// One bad row must not cost the others theirs: write them one by
		// one, so that only the row that fails is lost (and logged).
		l.log.Warn("usage batch failed; writing rows one by one", "rows", len(inserts)+len(updates), "err", err)
		err = nil
		for i := range inserts {
			if e := l.commit(inserts[i:i+1], nil); e != nil {
				l.log.Error("usage row lost", "inference_id", inserts[i].InferenceID, "err", e)
				failed[inserts[i].InferenceID] = e
			}
		}
		for i := range updates {
			if e := l.commit(nil, updates[i:i+1]); e != nil {
				l.log.Error("usage row not finished", "inference_id", updates[i].InferenceID, "err", e)
				failed[updates[i].InferenceID] = e
			}
		}
	}
	if err != nil && failed == nil {
		l.log.Error("usage row lost", "rows", len(inserts)+len(updates), "err", err)
	}
	for _, o := range batch {
		if o.done == nil {
			continue
		}
		if failed != nil {
			o.done <- failed[o.row.InferenceID]
		} else {
			o.done <- err
		}
	}
	if l.onWrite != nil {
		l.onWrite(len(inserts)+len(updates), time.Since(start), err)
	}
}

// commit writes inserts and updates in one transaction.
func (l *Ledger) commit(inserts, updates []models.Usage) error {
	return l.db.Transaction(func(tx *gorm.DB) error {
		if len(inserts) > 0 {
			if err := tx.CreateInBatches(inserts, 100).Error; err != nil {
				return fmt.Errorf("insert %d usage rows: %w", len(inserts), err)
			}
		}
		for i := range updates {
			u := &updates[i]
			err := tx.Model(&models.Usage{}).Where("inference_id = ?", u.InferenceID).
				Select("FinishedAt", "Outcome", "Status", "Reason", "PromptTokens", "CompletionTokens",
					"UsageSource", "QueueMs", "TTFTMs", "DurationMs", "Backend").
				Updates(u).Error
			if err != nil {
				return fmt.Errorf("finish usage row %s: %w", u.InferenceID, err)
			}
		}
		return nil
	})
}
