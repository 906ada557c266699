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
	"gorm.io/gorm/clause"

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
	db       *gorm.DB
	begun    map[string]bool // ids whose pending row this writer committed, until their Finish
	ops      chan op
	log      *slog.Logger
	wg       sync.WaitGroup
	mu       sync.RWMutex
	closed   bool
	stopCkpt chan struct{}
	kickCkpt chan struct{} // SQLite only: asks for a checkpoint
	commits  int
	onWrite  func(rows int, took time.Duration, err error)
}

// New starts a ledger writing to db. Call Close to flush and stop it.
func New(db *gorm.DB, log *slog.Logger) *Ledger {
	if log == nil {
		log = slog.Default()
	}
	l := &Ledger{db: db, ops: make(chan op, 8192), log: log, begun: map[string]bool{}, stopCkpt: make(chan struct{})}
	l.wg.Add(1)
	go l.run()
	if db.Dialector.Name() == "sqlite" {
		l.kickCkpt = make(chan struct{}, 1)
		l.wg.Add(1)
		go l.checkpoints()
	}
	return l
}

// The WAL is copied back into the SQLite database file by a goroutine of
// its own (PASSIVE: it never blocks the writer), after every checkpointAfter
// commits and at least every checkpointEvery. SQLite would otherwise do it
// inside whichever commit crosses wal_autocheckpoint pages — the ledger
// writer's, with an fsync of the WAL and of the database file — and every
// request waiting for its pending row would wait for that too. models.Open
// raises wal_autocheckpoint to 10000 pages, so SQLite's own checkpoint is
// only a safety net for when this one falls behind (or for a process without
// a ledger, such as the CLI). A commit touches about 7 pages (the row and its
// indexes), so a checkpoint copies a few hundred.
const (
	checkpointAfter = 64
	checkpointEvery = time.Second
)

func (l *Ledger) checkpoints() {
	defer l.wg.Done()
	t := time.NewTicker(checkpointEvery)
	defer t.Stop()
	for {
		select {
		case <-l.stopCkpt:
			return
		case <-t.C:
		case <-l.kickCkpt:
		}
		if err := l.db.Exec("PRAGMA wal_checkpoint(PASSIVE)").Error; err != nil {
			l.log.Warn("sqlite checkpoint", "err", err)
		}
	}
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
	// Whatever a client sent (a model name of any length, NULs, invalid
	// UTF-8) must not cost the row: PostgreSQL refuses such values, and
	// the client already holds the row's inference id.
	o.row.Sanitize()
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
	close(l.stopCkpt)
	l.mu.Unlock()
	l.wg.Wait()
}

// OnWrite registers a hook called after every batch (for metrics).
func (l *Ledger) OnWrite(fn func(rows int, took time.Duration, err error)) { l.onWrite = fn }

// linger is how long a batch that nobody waits for (Records and Finishes
// only) is held open for more rows. Each commit costs SQLite a WAL write of
// every page it touched (the row and six indexes), so rows that arrive one at
// a time are cheaper committed a few together. A Begin or a Flush — someone
// waiting — ends the wait at once, so it adds nothing to a request's
// latency; it only delays when a rejected or finished row becomes visible,
// by at most this long.
const linger = 2 * time.Millisecond

func (l *Ledger) run() {
	defer l.wg.Done()
	batch := make([]op, 0, maxBatch)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for first := range l.ops {
		batch = append(batch[:0], first)
		waited := first.done != nil
		open := true
	drain:
		for len(batch) < maxBatch {
			select {
			case o, ok := <-l.ops:
				if !ok {
					open = false
					break drain
				}
				batch = append(batch, o)
				waited = waited || o.done != nil
			default:
				break drain
			}
		}
		if !waited && open && len(batch) < maxBatch {
			timer.Reset(linger)
		hold:
			for len(batch) < maxBatch {
				select {
				case o, ok := <-l.ops:
					if !ok {
						break hold
					}
					batch = append(batch, o)
					if o.done != nil {
						break hold
					}
				case <-timer.C:
					break hold
				}
			}
			timer.Stop()
		}
		l.write(batch)
	}
}

