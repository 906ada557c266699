package apikey

import (
	"context"
	"errors"
	"testing"
	"time"

	"moonji/internal/testdb"
	"moonji/models"
)

// TestScopes: a key's scope is chosen at creation (inference by default);
// only an admin's key may have the admin scope; Authenticate (/v1) refuses
// an admin key, from the cache too, and AuthenticateAdmin refuses an
// inference key. An admin key stops at once — despite an hour-long cache —
// when its owner is demoted or disabled, and works again when they are an
// admin again.
func TestScopes(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		db, err := models.Open(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer models.Close(db)
		store := NewStore(db, nil, time.Hour)
		defer store.Close()
		store.SetCacheTTL(time.Hour)
		boss, _ := models.EnsureUser(ctx, db, "boss@example.com")
		worker, _ := models.EnsureUser(ctx, db, "worker@example.com")
		if err := db.Model(boss).Update("admin", true).Error; err != nil {
			t.Fatal(err)
		}
		boss.Admin = true

		plain, key, err := Create(ctx, db, worker.ID, "old style", 0, 0)
		if err != nil || key.Scope != models.ScopeInference {
			t.Fatalf("Create: scope %q, %v", key.Scope, err)
		}
		if _, _, err := CreateScoped(ctx, db, worker, models.ScopeAdmin, "nope", 0, 0, models.Limits{}); !errors.Is(err, ErrAdminScopeOwner) {
			t.Errorf("admin scope for a non-admin: %v", err)
		}
		if _, _, err := CreateScoped(ctx, db, boss, "root", "nope", 0, 0, models.Limits{}); !errors.Is(err, ErrScope) {
			t.Errorf("unknown scope: %v", err)
		}
		admin, adminKey, err := CreateScoped(ctx, db, boss, models.ScopeAdmin, "terraform", 0, 0, models.Limits{})
		if err != nil || adminKey.Scope != models.ScopeAdmin {
			t.Fatalf("admin key: %+v %v", adminKey, err)
		}
		again, err := models.APIKeyByID(ctx, db, adminKey.ID)
		if err != nil || again.KeyScope() != models.ScopeAdmin {
			t.Fatalf("stored scope: %+v %v", again, err)
		}

		if k, err := store.Authenticate(ctx, plain); err != nil || k.ID != key.ID {
			t.Fatalf("inference key on /v1: %v", err)
		}
		for i := range 2 { // the second from the cache
			if _, err := store.Authenticate(ctx, admin); !errors.Is(err, ErrWrongScope) {
				t.Fatalf("admin key on /v1 (#%d): %v", i+1, err)
			}
		}
		if _, err := store.AuthenticateAdmin(ctx, plain); !errors.Is(err, ErrWrongScope) {
			t.Errorf("inference key on the admin API: %v", err)
		}
		if _, err := store.AuthenticateAdmin(ctx, "mj-made-up-and-long-enough"); !errors.Is(err, ErrUnknown) {
			t.Errorf("unknown key: %v", err)
		}
		if k, err := store.AuthenticateAdmin(ctx, admin); err != nil || k.ID != adminKey.ID || k.User.Email != boss.Email {
			t.Fatalf("admin key: %+v %v", k, err)
		}

		// Demoted elsewhere (the CLI, another replica): refused at once.
		if err := db.Model(boss).Update("admin", false).Error; err != nil {
			t.Fatal(err)
		}
		if _, err := store.AuthenticateAdmin(ctx, admin); !errors.Is(err, ErrNotAdmin) {
			t.Errorf("demoted owner: %v", err)
		}
		if err := db.Model(boss).Update("admin", true).Error; err != nil {
			t.Fatal(err)
		}
		if _, err := store.AuthenticateAdmin(ctx, admin); err != nil {
			t.Errorf("owner an admin again: %v", err)
		}
		if _, _, err := models.DisableUser(ctx, db, boss.ID, time.Now()); err != nil {
			t.Fatal(err)
		}
		if _, err := store.AuthenticateAdmin(ctx, admin); !errors.Is(err, ErrOwnerDisabled) {
			t.Errorf("disabled owner: %v", err)
		}
		if err := models.RevokeAPIKey(ctx, db, adminKey.ID, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := store.AuthenticateAdmin(ctx, admin); !errors.Is(err, ErrRevoked) {
			t.Errorf("revoked: %v", err)
		}

		// An inference key this replica has cached is refused on the admin
		// API without a query: with the database gone, still ErrWrongScope
		// (an admin key would need the database, and fail for want of it).
		sqlDB, err := db.DB()
		if err != nil {
			t.Fatal(err)
		}
		sqlDB.Close()
		if _, err := store.AuthenticateAdmin(ctx, plain); !errors.Is(err, ErrWrongScope) {
			t.Errorf("cached inference key on the admin API with the database closed: %v", err)
		}
		if _, err := store.AuthenticateAdmin(ctx, admin); !errors.Is(err, ErrUnavailable) {
			t.Errorf("admin key with the database closed: %v", err)
		}
	})
}

// TestScopeMigration: keys stored before scopes existed are inference keys
// once the column is added.
func TestScopeMigration(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		db, err := models.Open(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer models.Close(db)
		u, _ := models.EnsureUser(ctx, db, "old@example.com")
		secret, key, err := Create(ctx, db, u.ID, "before scopes", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Migrator().DropColumn(&models.APIKey{}, "scope"); err != nil {
			t.Fatal(err)
		}
		if err := models.Migrate(db); err != nil {
			t.Fatal(err)
		}
		var scope string
		if err := db.Raw("SELECT scope FROM api_keys WHERE id = ?", key.ID).Scan(&scope).Error; err != nil || scope != models.ScopeInference {
			t.Fatalf("scope after the migration: %q %v", scope, err)
		}
		store := NewStore(db, nil, time.Hour)
		defer store.Close()
		if _, err := store.Authenticate(ctx, secret); err != nil {
			t.Errorf("old key on /v1: %v", err)
		}
	})
}
