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
// for minutes, and an interrupted start began again from nothing. Added
// in the database (backfillOnce), a batch of 50,000 takes about a second
// on a loaded 2-core machine.
const backfillBatch = 50_000

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

// backfillOnce adds the next batch of ledger rows to the rollup, set-based:
// it finds where the batch ends (the batch-th row after the cursor), then
// one INSERT … SELECT … GROUP BY per rollup table adds the batch's sums in
// the database (Rollup.Add's twin in SQL: rollup_sql.go), and the cursor moves
// in the same transaction. Reading each row into Go and adding it there
// went at ~5,000 rows/s: 33 minutes of start-up for ten million rows.
// done when the ledger has no more rows after this batch.
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
		// created_at >= ? lets both databases range over created_at's
		// index; the row value orders ties.
		var last []struct {
			CreatedAt   time.Time
			InferenceID string
		}
		err := tx.Model(&Usage{}).Select("created_at, inference_id").
			Where("created_at >= ? AND (created_at, inference_id) > (?, ?)", p.At.UTC(), p.At.UTC(), p.Key).
			Order("created_at, inference_id").Limit(1).Offset(batch - 1).Find(&last).Error
		if err != nil {
			return fmt.Errorf("find the end of the batch: %w", err)
		}
		r := rollupRange{after: p.At.UTC(), afterKey: p.Key, finishedBefore: p.Until.UTC(), hourlyFrom: time.Now().UTC().Add(-KeepHours)}
		if len(last) > 0 {
			r.through, r.throughKey = last[0].CreatedAt.UTC(), last[0].InferenceID
			n = int64(batch)
		} else {
			// The last batch: everything after the cursor.
			if err := r.where(tx.Model(&Usage{})).Count(&n).Error; err != nil {
				return fmt.Errorf("count the last batch: %w", err)
			}
		}
		if err := r.apply(tx); err != nil {
			return err
		}
		if len(last) > 0 {
			p.At, p.Key = r.through, r.throughKey
		}
		p.Done = len(last) == 0
		done = p.Done
		return saveProgress(tx, &p)
	})
	return n, done, err
}
