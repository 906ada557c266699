// Package testdb gives tests fresh databases: a SQLite file always, and a
// PostgreSQL schema of their own when MOONJI_TEST_POSTGRES_DSN is set (CI
// sets it). It returns Moonji database URLs, so a test opens them the way
// the server does.
package testdb

import (
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
)

// PostgresEnv names the variable that points the tests at a PostgreSQL server.
const PostgresEnv = "MOONJI_TEST_POSTGRES_DSN"

// URLs returns a maker of fresh database URLs per database the tests run
// on, by name ("sqlite", and "postgres" when configured). Each call of a
// maker returns a new, empty database that the test's cleanup removes.
func URLs() map[string]func(t testing.TB) string {
	urls := map[string]func(t testing.TB) string{
		"sqlite": func(t testing.TB) string { return "sqlite://" + t.TempDir() + "/moonji.db" },
	}
	if dsn := os.Getenv(PostgresEnv); dsn != "" {
		urls["postgres"] = func(t testing.TB) string { return PostgresSchema(t, dsn) }
	}
	return urls
}

// Each runs fn once per database, on a fresh one.
func Each(t *testing.T, fn func(t *testing.T, dbURL string)) {
	for name, mk := range URLs() {
		t.Run(name, func(t *testing.T) { fn(t, mk(t)) })
	}
}

// PostgresSchema creates a schema of its own for one test in the database
// dsn names and returns a URL whose search_path points at it; the test's
// cleanup drops it.
func PostgresSchema(t testing.TB, dsn string) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	schema := "moonji_test_" + hex.EncodeToString(b[:])
	admin, err := gorm.Open(postgres.Open(dsn), &gorm.Config{})
	if err != nil {
		t.Fatalf("connect to PostgreSQL (%s): %v", PostgresEnv, err)
	}
	if err := admin.Exec("CREATE SCHEMA " + schema).Error; err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		admin.Exec("DROP SCHEMA " + schema + " CASCADE")
		if sqlDB, err := admin.DB(); err == nil {
			sqlDB.Close()
		}
	})
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("parse %s: %v", PostgresEnv, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}
