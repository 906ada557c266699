package auth

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"gorm.io/gorm"

	"moonji/internal/config"
	"moonji/internal/devidp"
	"moonji/models"
)

// DevAdminPasswordEnv names the environment variable that sets the
// development admin's password.
const DevAdminPasswordEnv = "MOONJI_DEV_ADMIN_PASSWORD"

// DevAdminPasswordFile is the name of the file that holds a generated
// development admin password, next to the SQLite database.
const DevAdminPasswordFile = "dev-admin-password"

// DevAdminPasswordPath is where a generated development admin password is
// written: next to the SQLite database, or under ./data (the default
// database's directory) when the database is not a file.
func DevAdminPasswordPath(databaseURL string) string {
	dir := "data"
	if driver, dsn, err := config.DatabaseDriver(databaseURL); err == nil && driver == "sqlite" &&
		!strings.HasPrefix(dsn, ":memory:") && !strings.HasPrefix(dsn, "file:") {
		if i := strings.IndexByte(dsn, '?'); i >= 0 {
			dsn = dsn[:i]
		}
		dir = filepath.Dir(dsn)
	}
	return filepath.Join(dir, DevAdminPasswordFile)
}

// BootstrapDevAdmin makes sure the development provider has an admin to sign
// in with. The account (email) is created or promoted to admin. Its password
// is password when not empty (set or reset to it, so the environment
// variable always works). Otherwise an account that has none gets a
// generated one, written to passwordFile with mode 0600 — never to the log,
// which often ends up where others can read it — and an account that has one
// keeps it. Only the bcrypt hash is stored in the database.
func BootstrapDevAdmin(ctx context.Context, db *gorm.DB, log *slog.Logger, email, password, passwordFile string) error {
	if log == nil {
		log = slog.Default()
	}
	u, err := models.EnsureUser(ctx, db, email)
	if err != nil {
		return fmt.Errorf("development admin: %w", err)
	}
	updates := map[string]any{}
	if !u.Admin {
		updates["admin"] = true
	}
	generated := false
	switch {
	case password != "":
		if len(u.PasswordHash) == 0 || !devidp.CheckPassword(u.PasswordHash, password) {
			if updates["password_hash"], err = devidp.HashPassword(password); err != nil {
				return fmt.Errorf("development admin: %w", err)
			}
		}
	case len(u.PasswordHash) == 0:
		password, generated = devidp.GeneratePassword(), true
		if updates["password_hash"], err = devidp.HashPassword(password); err != nil {
			return fmt.Errorf("development admin: %w", err)
		}
		// The file first: a password stored but written nowhere would lock
		// the admin out until MOONJI_DEV_ADMIN_PASSWORD is set.
		if err := writeSecretFile(passwordFile, password+"\n"); err != nil {
			return fmt.Errorf("development admin: write the generated password: %w", err)
		}
	}
	if len(updates) > 0 {
		if err := db.WithContext(ctx).Model(&models.User{}).Where("id = ?", u.ID).Updates(updates).Error; err != nil {
			return fmt.Errorf("development admin %s: %w", u.Email, err)
		}
	}
	switch _, changed := updates["password_hash"]; {
	case generated:
		log.Warn("created the development admin; its password is in the file (readable by this user only)",
			"email", u.Email, "password_file", passwordFile, "hint", "set "+DevAdminPasswordEnv+" to choose it")
	case changed:
		// A generated password left from an earlier start no longer works.
		if err := os.Remove(passwordFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
			log.Warn("remove the stale development admin password file", "path", passwordFile, "err", err)
		}
		log.Info("development admin password set from "+DevAdminPasswordEnv, "email", u.Email)
	case password == "":
		if _, err := os.Stat(passwordFile); err == nil {
			log.Info("development admin exists; its generated password is in the file", "email", u.Email,
				"password_file", passwordFile)
		}
	}
	return nil
}

// writeSecretFile writes a file only its owner can read, creating its
// directory if needed. An existing file is removed first and the new one
// created exclusively, so that neither its old mode nor a symlink planted in
// its place decides where the secret goes or who can read it.
func writeSecretFile(path, content string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
