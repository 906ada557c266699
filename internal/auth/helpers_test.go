package auth

import (
	"io"
	"log/slog"
	"testing"

	"gorm.io/gorm"

	"moonji/models"
)

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// testDB is a fresh SQLite database with the full schema.
func testDB(t *testing.T) *gorm.DB {
	t.Helper()
	db, err := models.Open("sqlite://" + t.TempDir() + "/auth.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { models.Close(db) })
	return db
}

// testService is a Service on a fresh database whose provider is never
// contacted (tests of sessions and users).
func testService(t *testing.T, admin AdminRule) *Service {
	t.Helper()
	s, err := New(Options{DB: testDB(t), Log: quietLog(), PublicURL: "http://127.0.0.1:1",
		Provider: Provider{Issuer: "https://idp.example.com", ClientID: "moonji"}, Admin: admin})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
