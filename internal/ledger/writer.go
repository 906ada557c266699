package ledger

import (
	"errors"
	"sync"
	"time"

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
	opDown                 // hold rows until ready passes (StartDown)
)

type op struct {
	kind opKind
	row  models.Usage
	done chan error // nil when nobody waits
	// young: a journaled Begin, whose pending row waits pendingAfter for
	// its Finish so that a short request is one final insert.
	young bool
	due   time.Time
	// ready, for opDown: what must succeed before anything is written.
	ready func() error
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

// run is the writer's goroutine: it gathers what has queued into a batch
// (group commit) and writes it, and writes the deferred Begins as they fall
// due. It alone touches the writer's state (begun, young, scratch), so none
// of it needs a lock.
func (l *Ledger) run() {
	defer l.wg.Done()
	batch := make([]op, 0, maxBatch)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	due := time.NewTimer(time.Hour) // when the oldest deferred Begin falls due
	due.Stop()
	for {
		var first op
		if at, ok := l.nextWake(); ok {
			due.Reset(time.Until(at))
			select {
			case p, ok := <-l.ops:
				due.Stop()
				if !ok {
					l.write(nil, true)
					return
				}
				first = received(p)
			case <-due.C:
				l.write(nil, false)
				continue
			}
		} else {
			p, ok := <-l.ops
			if !ok {
				l.write(nil, true)
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
		l.write(batch, !open)
		if !open {
			return
		}
	}
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

// store does the database's part of write: it plans the batch's statements
// (statements.go), commits them, and keeps the writer's own record of which
// Begins it committed. If the batch fails, its rows are written one by one,
// so that only a bad row is lost.
func (l *Ledger) store(batch []op, closing bool) stored {
	start := time.Now()
	if l.out.down {
		l.retry(start, closing)
	}
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
		case opDown:
			l.startDown(o.ready)
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
		st := stored{batch: batch}
		if l.out.down {
			st.err = ErrDatabaseDown
		}
		return st
	}
	if l.out.down {
		return l.held(batch, p, fellDue)
	}
	err := l.commit(p)
	if err != nil && !errors.Is(err, errNotPending) && !l.reachable() {
		// Not a bad row: the database is away. Nothing is lost or split.
		l.goDown(err)
		return l.held(batch, p, fellDue)
	}
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
// OnWrite hook is called, and those waiting for a row are answered.
func (l *Ledger) settle(st stored) {
	if st.rows == 0 {
		for _, o := range st.batch {
			if o.done != nil {
				o.done <- st.err
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
	l.committed()
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

// held keeps a batch's rows through an outage (outage.go) and makes its
// result: the final rows leave Running, the pending ones stay until they
// are written; a waiter is told the database is down.
func (l *Ledger) held(batch []op, p *plan, fellDue []string) stored {
	l.hold(p)
	for _, id := range fellDue {
		delete(l.begun, id) // not in the database: its Finish is held too
	}
	errs := make([]error, len(batch))
	for i := range batch {
		errs[i] = ErrDatabaseDown
	}
	st := stored{batch: batch, errs: errs, rows: p.rows(), err: ErrDatabaseDown}
	if l.journal != nil {
		for _, rows := range [][]models.Usage{p.inserts, p.upserts, p.updates} {
			for i := range rows {
				if rows[i].Outcome != models.OutcomePending {
					st.written = append(st.written, rows[i].InferenceID)
				}
			}
		}
	}
	return st
}

// nextWake is when the writer must wake with nothing queued: the oldest
// deferred Begin falls due, or the database is to be tried again.
func (l *Ledger) nextWake() (time.Time, bool) {
	at, ok := l.young.next()
	if l.out.down && (!ok || l.out.retryAt.Before(at)) {
		return l.out.retryAt, true
	}
	return at, ok
}

// rowErr is the write's result for one row of a batch.
func rowErr(err error, failed map[string]error, id string) error {
	if failed != nil {
		return failed[id]
	}
	return err
}
