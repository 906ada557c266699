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
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"moonji/internal/spareproc"
	"moonji/models"
)

// maxBatch bounds one transaction, so a backlog is drained in steps.
const maxBatch = 512

type opKind int

const (
	opBegin  opKind = iota // insert a pending row
	opFinish               // update a pending row to its final state
	opRecord               // insert a row that is already final (rejections)
	opFlush                // write everything, young rows included
)

type op struct {
	kind opKind
	row  models.Usage
	done chan error // nil when nobody waits
	// young: a journaled Begin, whose pending row waits pendingAfter for
	// its Finish so that a short request is one final insert.
	young bool
	due   time.Time
}

// maxQueued is how many ops may wait for the writer before the next one
// waits for room: several seconds of requests at a thousand a second.
const maxQueued = 8192

// opPool holds the ops on their way to the writer. The queue is a channel
// of pointers to them, not of ops: a channel's buffer is a ring the writer
// walks through whole in time, and 8,192 ops of ~330 bytes each kept 2.7 MB
// resident for good, where pointers take 64 KiB. The pool makes sending one
// no allocation.
var opPool = sync.Pool{New: func() any { return new(op) }}

// send queues o for the writer.
func (l *Ledger) send(o op) {
	p := opPool.Get().(*op)
	*p = o
	l.ops <- p
}

// received returns the op p points to and gives p back to the pool, emptied
// so that it holds on to no row.
func received(p *op) op {
	o := *p
	*p = op{}
	opPool.Put(p)
	return o
}

// Journal is where a ledger with deferred pending rows makes each Begin safe
// from a crash before the row reaches the database (journal.Journal).
type Journal interface {
	Begin(row *models.Usage) error
	Durable(ids ...string)
}

// Ledger is the asynchronous writer of usage rows.
type Ledger struct {
	db       *gorm.DB
	begun    map[string]bool // ids whose pending row this writer committed, until their Finish
	ops      chan *op        // pooled (opPool), each taken back by received
	log      *slog.Logger
	wg       sync.WaitGroup
	mu       sync.RWMutex
	closed   bool
	stopCkpt chan struct{}
	kickCkpt chan struct{} // SQLite only: asks for a checkpoint
	// commits hands batches to the goroutine that writes them on a thread
	// of low priority (committer).
	commits  chan batchWrite
	written  chan stored
	nCommits int
	onWrite  func(rows int, took time.Duration, err error)
	// Whether the writer pauses between the statements of a batch
	// (SQLite: see sqliteStatementRows).
	pauses atomic.Bool
	sqlite bool
	// Rows are written as JSON (rowsjson.go), encoded into jsonBuf by
	// whichever goroutine writes (one at a time).
	rows    jsonRows
	jsonBuf []byte
	slow    slowCommits // a committer starved of CPU

	// With a journal, a Begin is journaled and its pending row deferred.
	journal      Journal
	pendingAfter time.Duration
	young        youngRows // the writer's: deferred Begins, oldest first
	scratch      scratch   // store's
	// running holds the deferred Begins until their row is in the
	// database, for Running.
	runMu   sync.Mutex
	running map[string]*models.Usage // never changed once in: Begin's own copy
}

