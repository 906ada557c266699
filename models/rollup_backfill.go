package models

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// backfillBatch is how many ledger rows one transaction of the rollup's
// backfill reads: on a ledger of ten million rows, one transaction for all
// of them held SQLite's write lock (and PostgreSQL's lock on the rollup)
// for minutes, and an interrupted start began again from nothing.
const backfillBatch = 5000

// backfillBatchDone, when set (tests), is called after each batch.
var backfillBatchDone func()

// backfillRollup builds the rollup of a ledger that has final rows but no
// rollup yet (the first start after an upgrade from before the rollup
// existed), in batches of backfillBatch rows in (created_at, inference_id)
// order. Each batch adds its rows to the rollup and moves the cursor in
// progress_marks in one transaction, so an interrupted backfill resumes
// where it stopped and counts every row exactly once. When nothing is to
// be done it only reads.
func backfillRollup(ctx context.Context, db *gorm.DB, batch int) error {
	p, err := progressOf(ctx, db, progressRollupBackfill)
	if err != nil || (p != nil && p.Done) {
		return err
	}
	if p == nil {
		if rolled, err := exists(db.WithContext(ctx).Model(&UsageRollup{})); err != nil || rolled {
			return err
		}
		final, err := exists(db.WithContext(ctx).Model(&Usage{}).Where("outcome <> ?", OutcomePending))
		if err != nil || !final {
			return err
		}
		// Rows made final from now on are added to the rollup by
		// whoever finishes them (the ledger, CloseUnfinishedUsage): the
		// backfill counts only those final before it began.
		start := &Progress{Name: progressRollupBackfill, Until: time.Now().UTC(), UpdatedAt: time.Now().UTC()}
		if err := db.WithContext(ctx).Clauses(clause.OnConflict{DoNothing: true}).Create(start).Error; err != nil {
			return fmt.Errorf("start the rollup backfill: %w", err)
		}
		slog.Info("building the usage rollup from the ledger, in batches", "batch", batch)
	} else {
		slog.Info("resuming the usage rollup's backfill", "after", p.At, "batch", batch)
	}
	var rows int64
	for {
		n, done, err := backfillOnce(ctx, db, batch)
		rows += n
		if err != nil {
			return fmt.Errorf("build the usage rollup from the ledger (%d rows done, resumes at the next start): %w", rows, err)
		}
		if done {
			slog.Info("usage rollup built from the ledger", "rows", rows)
			return nil
		}
		if backfillBatchDone != nil {
			backfillBatchDone()
		}
	}
}

// backfillOnce adds the next batch of rows to the rollup; done when the
// ledger has no more.
func backfillOnce(ctx context.Context, db *gorm.DB, batch int) (n int64, done bool, err error) {
	err = db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		q := tx.Where("name = ?", progressRollupBackfill)
		if tx.Dialector.Name() == "postgres" {
			// Two replicas starting at once take turns, batch by batch.
			q = q.Clauses(clause.Locking{Strength: "UPDATE"})
		}
		var p Progress
		if err := q.Take(&p).Error; err != nil {
			return fmt.Errorf("read the backfill's progress: %w", err)
		}
		if p.Done {
			done = true
			return nil
		}
		var rows []Usage
		// created_at >= ? lets both databases range over created_at's
		// index; the row value orders ties.
		err := tx.Where("created_at >= ? AND (created_at, inference_id) > (?, ?)", p.At.UTC(), p.At.UTC(), p.Key).
			Order("created_at, inference_id").Limit(batch).Find(&rows).Error
		if err != nil {
			return fmt.Errorf("read the ledger: %w", err)
		}
		r := NewRollup()
		r.hourlyFrom = time.Now().Add(-KeepHours)
		for i := range rows {
			u := &rows[i]
			if u.FinishedAt == nil || u.FinishedAt.Before(p.Until) {
				r.Add(u) // pending rows are skipped by Add
			}
		}
		if err := r.Apply(tx); err != nil {
			return err
		}
		if len(rows) > 0 {
			last := rows[len(rows)-1]
			p.At, p.Key = last.CreatedAt.UTC(), last.InferenceID
		}
		p.Done = len(rows) < batch
		n, done = int64(len(rows)), p.Done
		return saveProgress(tx, &p)
	})
	return n, done, err
}
