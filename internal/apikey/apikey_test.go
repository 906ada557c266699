package apikey

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"moonji/models"
)

func TestKeyLifecycle(t *testing.T) {
	ctx := context.Background()
	db, err := models.Open("sqlite://" + t.TempDir() + "/keys.db")
	if err != nil {
		t.Fatal(err)
	}
	defer models.Close(db)
	store := NewStore(db, nil, time.Hour)
	defer store.Close()
	u, err := models.EnsureUser(ctx, db, "k@example.com")
	if err != nil {
		t.Fatal(err)
	}

	secret, key, err := Create(ctx, db, u.ID, "laptop", 0, 5)
	if err != nil {
		t.Fatal(err)
	}
	// 256 random bits after the prefix, stored only as SHA-256.
	if !strings.HasPrefix(secret, Prefix) || len(secret) != len(Prefix)+43 {
		t.Errorf("secret %q: want mj- and 43 base64url characters", secret)
	}
	if key.Hash != Hash(secret) || len(key.Hash) != 64 || key.Prefix != secret[:prefixLen] {
		t.Errorf("stored hash %q prefix %q", key.Hash, key.Prefix)
	}
	var raw []models.APIKey
	db.Find(&raw)
	for _, r := range raw {
		if strings.Contains(r.Hash+r.Prefix+r.Name, secret[prefixLen:]) {
			t.Fatal("the secret is stored in clear")
		}
	}
	got, err := store.Authenticate(ctx, secret)
	if err != nil || got.ID != key.ID || got.User.Email != "k@example.com" || got.RPM != 5 {
		t.Fatalf("Authenticate = %+v, %v", got, err)
	}
	for _, bad := range []string{"", "sk-abc", Prefix + "short", secret + "x", Prefix + strings.Repeat("a", 43)} {
		if _, err := store.Authenticate(ctx, bad); !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrUnknown) {
			t.Errorf("Authenticate(%q) = %v, want malformed or unknown", bad, err)
		}
	}
	store.Flush(ctx)
	if k, _ := models.APIKeyByID(ctx, db, key.ID); k.LastUsedAt == nil {
		t.Error("last-used time not written by Flush")
	}

	// Expiry.
	expiring, ek, err := Create(ctx, db, u.ID, "short", time.Hour, 0)
	if err != nil || ek.ExpiresAt == nil {
		t.Fatalf("create expiring: %v", err)
	}
	db.Model(ek).Update("expires_at", time.Now().Add(-time.Second))
	if _, err := store.Authenticate(ctx, expiring); !errors.Is(err, ErrExpired) {
		t.Errorf("expired key: %v, want ErrExpired", err)
	}

	// Revocation: only the owner (or user 0, an admin) may, twice is harmless.
	other, _ := models.EnsureUser(ctx, db, "other@example.com")
	if err := models.RevokeAPIKey(ctx, db, key.ID, other.ID); !errors.Is(err, models.ErrNotFound) {
		t.Errorf("revoke someone else's key: %v, want ErrNotFound", err)
	}
	if err := models.RevokeAPIKey(ctx, db, key.ID, u.ID); err != nil {
		t.Fatal(err)
	}
	if err := models.RevokeAPIKey(ctx, db, key.ID, 0); err != nil {
		t.Errorf("revoke again as admin: %v", err)
	}
	if _, err := store.Authenticate(ctx, secret); !errors.Is(err, ErrRevoked) {
		t.Errorf("revoked key: %v, want ErrRevoked", err)
	}
	if _, _, err := Create(ctx, db, u.ID, " ", 0, 0); err == nil {
		t.Error("created a key without a name")
	}
}