// New starts a ledger writing to db. Call Close to flush and stop it.
func New(db *gorm.DB, log *slog.Logger) *Ledger {
	if log == nil {
		log = slog.Default()
	}
	l := &Ledger{db: db, ops: make(chan *op, maxQueued), log: log, begun: map[string]bool{}, stopCkpt: make(chan struct{}),
		running: map[string]*models.Usage{}, young: youngRows{byID: map[string]int{}}, scratch: newScratch(), rows: rowsFor(db.Dialector.Name())}
	if db.Dialector.Name() == "sqlite" {
		l.sqlite = true
		l.pauses.Store(true)
	}
	l.commits, l.written = make(chan batchWrite), make(chan stored)
	l.wg.Add(2)
	go l.committer()
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

// checkpoints asks for a checkpoint when one is due. The checkpoint itself
// runs on a thread of the lowest priority, like the committer's batches
// (checkpointer), and this goroutine, at normal priority, wakes that thread
// only once it has lent the process a P for it (spareproc.Blocking): with
// one P, the woken low-priority thread would hold it, and every request
// wait for a thread the kernel runs last; sharing the P the committer's
// batches are lent, a checkpoint and a batch at once would hold both.
func (l *Ledger) checkpoints() {
	defer l.wg.Done()
	ask, done := make(chan struct{}), make(chan struct{})
	defer close(ask)
	l.wg.Add(1)
	go l.checkpointer(ask, done)
	t := time.NewTicker(checkpointEvery)
	defer t.Stop()
	for {
		select {
		case <-l.stopCkpt:
			return
		case <-t.C:
		case <-l.kickCkpt:
		}
		// A checkpoint writes and syncs files for milliseconds on its own
		// thread, holding a P throughout: a P of its own, beside the one
		// a batch being committed meanwhile holds.
		spareproc.Blocking(func() {
			ask <- struct{}{}
			<-done
		})
	}
}

// checkpointer copies the WAL back when checkpoints asks it to.
func (l *Ledger) checkpointer(ask <-chan struct{}, done chan<- struct{}) {
	defer l.wg.Done()
	background()
	for range ask {
		if err := l.db.Exec("PRAGMA wal_checkpoint(PASSIVE)").Error; err != nil {
			l.log.Warn("sqlite checkpoint", "err", err)
		}
		done <- struct{}{}
	}
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

// Running returns the row of a request this ledger began and has not yet
// written to the database (its pending row is deferred), so that a stop on
// this replica finds a request younger than pendingAfter.
func (l *Ledger) Running(id string) (models.Usage, bool) {
	l.runMu.Lock()
	defer l.runMu.Unlock()
	u, ok := l.running[id]
	if !ok {
		return models.Usage{}, false
	}
	return *u, true
}

// youngRows are the deferred Begins the writer holds, in the order they
// came (which is the order they fall due: one delay for all).
type youngRows struct {
	order []op
	byID  map[string]int // inference id → index in order, while held
	head  int
}

func (y *youngRows) add(o op) {
	y.byID[o.row.InferenceID] = len(y.order)
	y.order = append(y.order, o)
}

// take removes and returns the held Begin of id.
func (y *youngRows) take(id string) (op, bool) {
	i, ok := y.byID[id]
	if !ok {
		return op{}, false
	}
	delete(y.byID, id)
	o := y.order[i]
	y.order[i].row.InferenceID = "" // taken: skipped when it falls due
	return o, true
}

// popDue removes and returns the held Begins due by now (all of them when
// all is set), oldest first.
func (y *youngRows) popDue(now time.Time, all bool) []op {
	var due []op
	for {
		y.skipTaken()
		if y.head == len(y.order) {
			return due
		}
		o := y.order[y.head]
		if !all && o.due.After(now) {
			return due
		}
		delete(y.byID, o.row.InferenceID)
		due = append(due, o)
		y.order[y.head] = op{}
		y.head++
	}
}

// skipTaken moves past taken Begins at the front, and compacts the slice
// once its dead front is half of it, so that it never grows for ever.
func (y *youngRows) skipTaken() {
	for y.head < len(y.order) && y.order[y.head].row.InferenceID == "" {
		y.order[y.head] = op{}
		y.head++
	}
	if y.head == len(y.order) {
		if y.head > 0 {
			y.order, y.head = y.order[:0], 0
		}
		return
	}
	if y.head >= 1024 && y.head*2 >= len(y.order) {
		n := copy(y.order, y.order[y.head:])
		clear(y.order[n:])
		y.order, y.head = y.order[:n], 0
		for i := range y.order {
			if id := y.order[i].row.InferenceID; id != "" {
				y.byID[id] = i
			}
		}
	}
}

// next returns when the oldest held Begin falls due.
func (y *youngRows) next() (time.Time, bool) {
	y.skipTaken()
	if y.head == len(y.order) {
		return time.Time{}, false
	}
	return y.order[y.head].due, true
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

// linger is how long a batch that nobody waits for is held open for more
// rows. Each commit costs SQLite a WAL write of every page it touched (the
// rows, their indexes, and the four rollup tables a final row adds to), so
// rows are much cheaper committed many together: at 1,000 requests/s on one
// core, the gateway took 43 % of it with a 20 ms linger and 36 % with 100 ms
// (2 ms before the journal: every Begin ended the wait). With the journal
// nobody waits for a Begin, so the linger adds nothing to a request's
// latency; it delays when a finished row becomes visible, by at most this
// long. A Flush, or a Begin that waits (no journal), ends it at once.
const linger = 100 * time.Millisecond

func (l *Ledger) run() {
	defer l.wg.Done()
	defer close(l.commits)
	batch := make([]op, 0, maxBatch)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	due := time.NewTimer(time.Hour) // when the oldest deferred Begin falls due
	due.Stop()
	for {
		var first op
		if at, ok := l.young.next(); ok {
			due.Reset(time.Until(at))
			select {
			case p, ok := <-l.ops:
				due.Stop()
				if !ok {
					l.writeBatch(nil, true)
					return
				}
				first = received(p)
			case <-due.C:
				l.writeBatch(nil, false)
				continue
			}
		} else {
			p, ok := <-l.ops
			if !ok {
				l.writeBatch(nil, true)
				return
			}
			first = received(p)
		}
		batch = append(batch[:0], first)
		waited := first.done != nil
		open := true
	drain:
		for len(batch) < maxBatch {
			select {
			case p, ok := <-l.ops:
				if !ok {
					open = false
					break drain
				}
				o := received(p)
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
				case p, ok := <-l.ops:
					if !ok {
						break hold
					}
					o := received(p)
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
		l.writeBatch(batch, !open)
		if !open {
			return
		}
	}
}

// batchWrite is one call of write, handed to the committer.
type batchWrite struct {
	batch []op
	final bool
}

// writeBatch writes a batch through the committer, waiting until it is
// written (the batch's slice is reused), unless the writer is behind or the
// committer was starved (slowCommits), when it writes at once at normal
// priority.
//
// The process has a second P meanwhile (spareproc), so that requests keep
// running beside the batch on a one-core machine: lent here, on the
// writer's goroutine at normal priority, before the committer's thread is
// woken.
func (l *Ledger) writeBatch(batch []op, final bool) {
	spareproc.Lend()
	switch {
	case len(l.ops) > cap(l.ops)/4:
	case l.slow.active(time.Now()):
		l.slow.bypassed.Add(1)
	default:
		l.commits <- batchWrite{batch, final}
		st := <-l.written
		// The P goes back before settle, which clears the batch's rows
		// from the journal and the running set under locks each request
		// takes as it begins.
		spareproc.ReturnAtOnce()
		l.settle(st)
		return
	}
	defer spareproc.Return()
	l.write(batch, final)
}

// slowCommits notices a committer that is starved of CPU by other
// processes. Its thread (background) gets a core only when nothing else
// wants it. When what else wants it is this gateway's own request threads,
// that is the point; but beside a process that keeps every core busy at
// normal priority — an inference engine on the CPU, the usual neighbour of
// a self-hosted gateway — it gets well under 1 % of one, and a batch of 5 ms
// of work takes a second or more (holding SQLite's write lock, or a
// PostgreSQL transaction open). So after each batch the committer looks at
// how long the batch took, how long its thread waited for a CPU meanwhile
// (runnable, not running: waitClock), and the CPU time the whole process
// used: a slow batch that spent most of its time waiting for a CPU while
// the process itself was mostly idle was starved by others, and the writer
// writes the next batches itself, at normal priority, for slowFor — twice
// as long after each batch in a row that was starved again, up to
// slowForMax, so that a neighbour that stays busy costs one slow batch
// every half minute, not one a second. A batch that was slow because it
// waited for the database — a PostgreSQL server far away or busy, SQLite's
// write lock held by another connection — is not starved: its thread
// slept, and writing at normal priority would not be quicker. (Where the
// thread's wait cannot be read, a slow batch with the process idle counts
// as starved.) The committer's thread cannot be raised back instead: an
// unprivileged process may only lower a priority.
type slowCommits struct {
	until    atomic.Int64 // unix nanoseconds; 0: not slow
	bypassed atomic.Int64 // batches written around the committer (tests read it)
	streak   int          // starved batches in a row (the committer's alone)
}

const (
	slowWall   = 30 * time.Millisecond // a batch slower than this …
	slowRatio  = 4                     // … while the process used under 1/4 of a core …
	slowWait   = 2                     // … and its thread waited for a CPU half the time
	slowFor    = time.Second
	slowForMax = 32 * time.Second
)

// observe records one batch the committer wrote (how long it took, the CPU
// time the process used meanwhile, and how long the committer's thread
// waited for a CPU), and reports whether it was starved, and if so for how
// long the next batches go around the committer.
func (s *slowCommits) observe(wall, cpu, waited time.Duration, now time.Time) (time.Duration, bool) {
	if wall < slowWall || slowRatio*cpu > wall || slowWait*waited < wall {
		s.streak = 0
		return 0, false
	}
	d := s.bypassFor()
	s.until.Store(now.Add(d).UnixNano())
	s.streak++
	return d, true
}

// bypassFor is how long batches go around the committer after the one just
// observed was starved: slowFor, doubled for each starved batch before it in
// a row, at most slowForMax.
func (s *slowCommits) bypassFor() time.Duration {
	return min(slowFor<<min(s.streak, 6), slowForMax)
}

// active reports whether batches go around the committer now.
func (s *slowCommits) active(now time.Time) bool {
	u := s.until.Load()
	return u != 0 && now.UnixNano() < u
}

// committer writes batches on an OS thread of the lowest priority
// (background). SQLite is compiled Go here, so its work runs on whichever
// thread calls it; a batch of a hundred rows is milliseconds of CPU, and on
// a one-core gateway the requests that arrived meanwhile waited behind it:
// that was the p99 at 1,000 req/s (BENCHMARKS.md §13). With PostgreSQL the
// server does the database's work, but the driver's side of a batch (its
// statements encoded, the replies decoded, a transaction's round trips)
// was still ~1.7 ms of the gateway's CPU every 100 ms at 1,000 req/s
// (BENCHMARKS.md §28). At the lowest
// priority (SCHED_IDLE) the kernel runs the request threads first, and at
// once; the process is lent a second P for them while it writes
// (spareproc, in writeBatch). Only whole batches cross to this goroutine:
// a locked thread pays a thread switch on every wake-up, too much for each
// row the writer gathers. Only the statements run here (store): what the
// rest of the process is told afterwards takes locks requests take too, and
// runs on the writer's goroutine (settle), so that a request does not wait
// for this thread. A writer that falls behind (its queue a quarter
// full) writes at normal priority instead, so that a saturated core cannot
// starve the ledger. Where the priority cannot be lowered, the statements
// of a batch are spaced out instead (pause).
func (l *Ledger) committer() {
	defer l.wg.Done()
	lowered := background()
	l.pauses.Store(l.sqlite && !lowered)
	clock := openWaitClock()
	defer clock.close()
	for w := range l.commits {
		start, cpu := time.Now(), processCPU()
		waitedBefore, known := clock.read()
		st := l.store(w.batch, w.final)
		if lowered {
			wall := time.Since(start)
			used := processCPU() - cpu
			waited := wall // unknown: as if it had waited throughout
			if w, ok := clock.read(); ok && known {
				waited = w - waitedBefore
			}
			if bypass, starved := l.slow.observe(wall, used, waited, time.Now()); starved {
				l.log.Info("usage batch starved of CPU at low priority; writing at normal priority for a while",
					"took", wall, "waited_for_cpu", waited, "process_cpu", used, "for", bypass)
			}
		}
		l.written <- st
	}
}

// A batch is written with a few statements whatever its size: one
// INSERT of new rows (Begins, Records, and Begins whose Finish is in the
// same batch, merged into their final row) and one upsert of Finishes per
// jsonRows.max rows, each bound as one JSON array (rowsjson.go). A batch
// of one statement (the usual case at moderate load, where rows arrive one
// at a time) runs without BEGIN/COMMIT around it; a larger one is one
// transaction. If it fails, its rows are written one by one, so that only
// a bad row is lost.
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

// SQLite runs inside this process, as Go code (modernc's translation of its
// C) that the scheduler does not interrupt: a statement keeps its P until it
// returns. The writer gathers 100 ms of rows into a batch, and on a one-core
// gateway every request waited while it was written (that was the p99: 20
// ms, against 4 ms with the ledger in PostgreSQL). On Linux the committer's
// thread runs at the lowest priority, which the kernel preempts for
// requests at once (p99 at 1,000 req/s 3-4 ms). Where that is not possible,
// the writer sleeps after each statement of a batch as long as the
// statement took, so that it takes at most half the core while requests
// wait (4.2-4.5 ms against 19-21 ms with no pause; a yield or a short sleep
// did not help: the woken writer went first again). A statement writes at
// most sqliteStatementRows rows, bound as one JSON text (rowsjson.go): ~60 µs
// of the process's CPU per row in all, against ~105 µs as 16-row INSERTs
// with a parameter per column (BENCHMARKS.md §17; 32 rows a statement cost
// the same as 64).
// When the writer falls behind (its queue half full) it stops pausing: rows
// must not pile up without bound.
const sqliteStatementRows = 64

// finalColumns are the columns a Finish sets on its pending row.
var finalColumns = []string{"finished_at", "outcome", "status", "reason", "prompt_tokens", "completion_tokens",
	"usage_source", "queue_ms", "ttft_ms", "duration_ms", "backend", "retried_from", "response_id"}

// errNotPending fails a batch in which a Finish found its row already
// final: another replica closed it as gateway_restart, having found this
// one's heartbeat stale while it still served. The row keeps that outcome.
// The batch is then written row by row, where each Finish is an UPDATE
// whose count of changed rows says whether the rollup counts it, so that a
// request is never counted twice.
var errNotPending = errors.New("a finished row was no longer pending")

// scratch is store's working storage, kept from one batch to the next so
// that a batch allocates little: store runs on one goroutine at a time, and
// nothing it hands on refers to it.
type scratch struct {
	plan   plan
	final  map[string]int  // inference id → index of its Finish in the batch
	merged map[string]bool // Begins whose Finish came in the same batch
}

// scratchRows is the most rows scratch keeps room for: a burst's batch of
// thousands is let go once written.
const scratchRows = 1024

func newScratch() scratch {
	return scratch{final: map[string]int{}, merged: map[string]bool{}}
}

// reset empties s for the next batch.
func (s *scratch) reset() {
	keep := func(rows []models.Usage) []models.Usage {
		if cap(rows) > scratchRows {
			return nil
		}
		clear(rows) // no row's strings held until the next batch
		return rows[:0]
	}
	s.plan = plan{inserts: keep(s.plan.inserts), upserts: keep(s.plan.upserts), updates: keep(s.plan.updates)}
	if len(s.final) > scratchRows || len(s.merged) > scratchRows {
		*s = scratch{plan: s.plan, final: map[string]int{}, merged: map[string]bool{}}
		return
	}
	clear(s.final)
	clear(s.merged)
}

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

// pieces is the number of statements inPieces makes of n rows.
func pieces(n, max int) int { return (n + max - 1) / max }

// statements is the number of statements that write the plan, at most
// max rows each.
func (p *plan) statements(max int) int {
	return pieces(len(p.inserts), max) + pieces(len(p.upserts), max) + len(p.updates)
}

// write commits one batch, and the deferred Begins that have fallen due (all
// of them on a Flush or when closing: they are written as pending rows). A
// Begin and Finish of the same row in one batch, or a deferred Begin and its
// Finish, become a single insert of the final row.
func (l *Ledger) write(batch []op, closing bool) { l.settle(l.store(batch, closing)) }

// stored is what store did with a batch, for settle to tell the rest of
// the process.
type stored struct {
	batch   []op
	errs    []error  // per op of batch
	durable []string // rows now in the database that a journal holds
	written []string // inference ids of the rows inserted, written or not
	rows    int
	took    time.Duration
	err     error
}

// store does the database's part of write: the statements, and the writer's
// own record of which Begins it committed. It runs on the committer's
// thread of the lowest priority, so it takes no lock that a
// request may wait for: a request would wait for that thread, which the
// kernel runs last (settle, on the writer's goroutine, does that part).
func (l *Ledger) store(batch []op, closing bool) stored {
	start := time.Now()
	sc := &l.scratch
	defer sc.reset()
	final := sc.final // inference id → index of its Finish
	all := closing
	for i, o := range batch {
		switch o.kind {
		case opFinish:
			final[o.row.InferenceID] = i
		case opFlush:
			all = true
		}
	}
	p, merged := &sc.plan, sc.merged
	var fellDue []string // deferred Begins written as pending rows
	for _, o := range batch {
		switch o.kind {
		case opBegin:
			if o.young {
				l.young.add(o)
				continue
			}
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
			if _, ok := l.young.take(id); ok {
				// Finished before its pending row was written: one
				// final row.
				p.inserts = append(p.inserts, o.row)
				continue
			}
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
	for _, o := range l.young.popDue(time.Now(), all) {
		p.inserts = append(p.inserts, o.row)
		fellDue = append(fellDue, o.row.InferenceID)
	}
	if p.rows() == 0 {
		// Only deferred Begins, or a Flush with nothing to write.
		return stored{batch: batch}
	}
	err := l.commit(p)
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
		if o.kind == opBegin && !o.young && errs[i] == nil && !merged[o.row.InferenceID] {
			l.begun[o.row.InferenceID] = true
		}
	}
	for _, id := range fellDue {
		if rowErr(err, failed, id) == nil {
			l.begun[id] = true
		}
	}
	st := stored{batch: batch, errs: errs, rows: p.rows(), took: time.Since(start), err: err}
	if l.journal != nil {
		for i := range p.inserts {
			id := p.inserts[i].InferenceID
			st.written = append(st.written, id)
			if rowErr(err, failed, id) == nil {
				st.durable = append(st.durable, id)
			}
		}
	}
	return st
}

// settle tells the rest of the process what store did: rows now in the
// database leave the journal and Running, a checkpoint may fall due, the
// OnWrite hook is called, and those waiting for a row are answered. It runs
// on the writer's goroutine.
func (l *Ledger) settle(st stored) {
	if st.rows == 0 {
		for _, o := range st.batch {
			if o.done != nil {
				o.done <- nil
			}
		}
		return
	}
	if l.journal != nil {
		// Rows now in the database leave the journal. One that failed
		// stays there, and the next start records it; Running forgets
		// both, as the database now answers for them or never will.
		if len(st.durable) > 0 {
			l.journal.Durable(st.durable...)
		}
		l.runMu.Lock()
		for _, id := range st.written {
			delete(l.running, id)
		}
		l.runMu.Unlock()
	}
	if l.kickCkpt != nil {
		if l.nCommits++; l.nCommits%checkpointAfter == 0 {
			select {
			case l.kickCkpt <- struct{}{}:
			default:
			}
		}
	}
	if l.onWrite != nil {
		l.onWrite(st.rows, st.took, st.err)
	}
	// Waiters are told last, once the writer's own state is up to date.
	for i, o := range st.batch {
		if o.done != nil {
			o.done <- st.errs[i]
		}
	}
}

// rowErr is the write's result for one row of a batch.
func rowErr(err error, failed map[string]error, id string) error {
	if failed != nil {
		return failed[id]
	}
	return err
}

// commit writes a plan: in one transaction, or without one when it is a
// single statement (which is atomic by itself): a batch of pending rows
// only, as a final row always comes with its rollup.
func (l *Ledger) commit(p *plan) error {
	if p.statements(l.rows.max) <= 1 && !p.final() {
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
	// Each statement but the first waits for the rest of the process
	// (SQLite: see sqliteStatementRows).
	ran := 0
	var last time.Time
	step := func() {
		if ran > 0 {
			l.pause(time.Since(last))
		}
		ran++
		last = time.Now()
	}
	insert := func(rows []models.Usage) (err error) {
		step()
		_, l.jsonBuf, err = l.rows.write(tx, l.rows.insert, rows, l.jsonBuf)
		return err
	}
	upsert := func(rows []models.Usage) error {
		step()
		n, buf, err := l.rows.write(tx, l.rows.upsert, rows, l.jsonBuf)
		l.jsonBuf = buf
		if err == nil && n != int64(len(rows)) {
			return errNotPending
		}
		return err
	}
	if err := inPieces(p.inserts, l.rows.max, insert); err != nil {
		return fmt.Errorf("insert %d usage rows: %w", len(p.inserts), err)
	}
	if err := inPieces(p.upserts, l.rows.max, upsert); err != nil {
		return fmt.Errorf("finish %d usage rows: %w", len(p.upserts), err)
	}
	for i := range p.updates {
		step()
		u := &p.updates[i]
		res := tx.Model(&models.Usage{}).Where("inference_id = ? AND outcome = ?", u.InferenceID, models.OutcomePending).
			Select("FinishedAt", "Outcome", "Status", "Reason", "PromptTokens", "CompletionTokens",
				"UsageSource", "QueueMs", "TTFTMs", "DurationMs", "Backend", "RetriedFrom", "ResponseID").
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
	step()
	return r.Apply(tx)
}

// inPieces calls fn on rows cut into pieces of at most max rows.
func inPieces(rows []models.Usage, max int, fn func([]models.Usage) error) error {
	for len(rows) > 0 {
		n := min(len(rows), max)
		if err := fn(rows[:n]); err != nil {
			return err
		}
		rows = rows[n:]
	}
	return nil
}

// pause lets the rest of the process run between two statements of a
// batch, for as long as the last one took (SQLite only; see
// sqliteStatementRows), unless the writer is behind.
func (l *Ledger) pause(took time.Duration) {
	if !l.pauses.Load() || len(l.ops) > cap(l.ops)/2 {
		return
	}
	time.Sleep(took)
}
