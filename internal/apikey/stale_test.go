package apikey

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"moonji/models"
)

// While the database fails, a key read before keeps working from that read
// and one never read is ErrUnavailable (503), not ErrUnknown (401); a
// revoke made meanwhile applies once the database answers again.
func TestStaleIfError(t *testing.T) {
	ctx := context.Background()
	db, err := models.Open("sqlite://" + t.TempDir() + "/keys.db")
	if err != nil {
		t.Fatal(err)
	}
	defer models.Close(db)
	var failing atomic.Bool
	if err := db.Callback().Query().Before("gorm:query").Register("test:down", func(tx *gorm.DB) {
		if failing.Load() {
			_ = tx.AddError(errors.New("connection refused"))
		}
	}); err != nil {
		t.Fatal(err)
	}
	store := NewStore(db, nil, time.Hour)
	defer store.Close()
	ttl := 50 * time.Millisecond
	store.SetCacheTTL(ttl)
	u, err := models.EnsureUser(ctx, db, "s@example.com")
	if err != nil {
		t.Fatal(err)
	}
	known, key, err := Create(ctx, db, u.ID, "known", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	unseen, _, err := Create(ctx, db, u.ID, "unseen", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Authenticate(ctx, known); err != nil {
		t.Fatal(err)
	}

	failing.Store(true)
	time.Sleep(2 * ttl) // the entry's age past its TTL is the property
	for range 3 {
		if got, err := store.Authenticate(ctx, known); err != nil || got.ID != key.ID {
			t.Fatalf("a known key while the database fails: %v %v", got, err)
		}
	}
	if _, err := store.Authenticate(ctx, unseen); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a key never read while the database fails: %v, want ErrUnavailable", err)
	}
	// Revoked meanwhile (an UPDATE: the failure above is the reads').
	if err := db.Model(&models.APIKey{}).Where("id = ?", key.ID).Update("revoked_at", time.Now()).Error; err != nil {
		t.Fatal(err)
	}
	failing.Store(false)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := store.Authenticate(ctx, known)
		if errors.Is(err, ErrRevoked) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the revoke was not seen once the database answered: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := store.Authenticate(ctx, unseen); err != nil {
		t.Fatalf("the unseen key once the database answers: %v", err)
	}
}
