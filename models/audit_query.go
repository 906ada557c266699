package models

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"
)

// AuditFilter chooses audit events: each set field narrows the choice.
type AuditFilter struct {
	// Action is one action exactly ("": any).
	Action string
	// Actor and Target keep events whose actor or target contains them,
	// cases ignored, LIKE's wildcards taken literally.
	Actor, Target string
	// From and To bound the events' time: From inclusive, To exclusive
	// (zero: unbounded).
	From, To time.Time
	// Before keeps events whose id is below it (0: from the newest): the
	// cursor of a page, so that the next one starts where it stopped
	// whatever is recorded meanwhile, at the cost of one index probe
	// rather than an OFFSET's scan of every row skipped.
	Before uint64
}

// where applies f to q.
func (f AuditFilter) where(q *gorm.DB) *gorm.DB {
	if f.Action != "" {
		q = q.Where("action = ?", f.Action)
	}
	if f.Actor != "" {
		q = q.Where(`LOWER(actor) LIKE ? ESCAPE '\'`, lowerContains(f.Actor))
	}
	if f.Target != "" {
		q = q.Where(`LOWER(target) LIKE ? ESCAPE '\'`, lowerContains(f.Target))
	}
	if !f.From.IsZero() {
		q = q.Where("at >= ?", f.From.UTC())
	}
	if !f.To.IsZero() {
		q = q.Where("at < ?", f.To.UTC())
	}
	if f.Before != 0 {
		q = q.Where("id < ?", f.Before)
	}
	return q
}

// lowerContains is a LIKE pattern matching s anywhere, lower-cased (the
// column is lowered too: PostgreSQL's LIKE tells cases apart), its own %
// and _ taken literally.
func lowerContains(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)
	return "%" + r.Replace(strings.ToLower(StorableText(s))) + "%"
}

// ListAuditEvents returns up to limit events f chooses, newest first; more
// is true when older ones follow (the next page: Before = the last id).
func ListAuditEvents(ctx context.Context, db *gorm.DB, f AuditFilter, limit int) (rows []AuditEvent, more bool, err error) {
	q := f.where(db.WithContext(ctx).Model(&AuditEvent{}))
	if err := q.Order("id DESC").Limit(limit + 1).Find(&rows).Error; err != nil {
		return nil, false, fmt.Errorf("list audit events: %w", err)
	}
	if len(rows) > limit {
		rows, more = rows[:limit], true
	}
	return rows, more, nil
}

// EachAuditEvent calls fn with every event f chooses, newest first, read
// batch rows at a time by id: an export of a large log holds one batch in
// memory and no query open while fn writes to a slow client.
func EachAuditEvent(ctx context.Context, db *gorm.DB, f AuditFilter, batch int, fn func(*AuditEvent) error) error {
	for {
		rows, more, err := ListAuditEvents(ctx, db, f, batch)
		if err != nil {
			return err
		}
		for i := range rows {
			if err := fn(&rows[i]); err != nil {
				return err
			}
		}
		if !more || len(rows) == 0 {
			return nil
		}
		f.Before = rows[len(rows)-1].ID
	}
}

// DeleteAuditEventsBefore deletes the events recorded before cutoff, batch
// rows per statement (oldest first), so that each statement holds its locks
// briefly; it returns how many it deleted. Retention is the only caller:
// nothing else in the application deletes or updates audit rows. A
// cancelled ctx stops it between batches with what it deleted so far.
func DeleteAuditEventsBefore(ctx context.Context, db *gorm.DB, cutoff time.Time, batch int) (int64, error) {
	if batch <= 0 {
		return 0, errors.New("delete audit events: batch must be positive")
	}
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		var ids []uint64
		err := db.WithContext(ctx).Model(&AuditEvent{}).Where("at < ?", cutoff.UTC()).Order("id").Limit(batch).Pluck("id", &ids).Error
		if err != nil {
			return total, fmt.Errorf("find old audit events: %w", err)
		}
		if len(ids) == 0 {
			return total, nil
		}
		res := db.WithContext(ctx).Where("id IN ?", ids).Delete(&AuditEvent{})
		if res.Error != nil {
			return total, fmt.Errorf("delete old audit events: %w", res.Error)
		}
		total += res.RowsAffected
		if len(ids) < batch {
			return total, nil
		}
	}
}

// auditNoUpdateTrigger refuses an UPDATE of audit_events in the database
// itself: the application never updates them, so one that does (a bug, a
// hand-written statement) fails loudly instead of rewriting history.
// DELETE stays allowed, for retention.
const auditNoUpdateTrigger = "audit_events_no_update"

// migrateAudit installs auditNoUpdateTrigger, on SQLite and PostgreSQL.
func migrateAudit(db *gorm.DB) error {
	if db.Dialector.Name() != "postgres" {
		// Looked for first: a migration of an up-to-date schema runs no DDL.
		var n int64
		if err := db.Raw("SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND name = ?", auditNoUpdateTrigger).
			Scan(&n).Error; err != nil {
			return fmt.Errorf("look for the audit trigger: %w", err)
		}
		if n > 0 {
			return nil
		}
		err := db.Exec("CREATE TRIGGER IF NOT EXISTS " + auditNoUpdateTrigger +
			" BEFORE UPDATE ON audit_events BEGIN SELECT RAISE(ABORT, 'audit events are append-only'); END").Error
		if err != nil {
			return fmt.Errorf("migrate audit trigger: %w", err)
		}
		return nil
	}
	has := func(tx *gorm.DB) (bool, error) {
		var n int64
		err := tx.Raw("SELECT count(*) FROM pg_trigger WHERE tgname = ? AND tgrelid = to_regclass('audit_events')",
			auditNoUpdateTrigger).Scan(&n).Error
		return n > 0, err
	}
	if ok, err := has(db); err != nil || ok {
		if err != nil {
			return fmt.Errorf("look for the audit trigger: %w", err)
		}
		return nil
	}
	// Replicas starting together take turns; the one that waited finds
	// the trigger made.
	return db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("SELECT pg_advisory_xact_lock(?)", auditMigrationKey).Error; err != nil {
			return fmt.Errorf("migrate audit: lock: %w", err)
		}
		if ok, err := has(tx); err != nil || ok {
			return err
		}
		for _, st := range []string{
			`CREATE OR REPLACE FUNCTION moonji_audit_no_update() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN
					RAISE EXCEPTION 'audit events are append-only';
				END
				$$`,
			"CREATE TRIGGER " + auditNoUpdateTrigger + " BEFORE UPDATE ON audit_events FOR EACH ROW EXECUTE FUNCTION moonji_audit_no_update()",
		} {
			if err := tx.Exec(st).Error; err != nil {
				return fmt.Errorf("migrate audit trigger: %w", err)
			}
		}
		return nil
	})
}

// auditMigrationKey is migrateAudit's PostgreSQL advisory lock: "moonji",
// issue 47.
const auditMigrationKey = 0x6d6f6f6e6a69002f
