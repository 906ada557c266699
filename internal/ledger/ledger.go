// Package ledger writes the usage ledger: exactly one row per inference
// request. Writes go through one goroutine that commits whatever has queued
// up in a single transaction (group commit), so that no request waits on the
// database on its token path and a burst of requests costs a few commits.
//
// The package's files, one job each:
//
//   - ledger.go: the API (Begin, Finish, Record, Flush, Close) and the Ledger.
//   - writer.go: the queue and the writer's goroutine (group commit).
//   - pending.go: journaled Begins whose pending row is deferred, and Running.
//   - statements.go: what one batch becomes in the database.
//   - rowsjson.go: the statements that write rows from a JSON array.
//   - checkpoint.go: SQLite's WAL copied back off the writer's path.
package ledger

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"moonji/models"
)

// Journal is where a ledger with deferred pending rows makes each Begin safe
// from a crash before the row reaches the database (journal.Journal).
type Journal interface {
	Begin(row *models.Usage) error
	Durable(ids ...string)
	// Final keeps a final row while the database is away, and Finals
	// reads those still open back (outage.go).
	Final(row *models.Usage) error
	Finals(fn func(rows []models.Usage) error) error
}

// Ledger is the asynchronous writer of usage rows.
type Ledger struct {
	db      *gorm.DB
	log     *slog.Logger
	ops     chan *op // pooled (opPool), each taken back by received
	wg      sync.WaitGroup
	mu      sync.RWMutex // guards closed against sends on a closed ops
	closed  bool
	onWrite func(rows int, took time.Duration, err error)

	// The writer's own state, touched by its goroutine alone.
	begun   map[string]bool // ids whose pending row this writer committed, until their Finish
	scratch scratch         // store's working storage
	young   youngRows       // deferred Begins, oldest first
	// Rows are written as JSON (rowsjson.go), encoded into jsonBuf.
	rows    jsonRows
	jsonBuf []byte

	// SQLite only (checkpoint.go): commits counts them, kickCkpt asks for
	// a checkpoint, stopCkpt ends the checkpoints' goroutine.
	nCommits int
	kickCkpt chan struct{}
	stopCkpt chan struct{}

	// With a journal, a Begin is journaled and its pending row deferred.
	journal      Journal
	pendingAfter time.Duration
	// running holds the deferred Begins until their row is in the
	// database, for Running.
	runMu   sync.Mutex
	running map[string]*models.Usage // never changed once in: Begin's own copy

	// out is the writer's state while the database is away (outage.go).
	out outage
	// commitWait bounds one commit (CommitWait, or SetCommitWait's).
	commitWait atomic.Int64
}

// New starts a ledger writing to db. Call Close to flush and stop it.
func New(db *gorm.DB, log *slog.Logger) *Ledger {
	if log == nil {
		log = slog.Default()
	}
	l := &Ledger{db: db, log: log, ops: make(chan *op, maxQueued), begun: map[string]bool{},
		scratch: newScratch(), young: youngRows{byID: map[string]int{}}, rows: rowsFor(db.Dialector.Name()),
		stopCkpt: make(chan struct{}), running: map[string]*models.Usage{}}
	l.out.max.Store(MaxBacklog)
	l.commitWait.Store(int64(CommitWait))
	l.wg.Add(1)
	go l.run()
	if db.Dialector.Name() == "sqlite" {
		l.kickCkpt = make(chan struct{}, 1)
		l.wg.Add(1)
		go l.checkpoints()
	}
	return l
}

// UseJournal makes Begin write to j instead of waiting on the database: the
// pending row of a request is written only if it still runs pendingAfter
// later, and a request that ends sooner costs one final insert. Call it
// before the first Begin.
func (l *Ledger) UseJournal(j Journal, pendingAfter time.Duration) {
	l.journal, l.pendingAfter = j, pendingAfter
}

// Begin queues the pending row of a request and returns a channel that
// receives nil once the row is safe, or the error that lost it. The row
// must be safe before its inference id is shown to anyone, so callers wait
// on the channel before sending the response headers. With a journal it is
// safe once journaled, before Begin returns; without one, once committed —
// usually long before the wait, since the upstream call runs meanwhile.
func (l *Ledger) Begin(row models.Usage) <-chan error {
	row.Outcome = models.OutcomePending
	if l.journal != nil {
		row.Sanitize()
		err := l.journal.Begin(&row)
		if err == nil {
			l.runMu.Lock()
			l.running[row.InferenceID] = &row
			l.runMu.Unlock()
			l.enqueue(op{kind: opBegin, row: row, young: true, due: time.Now().Add(l.pendingAfter)})
			return journaled
		}
		// The database is still there: wait for it, as without a journal.
		l.log.Warn("journal write failed; the pending row is written at once", "inference_id", row.InferenceID, "err", err)
	}
	done := make(chan error, 1)
	l.enqueue(op{kind: opBegin, row: row, done: done})
	return done
}

// journaled is what Begin returns for a row that is safe in the journal:
// closed, so that every receive is nil at once, and shared, so that such a
// Begin makes no channel.
var journaled = func() chan error {
	c := make(chan error)
	close(c)
	return c
}()

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
	l.send(o)
}

// Flush waits until everything queued before the call is written.
func (l *Ledger) Flush(ctx context.Context) error {
	done := make(chan error, 1)
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return nil
	}
	l.send(op{kind: opFlush, done: done})
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
