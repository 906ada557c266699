package ledger

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"moonji/models"
)

// While the database cannot be reached, no row is lost and none is logged as
// lost: every row is in the journal already (a Begin) or is put there (a
// final row, as an F record), the writer keeps up to MaxBacklog final rows
// in memory besides, and it tries the database again with back-off (250 ms
// doubling to 5 s). Once a ping passes it writes what it holds, then reads
// the final rows that were only in the journal back from it, and goes back
// to committing batches. The writer keeps taking rows meanwhile, so no
// request waits on the database.
//
// Writing them back is idempotent: a commit whose acknowledgement was lost
// may have happened, and a pending row of before the outage may be in the
// database. So each chunk first reads which of its rows the database has:
// a missing one is inserted (final or pending), a final row whose pending
// row is there updates it (WHERE outcome = 'pending', counted in the rollup
// only when it changed a row), and one already final is left alone — every
// request ends with exactly one row.

// MaxBacklog is the most final rows the writer keeps in memory while the
// database is away (~500 bytes each: ~5 MB); beyond it they are only in the
// journal and are read back from it. Pending rows of running requests are
// kept besides, as many as there are requests running.
const MaxBacklog = 10_000

// ErrDatabaseDown answers a Flush (or a Begin waiting for its commit) while
// the database is unreachable; the rows are kept and written once it is back.
var ErrDatabaseDown = errors.New("ledger: database unreachable; rows kept and retried")

// Back-off between tries of an unreachable database.
const (
	retryFirst = 250 * time.Millisecond
	retryMax   = 5 * time.Second
	pingWait   = 2 * time.Second
)

// outage is the writer's state while the database is away; the writer's
// goroutine alone touches it, except the atomics that Status reads.
type outage struct {
	down    bool
	retryAt time.Time
	wait    time.Duration
	// rows are the rows held, by inference id: pending rows of running
	// requests and up to max final rows.
	rows   map[string]models.Usage
	finals int
	max    atomic.Int64 // MaxBacklog, or SetMaxBacklog's
	// inJournal counts the final rows not held: only the journal has them.
	inJournal int
	// ready, when set, must succeed before the held rows are written.
	ready func() error

	since         atomic.Int64 // unix nanoseconds the outage began; 0 when up
	held, journal atomic.Int64 // len(rows), inJournal, for Status
}

// Status is what the ledger tells /readyz and the metrics.
type Status struct {
	// DatabaseDown is set while the writer cannot reach the database.
	DatabaseDown bool
	Since        time.Time
	// Backlog is how many rows the writer holds in memory for the database
	// (at most MaxBacklog final rows, and the pending rows of running
	// requests); InJournal how many final rows only the journal holds.
	Backlog, InJournal int64
}

// Status returns the writer's view of the database.
func (l *Ledger) Status() Status {
	st := Status{Backlog: l.out.held.Load(), InJournal: l.out.journal.Load()}
	if ns := l.out.since.Load(); ns != 0 {
		st.DatabaseDown, st.Since = true, time.Unix(0, ns).UTC()
	}
	return st
}

// SetMaxBacklog changes MaxBacklog (tests).
func (l *Ledger) SetMaxBacklog(n int) { l.out.max.Store(int64(n)) }

// CommitWait is the longest a commit may take before the writer gives up
// on it and asks whether the database is still there. A group commit takes
// milliseconds; a database that needs more than this is as good as away,
// and its rows are kept in the journal and retried.
const CommitWait = 15 * time.Second

// SetCommitWait changes CommitWait (tests).
func (l *Ledger) SetCommitWait(d time.Duration) { l.commitWait.Store(int64(d)) }

// StartDown makes the writer begin as in an outage: it holds every row,
// and before it writes any it calls ready (until ready succeeds, retried
// with the same back-off), on its own goroutine. A server that starts while
// the database is away closes its previous life's rows that way, before
// this life's. Call it before the first Begin.
func (l *Ledger) StartDown(ready func() error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if !l.closed {
		l.send(op{kind: opDown, ready: ready})
	}
}

func (l *Ledger) startDown(ready func() error) {
	l.goDown(errors.New("unreachable at start"))
	l.out.ready = ready
	l.out.retryAt = time.Now() // the first try at once
}

// reachable reports whether the database answers a ping.
func (l *Ledger) reachable() bool {
	sqlDB, err := l.db.DB()
	if err != nil {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), pingWait)
	defer cancel()
	return sqlDB.PingContext(ctx) == nil
}

// goDown starts an outage.
func (l *Ledger) goDown(err error) {
	o := &l.out
	o.down, o.wait = true, retryFirst
	o.retryAt = time.Now().Add(o.wait)
	if o.rows == nil {
		o.rows = map[string]models.Usage{}
	}
	o.since.Store(time.Now().UnixNano())
	l.log.Error("database unreachable: usage rows are kept in the journal and retried", "err", err)
}