// A batch is written with a few statements whatever its size: one
// multi-row INSERT per chunk of new rows (Begins, Records, and Begins whose
// Finish is in the same batch, merged into their final row), and one
// multi-row upsert per chunk of Finishes. Chunks have power-of-two sizes (at
// most 9 statements for up to 511 rows of a kind), so that there are a few
// distinct statement texts, not one per batch size (pgx caches prepared
// statements by text; gorm's PrepareStmt is not used: the SQLite driver
// re-prepares on every Exec anyway, and pgx already caches). A batch of one statement (the usual case at moderate load, where
// rows arrive one at a time) runs without BEGIN/COMMIT around it; a larger
// one is one transaction. If it fails, its rows are written one by one, so
// that only a bad row is lost.
//
// A Finish must never create a row whose Begin failed: the failure may have
// been a taken inference id (another request's row, whose final columns the
// upsert would overwrite), and a request whose pending row was refused has
// already been answered as an internal error. So the writer remembers which
// Begins it committed (begun, until their Finish), and only those Finishes
// go into the upsert; there the row exists and ON CONFLICT always takes the
// UPDATE branch. Any other Finish — its Begin failed, or the row was written
// by another process — is a plain UPDATE, which never creates a row. A Begin
// whose commit was reported as failed although it happened (a lost COMMIT
// acknowledgement) is thus still finished by the UPDATE.
var chunkSizes = [...]int{256, 128, 64, 32, 16, 8, 4, 2, 1}

// finalColumns are the columns a Finish sets on its pending row.
var finalColumns = []string{"finished_at", "outcome", "status", "reason", "prompt_tokens", "completion_tokens",
	"usage_source", "queue_ms", "ttft_ms", "duration_ms", "backend"}

// upsertFinal finishes rows that are still pending, never a final one: a
// row another replica closed as gateway_restart (it found this replica's
// heartbeat stale) keeps that outcome, as the rollup counted it.
var upsertFinal = clause.OnConflict{
	Columns:   []clause.Column{{Name: "inference_id"}},
	DoUpdates: clause.AssignmentColumns(finalColumns),
	Where:     clause.Where{Exprs: []clause.Expression{clause.Eq{Column: clause.Column{Table: "usages", Name: "outcome"}, Value: models.OutcomePending}}},
}

// errNotPending fails a batch in which a Finish found its row already
// final: another replica closed it as gateway_restart, having found this
// one's heartbeat stale while it still served. The row keeps that outcome.
// The batch is then written row by row, where each Finish is an UPDATE
// whose count of changed rows says whether the rollup counts it, so that a
// request is never counted twice.
var errNotPending = errors.New("a finished row was no longer pending")

// rows of one batch, by the statement that writes them.
type plan struct {
	inserts []models.Usage // new rows
	upserts []models.Usage // Finishes of rows this writer has begun
	updates []models.Usage // other Finishes: UPDATE only
	// noRollup leaves the rollup out: the last try for a row whose commit
	// failed with it, as the ledger's row matters more than the
	// dashboards' sums (models.RebuildRollup recomputes them).
	noRollup bool
}

// final reports whether the plan makes any row final, so that the rollup
// must be added to in the same transaction.
func (p *plan) final() bool {
	if p.noRollup {
		return false
	}
	if len(p.upserts) > 0 || len(p.updates) > 0 {
		return true
	}
	for i := range p.inserts {
		if p.inserts[i].Outcome != models.OutcomePending {
			return true
		}
	}
	return false
}

// onlyID is the inference id of a plan's one row.
func (p *plan) onlyID() string {
	for _, rows := range [][]models.Usage{p.inserts, p.upserts, p.updates} {
		if len(rows) > 0 {
			return rows[0].InferenceID
		}
	}
	return ""
}

func (p *plan) rows() int { return len(p.inserts) + len(p.upserts) + len(p.updates) }

func chunks(n int) int {
	c := 0
	for _, size := range chunkSizes {
		c += n / size
		n %= size
	}
	return c
}

