package cli

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"moonji/internal/devidp"
	"moonji/models"
)

// `moonji people`: add a person with a development password read from
// stdin, list them, disable them (their sessions end) and enable them.
func TestPeopleAddListDisableEnable(t *testing.T) {
	cfg := writeConfig(t)
	dbURL := "sqlite://" + filepath.Join(filepath.Dir(cfg), "moonji.db")
	withStdin := func(s string) { stdin = strings.NewReader(s); t.Cleanup(func() { stdin = nil }) }
	user := func() *models.User {
		db, err := models.Open(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer models.Close(db)
		u, err := models.UserByEmail(context.Background(), db, "pia@example.com")
		if err != nil {
			t.Fatal(err)
		}
		return u
	}

	withStdin("short\n")
	if _, err := run(t, "people", "add", "--config", cfg, "--email", "pia@example.com", "--dev-password-stdin"); err == nil {
		t.Error("a 5-character password was accepted")
	}
	withStdin("correct horse battery\n")
	out, err := run(t, "people", "add", "--config", cfg, "--email", "Pia@Example.com", "--dev-password-stdin")
	if err != nil || !strings.Contains(out, "pia@example.com") {
		t.Fatalf("people add: %q, %v", out, err)
	}
	u := user()
	if !devidp.CheckPassword(u.PasswordHash, "correct horse battery") || u.Admin {
		t.Fatalf("added person: admin %v, password set %v", u.Admin, devidp.CheckPassword(u.PasswordHash, "correct horse battery"))
	}

	// A session of theirs, to see the disable end it.
	db, err := models.Open(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if err := models.CreateSession(context.Background(), db, &models.Session{ID: "s1", UserID: u.ID, LastSeenAt: now, ExpiresAt: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	models.Close(db)
	if out, err := run(t, "people", "disable", "--config", cfg, "pia@example.com"); err != nil || !strings.Contains(out, "1 sessions ended") {
		t.Fatalf("people disable: %q, %v", out, err)
	}
	if !user().Disabled() {
		t.Fatal("not disabled")
	}
	out, err = run(t, "people", "list", "--config", cfg, "--filter", "pia")
	if err != nil || !strings.Contains(out, "pia@example.com") || strings.Count(out, "\n") != 2 {
		t.Fatalf("people list: %q, %v", out, err)
	}
	if _, err := run(t, "people", "enable", "--config", cfg, "pia@example.com"); err != nil || user().Disabled() {
		t.Fatalf("people enable: %v, still disabled: %v", err, user().Disabled())
	}
	if _, err := run(t, "people", "disable", "--config", cfg, "nobody@example.com"); err == nil {
		t.Error("disabling an unknown email succeeded")
	}
	for _, bad := range [][]string{{"people"}, {"people", "add"}, {"people", "frobnicate"}, {"people", "disable"}} {
		if _, err := run(t, bad...); err == nil {
			t.Errorf("%v was accepted", bad)
		}
	}
}
