package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"moonji/models"
)

// A batch is written with a few statements whatever its size: one
// INSERT of new rows (Begins, Records, and Begins whose Finish is in the
// same batch, merged into their final row) and one upsert of Finishes per
// jsonRows.max rows, each bound as one JSON array (rowsjson.go). A batch
// of one statement (the usual case at moderate load, where rows arrive one
// at a time) runs without BEGIN/COMMIT around it; a larger one is one
// transaction.
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

// sqliteStatementRows is the most rows one statement writes on SQLite,
// bound as one JSON text (rowsjson.go): that cost ~60 µs of the process's
// CPU per row in all, against ~105 µs as 16-row INSERTs with a parameter
// per column, and 32 rows a statement cost the same as 64.
const sqliteStatementRows = 64

// finalColumns are the columns a Finish sets on its pending row.
var finalColumns = []string{"finished_at", "outcome", "status", "reason", "prompt_tokens", "completion_tokens",
	"cached_tokens", "cost", "usage_source", "queue_ms", "ttft_ms", "duration_ms", "backend", "retried_from", "response_id"}

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

// commit writes a plan: in one transaction, or without one when it is a
// single statement (which is atomic by itself): a batch of pending rows
// only, as a final row always comes with its rollup.
//
// It gives up after the ledger's commit wait: a database behind a network
// that swallows packets (a dead NAT entry, a partition) never answers nor
// closes the connection, and the writer must then turn to the journal like
// in any outage instead of waiting for TCP to notice, hours later.
func (l *Ledger) commit(p *plan) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(l.commitWait.Load()))
	defer cancel()
	db := l.db.WithContext(ctx)
	if p.statements(l.rows.max) <= 1 && !p.final() {
		return l.exec(db, p)
	}
	return db.Transaction(func(tx *gorm.DB) error { return l.exec(tx, p) })
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

// exec runs a plan's statements on tx, and adds the rows it made final to
// the dashboards' rollup in the same transaction.
func (l *Ledger) exec(tx *gorm.DB, p *plan) error {
	var r *models.Rollup
	if p.final() {
		r = models.NewRollup()
	}
	insert := func(rows []models.Usage) (err error) {
		_, l.jsonBuf, err = l.rows.write(tx, l.rows.insert, rows, l.jsonBuf)
		return err
	}
	upsert := func(rows []models.Usage) error {
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
		u := &p.updates[i]
		res := tx.Model(&models.Usage{}).Where("inference_id = ? AND outcome = ?", u.InferenceID, models.OutcomePending).
			Select("FinishedAt", "Outcome", "Status", "Reason", "PromptTokens", "CompletionTokens", "CachedTokens", "Cost",
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