// hold keeps a plan's rows for when the database is back. Its final rows
// go to the journal too.
func (l *Ledger) hold(p *plan) {
	o := &l.out
	for i := range p.inserts {
		if p.inserts[i].Outcome == models.OutcomePending {
			if _, ok := o.rows[p.inserts[i].InferenceID]; !ok {
				o.rows[p.inserts[i].InferenceID] = p.inserts[i]
			}
			continue
		}
		l.holdFinal(p.inserts[i])
	}
	for _, rows := range [][]models.Usage{p.upserts, p.updates} {
		for i := range rows {
			l.holdFinal(rows[i])
		}
	}
	o.held.Store(int64(len(o.rows)))
	o.journal.Store(int64(o.inJournal))
}

func (l *Ledger) holdFinal(u models.Usage) {
	o := &l.out
	journaled := false
	if l.journal != nil {
		if err := l.journal.Final(&u); err != nil {
			l.log.Warn("journal: write a final usage row; it is kept in memory", "inference_id", u.InferenceID, "err", err)
		} else {
			journaled = true
		}
	}
	prev, had := o.rows[u.InferenceID]
	if had && prev.Outcome != models.OutcomePending {
		return // final already: the first end stands
	}
	if journaled && int64(o.finals) >= o.max.Load() {
		// Only in the journal now: Finals reads it back.
		delete(o.rows, u.InferenceID)
		o.inJournal++
		return
	}
	o.rows[u.InferenceID] = u
	o.finals++
}

// retry tries the database again when it is time, and writes what was held
// once it answers.
func (l *Ledger) retry(now time.Time, force bool) {
	o := &l.out
	if !force && now.Before(o.retryAt) {
		return
	}
	if err := l.recover(); err != nil {
		o.wait = min(o.wait*2, retryMax)
		o.retryAt = time.Now().Add(o.wait)
		return
	}
	l.log.Warn("database back: the usage rows kept meanwhile are written", "down_for", time.Since(time.Unix(0, o.since.Load())).Round(time.Millisecond).String())
	o.down = false
	o.rows = nil // let a large map go
	o.finals, o.inJournal = 0, 0
	o.held.Store(0)
	o.journal.Store(0)
	o.since.Store(0)
}

// recover writes the held rows, then the final rows only the journal has.
func (l *Ledger) recover() error {
	o := &l.out
	if !l.reachable() {
		return ErrDatabaseDown
	}
	if o.ready != nil {
		if err := o.ready(); err != nil {
			l.log.Warn("database answers, not ready yet: usage rows still held", "err", err)
			return err
		}
		o.ready = nil
	}
	chunk := make([]models.Usage, 0, maxBatch)
	for len(o.rows) > 0 {
		chunk = chunk[:0]
		for _, u := range o.rows {
			chunk = append(chunk, u)
			if len(chunk) == maxBatch {
				break
			}
		}
		if err := l.replay(chunk); err != nil {
			return err
		}
		for i := range chunk {
			if chunk[i].Outcome != models.OutcomePending {
				o.finals--
			}
			delete(o.rows, chunk[i].InferenceID)
		}
		o.held.Store(int64(len(o.rows)))
	}
	if o.inJournal == 0 || l.journal == nil {
		return nil
	}
	err := l.journal.Finals(func(rows []models.Usage) error {
		for len(rows) > 0 {
			n := min(len(rows), maxBatch)
			if err := l.replay(rows[:n]); err != nil {
				return err
			}
			rows = rows[n:]
		}
		return nil
	})
	if err != nil {
		return err
	}
	return nil
}

// replay writes rows held through an outage, each once whatever the
// database already has (see the top of this file).
func (l *Ledger) replay(rows []models.Usage) error {
	ids := make([]string, len(rows))
	for i := range rows {
		ids[i] = rows[i].InferenceID
	}
	var have []struct {
		InferenceID string
		Outcome     string
	}
	if err := l.db.Model(&models.Usage{}).Select("inference_id", "outcome").Where("inference_id IN ?", ids).
		Find(&have).Error; err != nil {
		return fmt.Errorf("read which held usage rows are written: %w", err)
	}
	outcome := make(map[string]string, len(have))
	for _, h := range have {
		outcome[h.InferenceID] = h.Outcome
	}
	var p plan
	var pending []string // rows whose pending row is in the database after this
	for i := range rows {
		u := rows[i]
		was, ok := outcome[u.InferenceID]
		switch {
		case !ok:
			p.inserts = append(p.inserts, u)
			if u.Outcome == models.OutcomePending {
				pending = append(pending, u.InferenceID)
			}
		case u.Outcome == models.OutcomePending:
			if was == models.OutcomePending {
				pending = append(pending, u.InferenceID)
			}
		case was == models.OutcomePending:
			p.updates = append(p.updates, u)
		}
	}
	if p.rows() > 0 {
		if err := l.commit(&p); err != nil {
			return fmt.Errorf("write %d held usage rows: %w", p.rows(), err)
		}
	}
	for _, id := range pending {
		l.begun[id] = true
	}
	if l.journal != nil {
		l.journal.Durable(ids...)
		l.runMu.Lock()
		for _, id := range ids {
			delete(l.running, id)
		}
		l.runMu.Unlock()
	}
	if l.onWrite != nil {
		l.onWrite(len(rows), 0, nil)
	}
	return nil
}
