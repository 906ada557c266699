package cli

import (
	"context"
	"log/slog"

	"gorm.io/gorm"

	"moonji/internal/audit"
)

// record appends an audit event of a command: the actor is "cli" and the
// operating system's user (audit.CLI); nobody signed in, no address.
// A record that cannot be written is logged, the change stands.
func record(ctx context.Context, db *gorm.DB, action, target, detail string) {
	audit.New(db, slog.Default()).Record(ctx, audit.Event{Actor: audit.CLI(), Action: action, Target: target, Detail: detail})
}