func (p *plan) statements() int {
	return chunks(len(p.inserts)) + chunks(len(p.upserts)) + len(p.updates)
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
	var p plan
	merged := make(map[string]bool)
	for _, o := range batch {
		switch o.kind {
		case opBegin:
			if i, ok := final[o.row.InferenceID]; ok {
				p.inserts = append(p.inserts, batch[i].row)
				merged[o.row.InferenceID] = true
			} else {
				p.inserts = append(p.inserts, o.row)
			}
		case opRecord:
			p.inserts = append(p.inserts, o.row)
		case opFinish:
			id := o.row.InferenceID
			switch {
			case merged[id]:
			case l.begun[id]:
				p.upserts = append(p.upserts, o.row)
			default:
				p.updates = append(p.updates, o.row)
			}
			delete(l.begun, id)
		}
	}
	err := l.commit(&p)
	var failed map[string]error // per row, when the batch had to be split
	if err != nil && (p.rows() > 1 || errors.Is(err, errNotPending)) {
		failed = map[string]error{}
		// One bad row must not cost the others theirs: write them one by
		// one, so that only the row that fails is lost (and logged).
		l.log.Warn("usage batch failed; writing rows one by one", "rows", p.rows(), "err", err)
		err = nil
		for i := range p.inserts {
			if e := l.commitAlone(&plan{inserts: p.inserts[i : i+1]}); e != nil {
				l.log.Error("usage row lost", "inference_id", p.inserts[i].InferenceID, "err", e)
				failed[p.inserts[i].InferenceID] = e
			}
		}
		// Finishes one by one as plain UPDATEs: never a new row.
		for _, u := range append(p.upserts, p.updates...) {
			if e := l.commitAlone(&plan{updates: []models.Usage{u}}); e != nil {
				l.log.Error("usage row not finished", "inference_id", u.InferenceID, "err", e)
				failed[u.InferenceID] = e
			}
		}
	}
	if err != nil && failed == nil {
		l.log.Error("usage row lost", "rows", p.rows(), "err", err)
	}
	errs := make([]error, len(batch))
	for i, o := range batch {
		if failed != nil {
			errs[i] = failed[o.row.InferenceID]
		} else {
			errs[i] = err
		}
		if o.kind == opBegin && errs[i] == nil && !merged[o.row.InferenceID] {
			l.begun[o.row.InferenceID] = true
		}
	}
	if l.kickCkpt != nil {
		if l.commits++; l.commits%checkpointAfter == 0 {
			select {
			case l.kickCkpt <- struct{}{}:
			default:
			}
		}
	}
	if l.onWrite != nil {
		l.onWrite(p.rows(), time.Since(start), err)
	}
	// Waiters are told last, once the writer's own state is up to date.
	for i, o := range batch {
		if o.done != nil {
			o.done <- errs[i]
		}
	}
}

// commit writes a plan: in one transaction, or without one when it is a
// single statement (which is atomic by itself): a batch of pending rows
// only, as a final row always comes with its rollup.
func (l *Ledger) commit(p *plan) error {
	if p.statements() <= 1 && !p.final() {
		return l.exec(l.db, p)
	}
	return l.db.Transaction(func(tx *gorm.DB) error { return l.exec(tx, p) })
}

// commitAlone commits the plan of one row that failed in its batch; if it
// fails again with the rollup, the row is written without it (and the
// rollup falls behind the ledger by that row, which is logged).
func (l *Ledger) commitAlone(p *plan) error {
	err := l.commit(p)
	if err == nil || !p.final() {
		return err
	}
	p.noRollup = true
	if l.commit(p) != nil {
		return err
	}
	l.log.Error("usage row written without its rollup; run `moonji usage rollup` to rebuild the dashboards' sums",
		"inference_id", p.onlyID(), "err", err)
	return nil
}

func (l *Ledger) exec(tx *gorm.DB, p *plan) error {
	var r *models.Rollup
	if p.final() {
		r = models.NewRollup()
	}
	if err := inChunks(p.inserts, func(rows []models.Usage) error {
		return tx.Create(&rows).Error
	}); err != nil {
		return fmt.Errorf("insert %d usage rows: %w", len(p.inserts), err)
	}
	if err := inChunks(p.upserts, func(rows []models.Usage) error {
		res := tx.Clauses(upsertFinal).Create(&rows)
		if res.Error == nil && res.RowsAffected != int64(len(rows)) {
			return errNotPending
		}
		return res.Error
	}); err != nil {
		return fmt.Errorf("finish %d usage rows: %w", len(p.upserts), err)
	}
	for i := range p.updates {
		u := &p.updates[i]
		res := tx.Model(&models.Usage{}).Where("inference_id = ? AND outcome = ?", u.InferenceID, models.OutcomePending).
			Select("FinishedAt", "Outcome", "Status", "Reason", "PromptTokens", "CompletionTokens",
				"UsageSource", "QueueMs", "TTFTMs", "DurationMs", "Backend").
			Updates(u)
		if res.Error != nil {
			return fmt.Errorf("finish usage row %s: %w", u.InferenceID, res.Error)
		}
		if r != nil && res.RowsAffected == 1 {
			r.Add(u)
		}
	}
	if r == nil {
		return nil
	}
	// Inserted final rows (rejections, and requests begun and finished in
	// one batch) and finished pending rows: pending inserts add nothing.
	for i := range p.inserts {
		r.Add(&p.inserts[i])
	}
	// Every upsert changed its row (errNotPending otherwise).
	for i := range p.upserts {
		r.Add(&p.upserts[i])
	}
	return r.Apply(tx)
}

// inChunks calls fn on rows cut into chunkSizes pieces, largest first.
func inChunks(rows []models.Usage, fn func([]models.Usage) error) error {
	for _, size := range chunkSizes {
		for len(rows) >= size {
			if err := fn(rows[:size]); err != nil {
				return err
			}
			rows = rows[size:]
		}
	}
	return nil
}
