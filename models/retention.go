package models

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Retention's deletes (internal/retention decides when and how many). Each
// call deletes one batch, chosen through an index on the rows' age, in one
// short statement or transaction, so that the ledger's writer waits at most
// one batch; deleting what another replica just deleted deletes nothing, so
// several replicas may prune at once.

// MarkUsageKept records that ledger rows created before before may be
// deleted from now on: RebuildRollup then leaves the rollups of those
// periods alone, since the ledger no longer holds what they sum. Call it
// before PruneUsage.
func MarkUsageKept(ctx context.Context, db *gorm.DB, before time.Time) error {
	return raiseUsageKeptFrom(ctx, db, before)
}

// PruneUsage deletes up to limit final ledger rows created before before,
// oldest first, and returns how many it deleted. Pending rows stay: their
// request may still be running, and the rollup counts a row only when it
// turns final. The rollups are not touched. A run of many batches should
// use a UsagePruner instead.
func PruneUsage(ctx context.Context, db *gorm.DB, before time.Time, limit int) (int64, error) {
	n, _, err := pruneUsage(ctx, db, time.Time{}, before, limit)
	return n, err
}

// UsagePruner returns a PruneUsage whose batches each start where the last
// one ended. On PostgreSQL the index entries of the rows a batch deleted
// stay until a vacuum removes them, and a batch that began at the oldest
// row would step over every one of them: with millions of rows deleted in a
// run, each batch slower than the last.
func UsagePruner() func(ctx context.Context, db *gorm.DB, before time.Time, limit int) (int64, error) {
	var from time.Time
	return func(ctx context.Context, db *gorm.DB, before time.Time, limit int) (int64, error) {
		n, last, err := pruneUsage(ctx, db, from, before, limit)
		if n > 0 {
			from = last
		}
		return n, err
	}
}

// pruneUsage deletes up to limit final rows created in [from, before),
// oldest first, and returns how many and the creation time of the newest.
func pruneUsage(ctx context.Context, db *gorm.DB, from, before time.Time, limit int) (int64, time.Time, error) {
	var rows []struct {
		InferenceID string
		CreatedAt   time.Time
	}
	q := db.WithContext(ctx).Model(&Usage{}).Select("inference_id, created_at").
		Where("created_at < ? AND outcome <> ?", before.UTC(), OutcomePending)
	if !from.IsZero() {
		q = q.Where("created_at >= ?", from.UTC())
	}
	if err := q.Order("created_at").Limit(limit).Find(&rows).Error; err != nil {
		return 0, time.Time{}, fmt.Errorf("find usage rows before %s: %w", before.UTC().Format(time.DateOnly), err)
	}
	if len(rows) == 0 {
		return 0, time.Time{}, nil
	}
	ids := make([]string, len(rows))
	for i, r := range rows {
		ids[i] = r.InferenceID
	}
	// Deleting what another replica deleted meanwhile deletes nothing.
	res := db.WithContext(ctx).Where("inference_id IN ?", ids).Delete(&Usage{})
	if res.Error != nil {
		return 0, time.Time{}, fmt.Errorf("delete usage rows before %s: %w", before.UTC().Format(time.DateOnly), res.Error)
	}
	return res.RowsAffected, rows[len(rows)-1].CreatedAt, nil
}

// PruneConversations deletes up to limit conversations last active before
// before, oldest first, with everything that hangs off them (attachments,
// messages — and so their search index entries —, share links), in one
// transaction; it returns how many conversations it deleted. A
// conversation with a reply still streaming is left for the next run.
func PruneConversations(ctx context.Context, db *gorm.DB, before time.Time, limit int) (int64, error) {
	var deleted int64
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		q := tx.Model(&Conversation{}).Select("id").Where("updated_at < ?", before.UTC()).
			Where("NOT EXISTS (SELECT 1 FROM messages m WHERE m.conversation_id = conversations.id AND m.status = ?)", MessageStreaming).
			Order("updated_at").Limit(limit)
		if tx.Dialector.Name() == "postgres" {
			// A message arriving meanwhile moves updated_at: it waits for
			// this transaction, or this one skips the conversation.
			q = q.Clauses(clause.Locking{Strength: "UPDATE", Options: "SKIP LOCKED"})
		}
		var ids []string
		if err := q.Find(&ids).Error; err != nil {
			return fmt.Errorf("find old conversations: %w", err)
		}
		if len(ids) == 0 {
			return nil
		}
		for _, dep := range []struct {
			what  string
			model any
		}{{"attachments", &Attachment{}}, {"messages", &Message{}}, {"share links", &Share{}}} {
			if err := tx.Where("conversation_id IN ?", ids).Delete(dep.model).Error; err != nil {
				return fmt.Errorf("delete the %s of old conversations: %w", dep.what, err)
			}
		}
		res := tx.Where("id IN ?", ids).Delete(&Conversation{})
		if res.Error != nil {
			return fmt.Errorf("delete old conversations: %w", res.Error)
		}
		deleted = res.RowsAffected
		return nil
	})
	return deleted, err
}

// IncrementalVacuum gives up to pages free pages of a SQLite database back
// to the file system and returns how many free pages are left. It does
// nothing (0, nil) on PostgreSQL, and on a SQLite database whose
// auto_vacuum is not INCREMENTAL (one made before Moonji set it: see
// README, Retention).
func IncrementalVacuum(ctx context.Context, db *gorm.DB, pages int) (left int64, err error) {
	if db.Dialector.Name() != "sqlite" {
		return 0, nil
	}
	mode, err := sqlitePragma(ctx, db, "auto_vacuum")
	if err != nil || mode != 2 { // 2: INCREMENTAL
		return 0, err
	}
	// The statement returns a row per page it frees, one per step: Exec
	// steps once (it freed 1 page of 50 asked), Scan reads them all.
	var freed []int
	if err := db.WithContext(ctx).Raw(fmt.Sprintf("PRAGMA incremental_vacuum(%d)", pages)).Scan(&freed).Error; err != nil {
		return 0, fmt.Errorf("incremental vacuum: %w", err)
	}
	return sqlitePragma(ctx, db, "freelist_count")
}

// SQLiteAutoVacuum reports a SQLite database's auto_vacuum mode (0 NONE,
// 1 FULL, 2 INCREMENTAL); -1 on PostgreSQL.
func SQLiteAutoVacuum(ctx context.Context, db *gorm.DB) (int64, error) {
	if db.Dialector.Name() != "sqlite" {
		return -1, nil
	}
	return sqlitePragma(ctx, db, "auto_vacuum")
}

func sqlitePragma(ctx context.Context, db *gorm.DB, name string) (int64, error) {
	var v int64
	if err := db.WithContext(ctx).Raw("PRAGMA " + name).Scan(&v).Error; err != nil {
		return 0, fmt.Errorf("read PRAGMA %s: %w", name, err)
	}
	return v, nil
}
