package auth

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
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

	// Without a password one is generated and written to a file only its
	// owner can read; the log says where, never what.
	file := filepath.Join(t.TempDir(), "sub", DevAdminPasswordFile)
	if err := BootstrapDevAdmin(ctx, db, log, "admin@localhost", "", file); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("no password file: %v", err)
	}
	password := strings.TrimSpace(string(b))
	if st, _ := os.Stat(file); st == nil || st.Mode().Perm() != 0o600 {
		t.Errorf("password file mode = %v, want 0600", st.Mode().Perm())
	}
	if password == "" || strings.Contains(logs.String(), password) || !strings.Contains(logs.String(), file) {
		t.Fatalf("the log must name the file and not hold the password: %s", logs.String())
	}
	u, err := models.UserByEmail(ctx, db, "admin@localhost")
	if err != nil || !u.Admin || !devidp.CheckPassword(u.PasswordHash, password) || bytes.Contains(u.PasswordHash, []byte(password)) {
		t.Fatalf("admin %+v (err %v): want an admin with the file's password, stored as bcrypt", u, err)
	}
	logs.Reset()
	if err := BootstrapDevAdmin(ctx, db, log, "admin@localhost", "", file); err != nil {
		t.Fatal(err)
	}
	if b2, _ := os.ReadFile(file); string(b2) != string(b) || strings.Contains(logs.String(), password) {
		t.Errorf("second start changed the file or logged the password: %s", logs.String())
	}

	// The environment's password wins, and is never logged.
	if err := BootstrapDevAdmin(ctx, db, log, "admin@localhost", "from-env-password", file); err != nil {
		t.Fatal(err)
	}
	u, _ = models.UserByEmail(ctx, db, "admin@localhost")
	if !devidp.CheckPassword(u.PasswordHash, "from-env-password") || strings.Contains(logs.String(), "from-env-password") {
		t.Errorf("env password not applied, or logged: %s", logs.String())
	}
	// The generated password no longer works; its file goes.
	if _, err := os.Stat(file); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("stale password file kept: %v", err)
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

// TestBootstrapDevAdminUnwritableFile checks that a password that cannot be
// written down is not stored either: nobody could sign in with it.
func TestBootstrapDevAdminUnwritableFile(t *testing.T) {
	ctx := context.Background()
	db := testDB(t)
	blocker := filepath.Join(t.TempDir(), "not-a-dir")
	if err := os.WriteFile(blocker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	err := BootstrapDevAdmin(ctx, db, quietLog(), "admin@localhost", "", filepath.Join(blocker, DevAdminPasswordFile))
	if err == nil {
		t.Fatal("no error when the password file cannot be written")
	}
	if u, err := models.UserByEmail(ctx, db, "admin@localhost"); err != nil || len(u.PasswordHash) != 0 {
		t.Errorf("a password was stored anyway: %+v %v", u, err)
	}
}

func TestDevAdminPasswordPath(t *testing.T) {
	for in, want := range map[string]string{
		"sqlite://data/moonji.db":            "data/" + DevAdminPasswordFile,
		"sqlite:///var/lib/moonji/m.db?_x=1": "/var/lib/moonji/" + DevAdminPasswordFile,
		"sqlite://moonji.db":                 DevAdminPasswordFile,
		"sqlite://:memory:":                  "data/" + DevAdminPasswordFile,
		"postgres://u:secret@db/moonji":      "data/" + DevAdminPasswordFile,
	} {
		if got := DevAdminPasswordPath(in); got != want {
			t.Errorf("DevAdminPasswordPath(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestBootstrapDevAdminReplacesOpenFile checks that a password file left
// readable by others (or a symlink in its place) does not receive the new
// password: it is replaced by a fresh 0600 file.
func TestBootstrapDevAdminReplacesOpenFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, DevAdminPasswordFile)
	elsewhere := filepath.Join(dir, "elsewhere")
	if err := os.WriteFile(elsewhere, []byte("untouched"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(elsewhere, file); err != nil {
		t.Fatal(err)
	}
	if err := BootstrapDevAdmin(context.Background(), testDB(t), quietLog(), "admin@localhost", "", file); err != nil {
		t.Fatal(err)
	}
	st, err := os.Lstat(file)
	if err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != 0o600 {
		t.Fatalf("password file %v (err %v): want a regular 0600 file", st.Mode(), err)
	}
	if b, _ := os.ReadFile(elsewhere); string(b) != "untouched" {
		t.Errorf("the symlink's target received %q", b)
	}
}
