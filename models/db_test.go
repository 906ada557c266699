package models

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
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
