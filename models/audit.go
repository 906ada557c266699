package models

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"
)

// AuditEvent is one change made by a person or a program that is not an
// inference (internal/audit): who did what to which target, when, from
// which address. The application only ever inserts these rows; retention
// is the one thing that deletes them.
type AuditEvent struct {
	ID uint64    `gorm:"primaryKey"`
	At time.Time `gorm:"not null;index"`
	// ActorID is the person who acted (0: nobody signed in, as for a
	// failed sign-in, or the system, as for a reload by SIGHUP).
	ActorID uint `gorm:"index"`
	// Actor is how the actor is shown: an email, "system", or what a
	// failed sign-in claimed to be.
	Actor string `gorm:"size:320"`
	// KeyID is the admin-scoped key a program acted with (0: a session).
	KeyID   uint   `gorm:"index"`
	Action  string `gorm:"size:64;not null;index"`
	Target  string `gorm:"size:320"`
	Address string `gorm:"size:64"`
	// Detail says what changed (never a secret).
	Detail string `gorm:"size:1000"`
}

// InsertAuditEvent appends e.
func InsertAuditEvent(ctx context.Context, db *gorm.DB, e *AuditEvent) error {
	e.Actor = Storable(e.Actor, 320)
	e.Target = Storable(e.Target, 320)
	e.Address = Storable(e.Address, 64)
	e.Detail = Storable(e.Detail, 1000)
	if err := db.WithContext(ctx).Create(e).Error; err != nil {
		return fmt.Errorf("insert audit event %s: %w", e.Action, err)
	}
	return nil
}
