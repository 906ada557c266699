package audit

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"gorm.io/gorm"

	"moonji/internal/usageexport"
	"moonji/models"
)

// Fields are the export's field names, in order; scripts depend on them:
// add, never rename.
var Fields = []string{"id", "at", "action", "actor_id", "actor", "key_id", "target", "address", "detail"}

// Row is one event as exported.
type Row struct {
	ID      uint64 `json:"id"`
	At      string `json:"at"`
	Action  string `json:"action"`
	ActorID uint   `json:"actor_id"`
	Actor   string `json:"actor"`
	KeyID   uint   `json:"key_id"`
	Target  string `json:"target"`
	Address string `json:"address"`
	Detail  string `json:"detail"`
}

// FromEvent is the exported form of e.
func FromEvent(e *models.AuditEvent) Row {
	return Row{ID: e.ID, At: e.At.UTC().Format(time.RFC3339Nano), Action: e.Action, ActorID: e.ActorID, Actor: e.Actor,
		KeyID: e.KeyID, Target: e.Target, Address: e.Address, Detail: e.Detail}
}

// CSV is the row's cells in the order of Fields. Every text cell goes
// through usageexport.CSVText: a failed sign-in's actor and a team's name
// are anyone's text, and a spreadsheet would run "=HYPERLINK(…)" in one.
func (r Row) CSV() []string {
	t := usageexport.CSVText
	return []string{strconv.FormatUint(r.ID, 10), r.At, t(r.Action), strconv.FormatUint(uint64(r.ActorID), 10), t(r.Actor),
		strconv.FormatUint(uint64(r.KeyID), 10), t(r.Target), t(r.Address), t(r.Detail)}
}

// exportBatch is how many events an export reads at a time.
const exportBatch = 500

// Write streams the events f chooses to w in format (usageexport.CSV with
// a header line, or usageexport.JSONL), newest first, one batch in memory
// at a time. flushed, when not nil, is called after each batch has been
// handed to w (a caller serving a slow client renews its write deadline).
func Write(ctx context.Context, db *gorm.DB, w io.Writer, format string, f models.AuditFilter, flushed func() error) error {
	rows := usageexport.Format[*models.AuditEvent]{
		Header: Fields,
		CSV:    func(e *models.AuditEvent) []string { return FromEvent(e).CSV() },
		JSON:   func(e *models.AuditEvent) any { return FromEvent(e) },
	}
	err := usageexport.Stream(w, format, rows, func(emit func(*models.AuditEvent) error) error {
		return models.EachAuditEvent(ctx, db, f, exportBatch, emit)
	}, flushed)
	if err != nil {
		return fmt.Errorf("audit export: %w", err)
	}
	return nil
}
