package auth

import (
	"bytes"
	"context"
	"log/slog"
	"regexp"
	"strings"
	"testing"

	"moonji/internal/devidp"
	"moonji/models"
)

func TestBootstrapDevAdmin(t *testing.T) {
	ctx := context.Background()
	db := testDB(t)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))

	// Without a password one is generated and logged once.
	if err := BootstrapDevAdmin(ctx, db, log, "admin@localhost", ""); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`password=(\S+)`).FindStringSubmatch(logs.String())
	if m == nil {
		t.Fatalf("no password logged: %s", logs.String())
	}
	u, err := models.UserByEmail(ctx, db, "admin@localhost")
	if err != nil || !u.Admin || !devidp.CheckPassword(u.PasswordHash, m[1]) || bytes.Contains(u.PasswordHash, []byte(m[1])) {
		t.Fatalf("admin %+v (err %v): want an admin with the logged password, stored as bcrypt", u, err)
	}
	logs.Reset()
	if err := BootstrapDevAdmin(ctx, db, log, "admin@localhost", ""); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(logs.String(), "password=") {
		t.Errorf("second start logged a password again: %s", logs.String())
	}

	// The environment's password wins, and is never logged.
	if err := BootstrapDevAdmin(ctx, db, log, "admin@localhost", "from-env-password"); err != nil {
		t.Fatal(err)
	}
	u, _ = models.UserByEmail(ctx, db, "admin@localhost")
	if !devidp.CheckPassword(u.PasswordHash, "from-env-password") || strings.Contains(logs.String(), "from-env-password") {
		t.Errorf("env password not applied, or logged: %s", logs.String())
	}

	// The provider sees the user through DevAccounts.
	acc, err := DevAccounts{DB: db}.AccountByEmail(ctx, "ADMIN@localhost")
	if err != nil || acc == nil || !acc.Admin || acc.Email != "admin@localhost" {
		t.Fatalf("AccountByEmail = %+v, %v", acc, err)
	}
	bySub, err := DevAccounts{DB: db}.AccountBySubject(ctx, acc.Subject)
	if err != nil || bySub == nil || bySub.Email != acc.Email {
		t.Fatalf("AccountBySubject = %+v, %v", bySub, err)
	}
	for _, sub := range []string{"", "x", "0", "999"} {
		if a, err := (DevAccounts{DB: db}).AccountBySubject(ctx, sub); a != nil || err != nil {
			t.Errorf("AccountBySubject(%q) = %+v, %v; want nil, nil", sub, a, err)
		}
	}
}
