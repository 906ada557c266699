package models

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"
)

// Every SQLite connection of the pool runs with the pragmas Open sets, the
// page cache's bound among them (db.go says why each).
func TestSQLitePragmasOnEveryConnection(t *testing.T) {
	db, err := Open("sqlite://" + filepath.Join(t.TempDir(), "m.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer Close(db)
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Three connections held at once, so that they are three.
	var conns []*sql.Conn
	for range 3 {
		c, err := sqlDB.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	for i, c := range conns {
		for _, p := range []struct {
			pragma, want string
		}{
			{"journal_mode", "wal"},
			{"synchronous", "1"},
			{"temp_store", "2"},
			{"cache_size", "-256"},
		} {
			var got string
			if err := c.QueryRowContext(ctx, "PRAGMA "+p.pragma).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != p.want {
				t.Errorf("connection %d: PRAGMA %s = %s, want %s", i, p.pragma, got, p.want)
			}
		}
	}
}

// Migrate on a database whose schema is up to date changes nothing. gorm's
// AutoMigrate changes a SQLite column by rebuilding its table, which drops
// the table's triggers (the search index's among them), and it takes a
// column length the driver reports other than the field's size for a
// change: modernc.org/sqlite's own driver, which reports a text column's
// length as unlimited, would rebuild every table with a sized NOT NULL
// column at every start (found when that driver was tried, and not kept,
// for the ledger's statements). The driver in use reports none.
func TestMigrateKeepsTables(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		seedConversation(t, db, 1, "A title", time.Now(), "a question", "an answer")
		if err := db.Create(&Usage{InferenceID: "inf_1", Outcome: OutcomeSuccess, Model: "m", Source: "api"}).Error; err != nil {
			t.Fatal(err)
		}
		// A ledger row without its rollup is an upgrade: the first Migrate
		// builds the rollup from the ledger (rollup_backfill.go); the
		// schema and the rollup are then up to date.
		if err := Migrate(db); err != nil {
			t.Fatal(err)
		}
		changes := migrationWrites(t, db, "CREATE", "ALTER", "DROP", "INSERT", "UPDATE", "DELETE")
		for _, c := range changes {
			t.Errorf("Migrate of an up-to-date schema ran %s", c)
		}
	})
}

// migrationWrites runs Migrate on db and returns the statements it ran that
// start with one of verbs.
func migrationWrites(t *testing.T, db *gorm.DB, verbs ...string) []string {
	t.Helper()
	var changes []string
	record := func(tx *gorm.DB) {
		q := strings.ToUpper(strings.TrimSpace(tx.Statement.SQL.String()))
		for _, verb := range verbs {
			if strings.HasPrefix(q, verb) {
				changes = append(changes, tx.Statement.SQL.String())
			}
		}
	}
	if err := db.Callback().Raw().After("gorm:raw").Register("test:record", record); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = db.Callback().Raw().Remove("test:record") }()
	if err := Migrate(db); err != nil {
		t.Fatal(err)
	}
	return changes
}
