package apikey

import (
	"context"
	"errors"
	"testing"
	"time"

	"gorm.io/gorm"

	"moonji/models"
)

// A disabled owner's keys: still accepted from the cache until it is told
// (another replica, within the TTL), refused at once after ForgetUser,
// refused when the cached copy expires, never cached while refused, and
// accepted again once the owner is enabled. Others' keys stay cached.
func TestDisabledOwner(t *testing.T) {
	ctx := context.Background()
	db, store, uid := openStore(t)
	store.SetCacheTTL(time.Hour)
	laptop, _, _ := Create(ctx, db, uid, "laptop", 0, 0)
	ci, _, _ := Create(ctx, db, uid, "ci", 0, 0)
	other, _ := models.EnsureUser(ctx, db, "other@example.com")
	theirs, _, _ := Create(ctx, db, other.ID, "theirs", 0, 0)
	for _, s := range []string{laptop, ci, theirs} {
		if _, err := store.Authenticate(ctx, s); err != nil {
			t.Fatal(err)
		}
	}

	if _, _, err := models.DisableUser(ctx, db, uid, time.Now()); err != nil {
		t.Fatal(err)
	}
	// Behind the store's back (another replica disabled them): the cached
	// copies still say the owner is enabled.
	if _, err := store.Authenticate(ctx, laptop); err != nil {
		t.Errorf("cached key right after an outside disable: %v (want it accepted within the TTL)", err)
	}
	// The cached copy expires: the owner is read again and the key refused.
	store.cmu.Lock()
	c := store.cache[Hash(laptop)]
	c.until = time.Now().Add(-time.Second)
	store.cache[Hash(laptop)] = c
	store.cmu.Unlock()
	if _, err := store.Authenticate(ctx, laptop); !errors.Is(err, ErrOwnerDisabled) {
		t.Errorf("key after its cached copy expired: %v, want ErrOwnerDisabled", err)
	}

	// Through this process: every key of the owner is refused at once.
	store.ForgetUser(uid)
	var queries int
	db.Callback().Query().Before("gorm:query").Register("count", func(*gorm.DB) { queries++ })
	defer db.Callback().Query().Remove("count")
	if _, err := store.Authenticate(ctx, ci); !errors.Is(err, ErrOwnerDisabled) {
		t.Errorf("after ForgetUser: %v, want ErrOwnerDisabled", err)
	}
	store.cmu.RLock()
	_, cachedLaptop := store.cache[Hash(laptop)]
	_, cachedCI := store.cache[Hash(ci)]
	store.cmu.RUnlock()
	if cachedLaptop || cachedCI {
		t.Error("a disabled owner's key is cached")
	}
	before := queries
	if k, err := store.Authenticate(ctx, theirs); err != nil || k.User.Email != "other@example.com" {
		t.Errorf("another person's key: %+v, %v", k, err)
	}
	if queries != before {
		t.Errorf("another person's key was read again (%d queries): ForgetUser dropped more than one person's keys", queries-before)
	}

	if _, err := models.EnableUser(ctx, db, uid); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{laptop, ci} {
		if _, err := store.Authenticate(ctx, s); err != nil {
			t.Errorf("after enabling: %v, want the key accepted", err)
		}
	}
}

// A look-up that read the owner before ForgetUser must not cache it.
func TestForgetUserDuringLookup(t *testing.T) {
	ctx := context.Background()
	db, store, uid := openStore(t)
	store.SetCacheTTL(time.Hour)
	secret, _, _ := Create(ctx, db, uid, "racy", 0, 0)
	db.Callback().Query().After("gorm:query").Register("forget", func(tx *gorm.DB) {
		if tx.Statement.Table == "api_keys" {
			store.ForgetUser(uid) // a disable lands between the read and the caching
		}
	})
	if _, err := store.Authenticate(ctx, secret); err != nil {
		t.Fatal(err)
	}
	store.cmu.RLock()
	_, cached := store.cache[Hash(secret)]
	store.cmu.RUnlock()
	if cached {
		t.Error("a look-up older than a ForgetUser was cached")
	}
	var nilStore *Store
	nilStore.ForgetUser(uid) // a no-op, as Forget
}
