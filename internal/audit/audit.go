// Package audit records the changes people and programs make that are not
// inferences — keys, budgets, model lists, people, teams, share links,
// sign-ins, configuration reloads — as append-only rows (models.AuditEvent).
//
// Recording never fails the change it records: the change has happened, so
// an audit row that cannot be written is logged loudly instead.
package audit

import (
	"context"
	"log/slog"
	"time"

	"gorm.io/gorm"

	"moonji/models"
)

// Actions recorded. Names are "object.verb", stable: exports and filters
// rely on them.
const (
	KeyCreate      = "key.create"
	KeyUpdate      = "key.update"
	KeyRevoke      = "key.revoke"
	BudgetUpdate   = "budget.update"
	ModelsUpdate   = "models.update"
	PersonDisable  = "person.disable"
	PersonEnable   = "person.enable"
	PersonUpdate   = "person.update"
	TeamCreate     = "team.create"
	TeamUpdate     = "team.update"
	TeamDelete     = "team.delete"
	ShareCreate    = "share.create"
	ShareRevoke    = "share.revoke"
	SignIn         = "signin"
	SignInFailed   = "signin.failed"
	SignOut        = "signout"
	ConfigReload   = "config.reload"
	ConfigRejected = "config.reload_failed"
	// A team's members: who was put in or taken out (the team is the
	// target, the person the detail).
	TeamMemberAdd    = "team.member_add"
	TeamMemberRemove = "team.member_remove"
)

// Event is one change. Actor fields say who acted; Target names what was
// changed (e.g. "key 42", "person a@b.c"); Detail what changed, never a
// secret.
type Event struct {
	ActorID uint
	Actor   string
	KeyID   uint
	Action  string
	Target  string
	Address string
	Detail  string
}

// Log writes events to the database.
type Log struct {
	db  *gorm.DB
	log *slog.Logger
	now func() time.Time
}

// New returns a Log writing to db; failures go to log.
func New(db *gorm.DB, log *slog.Logger) *Log {
	return &Log{db: db, log: log, now: time.Now}
}

// Record appends e. A nil Log records nothing (tests, tools).
func (l *Log) Record(ctx context.Context, e Event) {
	if l == nil {
		return
	}
	row := models.AuditEvent{At: l.now().UTC(), ActorID: e.ActorID, Actor: e.Actor, KeyID: e.KeyID,
		Action: e.Action, Target: e.Target, Address: e.Address, Detail: e.Detail}
	// The change is made: its record must not be lost to the caller's
	// context ending (a client that left right after its POST).
	ctx = context.WithoutCancel(ctx)
	if err := models.InsertAuditEvent(ctx, l.db, &row); err != nil {
		l.log.Error("audit event not recorded", "action", e.Action, "actor", e.Actor, "target", e.Target, "err", err)
	}
}
