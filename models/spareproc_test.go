package models

import (
	"path/filepath"
	"runtime"
	"testing"

	"gorm.io/gorm"

	"moonji/internal/spareproc"
	"moonji/internal/testcpu"
)

// TestSQLiteStatementsRunWithASpareP checks, in a process confined to one
// CPU, that every kind of statement gorm runs on SQLite has the second P
// lent while it runs, and that the P is given back afterwards.
func TestSQLiteStatementsRunWithASpareP(t *testing.T) {
	if !testcpu.OnOne(t) {
		return
	}
	db := openTestDB(t, "sqlite://"+filepath.Join(t.TempDir(), "m.db"))
	spareproc.Enable()
	seen := map[string]int{}
	record := func(kind string) func(*gorm.DB) {
		return func(*gorm.DB) { seen[kind] = runtime.GOMAXPROCS(0) }
	}
	cb := db.Callback()
	for _, err := range []error{
		cb.Create().After("gorm:create").Register("test:procs", record("create")),
		cb.Query().After("gorm:query").Register("test:procs", record("query")),
		cb.Update().After("gorm:update").Register("test:procs", record("update")),
		cb.Delete().After("gorm:delete").Register("test:procs", record("delete")),
		cb.Row().After("gorm:row").Register("test:procs", record("row")),
		cb.Raw().After("gorm:raw").Register("test:procs", record("raw")),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	testcpu.WaitForOneP(t)

	u := User{Subject: "s", Email: "a@example.com", Name: "A"}
	if err := db.Create(&u).Error; err != nil {
		t.Fatal(err)
	}
	testcpu.WaitForOneP(t)
	var got User
	if err := db.First(&got, u.ID).Error; err != nil {
		t.Fatal(err)
	}
	testcpu.WaitForOneP(t)
	if err := db.Model(&got).Update("name", "B").Error; err != nil {
		t.Fatal(err)
	}
	testcpu.WaitForOneP(t)
	var n int
	if err := db.Raw("SELECT count(*) FROM users").Row().Scan(&n); err != nil {
		t.Fatal(err)
	}
	testcpu.WaitForOneP(t)
	if err := db.Exec("UPDATE users SET name = 'C'").Error; err != nil {
		t.Fatal(err)
	}
	testcpu.WaitForOneP(t)
	if err := db.Delete(&got).Error; err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{"create", "query", "update", "row", "raw", "delete"} {
		if seen[kind] != 2 {
			t.Errorf("GOMAXPROCS during a %s statement: %d, want 2", kind, seen[kind])
		}
	}
	testcpu.WaitForOneP(t)
}
