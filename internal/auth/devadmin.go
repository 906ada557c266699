package auth

import (
	"context"
	"fmt"
	"log/slog"

	"gorm.io/gorm"

	"moonji/internal/devidp"
	"moonji/models"
)

// DevAdminPasswordEnv names the environment variable that sets the
// development admin's password.
const DevAdminPasswordEnv = "MOONJI_DEV_ADMIN_PASSWORD"

// BootstrapDevAdmin makes sure the development provider has an admin to sign
// in with. The account (email) is created or promoted to admin. Its password
// is password when not empty (set or reset to it, so the environment
// variable always works); otherwise an account that has none gets a
// generated one, printed once to the log, and an account that has one keeps it.
// Only the bcrypt hash is stored.
func BootstrapDevAdmin(ctx context.Context, db *gorm.DB, log *slog.Logger, email, password string) error {
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
	}
	if len(updates) > 0 {
		if err := db.WithContext(ctx).Model(&models.User{}).Where("id = ?", u.ID).Updates(updates).Error; err != nil {
			return fmt.Errorf("development admin %s: %w", u.Email, err)
		}
	}
	if generated {
		// Printed once: the next start finds the hash and keeps it.
		log.Warn("created the development admin; sign in with this password, it will not be shown again",
			"email", u.Email, "password", password, "hint", "set "+DevAdminPasswordEnv+" to choose it")
	} else if _, ok := updates["password_hash"]; ok {
		log.Info("development admin password set from "+DevAdminPasswordEnv, "email", u.Email)
	}
	return nil
}
