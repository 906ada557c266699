package gateway

import (
	"log/slog"
	"testing"

	"gorm.io/gorm"

	"moonji/internal/ledger"
	"moonji/internal/testdb"
	"moonji/models"
)

// newTestLedger opens a fresh SQLite test database and a ledger writing to
// it, both closed when t ends (the ledger first), and returns them with a
// logger that discards everything, for the ledger and the gateway alike.
func newTestLedger(t *testing.T) (*gorm.DB, *ledger.Ledger, *slog.Logger) {
	t.Helper()
	db, err := models.Open(testdb.URLs()["sqlite"](t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { models.Close(db) })
	quiet := slog.New(slog.DiscardHandler)
	led := ledger.New(db, quiet)
	t.Cleanup(led.Close)
	return db, led, quiet
}
