package models

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Progress is where long database work records how far it got, so that an
// interrupted run (a stopped process, a cancelled context) resumes where it
// stopped instead of starting over: a migration's backfill keeps its cursor
// here, and retention the oldest instant whose ledger rows are all still
// there (UsageKeptFrom).
type Progress struct {
	Name string `gorm:"primaryKey;size:64"`
	// At and Key are a cursor: the (created_at, id) of the last row done.
	At  time.Time
	Key string `gorm:"size:200"`
	// Until bounds the work to what existed when it began.
	Until     time.Time
	Done      bool `gorm:"not null;default:false"`
	UpdatedAt time.Time
}

// TableName names the table for what it holds.
func (Progress) TableName() string { return "progress_marks" }

// Names of the progress rows.
const (
	progressRollupBackfill = "rollup_backfill"
	progressUsageKeptFrom  = "retention_usage_kept_from"
)

// progressOf returns the row named name, or nil.
func progressOf(ctx context.Context, db *gorm.DB, name string) (*Progress, error) {
	var p Progress
	err := db.WithContext(ctx).Where("name = ?", name).Take(&p).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read progress %s: %w", name, err)
	}
	return &p, nil
}

// saveProgress writes p whole.
func saveProgress(tx *gorm.DB, p *Progress) error {
	p.UpdatedAt = time.Now().UTC()
	if err := tx.Clauses(clause.OnConflict{UpdateAll: true}).Create(p).Error; err != nil {
		return fmt.Errorf("save progress %s: %w", p.Name, err)
	}
	return nil
}

// UsageKeptFrom returns the instant from which the ledger is whole: rows
// created before it may have been deleted by retention (their rollups
// stay). The zero time: nothing was ever deleted.
func UsageKeptFrom(ctx context.Context, db *gorm.DB) (time.Time, error) {
	p, err := progressOf(ctx, db, progressUsageKeptFrom)
	if err != nil || p == nil {
		return time.Time{}, err
	}
	return p.At.UTC(), nil
}

// raiseUsageKeptFrom moves UsageKeptFrom forward to at (never back).
func raiseUsageKeptFrom(ctx context.Context, db *gorm.DB, at time.Time) error {
	at = at.UTC()
	p := &Progress{Name: progressUsageKeptFrom, At: at, Done: true, UpdatedAt: time.Now().UTC()}
	// Two replicas may run retention at once: the later instant wins.
	err := db.WithContext(ctx).Clauses(clause.OnConflict{
		Columns:   []clause.Column{{Name: "name"}},
		DoUpdates: clause.AssignmentColumns([]string{"at", "updated_at"}),
		Where:     clause.Where{Exprs: []clause.Expression{clause.Expr{SQL: "progress_marks.at < excluded.at"}}},
	}).Create(p).Error
	if err != nil {
		return fmt.Errorf("record where the ledger is whole from: %w", err)
	}
	return nil
}
