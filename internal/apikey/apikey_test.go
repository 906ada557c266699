package apikey

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

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
	if err := store.Revoke(ctx, key.ID, u.ID); err != nil {
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

func openStore(t *testing.T) (*gorm.DB, *Store, uint) {
	t.Helper()
	db, err := models.Open("sqlite://" + t.TempDir() + "/keys.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { models.Close(db) })
	store := NewStore(db, nil, time.Hour)
	t.Cleanup(store.Close)
	u, err := models.EnsureUser(context.Background(), db, "c@example.com")
	if err != nil {
		t.Fatal(err)
	}
	return db, store, u.ID
}

// A cached key costs no query; a revoke through the Store is seen at once,
// one made behind its back (CLI, another replica) within the TTL.
func TestCache(t *testing.T) {
	ctx := context.Background()
	db, store, uid := openStore(t)
	store.SetCacheTTL(200 * time.Millisecond)
	secret, key, err := Create(ctx, db, uid, "busy", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var queries atomic.Int64
	db.Callback().Query().Before("gorm:query").Register("count", func(*gorm.DB) { queries.Add(1) })
	for range 10 {
		if _, err := store.Authenticate(ctx, secret); err != nil {
			t.Fatal(err)
		}
	}
	if n := queries.Load(); n != 2 { // the key and its user, once
		t.Errorf("%d queries for 10 look-ups of one key, want 2", n)
	}

	// Revoked behind the store's back: still accepted until the TTL ends.
	if err := models.RevokeAPIKey(ctx, db, key.ID, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Authenticate(ctx, secret); err != nil {
		t.Errorf("cached key right after an outside revoke: %v (want it accepted within the TTL)", err)
	}
	time.Sleep(250 * time.Millisecond)
	if _, err := store.Authenticate(ctx, secret); !errors.Is(err, ErrRevoked) {
		t.Errorf("after the TTL: %v, want ErrRevoked", err)
	}

	// Revoked through the store: refused at once.
	store.SetCacheTTL(time.Hour)
	secret2, key2, _ := Create(ctx, db, uid, "web", 0, 0)
	if _, err := store.Authenticate(ctx, secret2); err != nil {
		t.Fatal(err)
	}
	if err := store.Revoke(ctx, key2.ID, uid); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Authenticate(ctx, secret2); !errors.Is(err, ErrRevoked) {
		t.Errorf("after Revoke: %v, want ErrRevoked", err)
	}

	// Expiry is checked on every request, cached or not.
	secret3, _, _ := Create(ctx, db, uid, "expiring", time.Hour, 0)
	if _, err := store.Authenticate(ctx, secret3); err != nil {
		t.Fatal(err)
	}
	store.cmu.Lock()
	c := store.cache[Hash(secret3)]
	past := time.Now().Add(-time.Second)
	c.key.ExpiresAt = &past
	store.cache[Hash(secret3)] = c
	store.cmu.Unlock()
	if _, err := store.Authenticate(ctx, secret3); !errors.Is(err, ErrExpired) {
		t.Errorf("cached key past its expiry: %v, want ErrExpired", err)
	}

	// Unknown keys are never cached.
	for range 100 {
		bogus, _, _ := Generate()
		if _, err := store.Authenticate(ctx, bogus); !errors.Is(err, ErrUnknown) {
			t.Fatalf("made-up key: %v", err)
		}
	}
	store.cmu.RLock()
	n := len(store.cache)
	store.cmu.RUnlock()
	if n > 1 {
		t.Errorf("%d cache entries after 100 unknown keys; only active keys may be cached", n)
	}
}

// Requests that miss the cache for the same key at the same time share one
// query: a busy key's expiry must not send a query per request.
func TestConcurrentMissesShareOneQuery(t *testing.T) {
	ctx := context.Background()
	db, store, uid := openStore(t)
	secret, _, err := Create(ctx, db, uid, "busy", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var keyQueries atomic.Int64
	db.Callback().Query().Before("gorm:query").Register("slow", func(tx *gorm.DB) {
		if tx.Statement.Table == "api_keys" {
			keyQueries.Add(1)
			time.Sleep(100 * time.Millisecond) // a slow moment of the database
		}
	})
	const n = 20
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			k, err := store.Authenticate(ctx, secret)
			if err == nil && k.UserID != uid {
				err = fmt.Errorf("key of user %d, want %d", k.UserID, uid)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if q := keyQueries.Load(); q != 1 {
		t.Errorf("%d queries of api_keys for %d simultaneous look-ups of one key, want 1", q, n)
	}
}

// A caller that joins a shared look-up after a Forget must not cache the
// row, which the query may have read before the Forget.
func TestForgetDuringSharedLookup(t *testing.T) {
	ctx := context.Background()
	db, store, uid := openStore(t)
	secret, key, _ := Create(ctx, db, uid, "racy", 0, 0)
	started := make(chan struct{}, 1)
	db.Callback().Query().Before("gorm:query").Register("slow", func(tx *gorm.DB) {
		if tx.Statement.Table == "api_keys" {
			started <- struct{}{}
			time.Sleep(100 * time.Millisecond)
		}
	})
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = store.Authenticate(ctx, secret) }) // starts the query
	<-started
	store.Forget(key.ID)                                     // a revoke lands while the query runs
	wg.Go(func() { _, _ = store.Authenticate(ctx, secret) }) // joins it
	wg.Wait()
	store.cmu.RLock()
	_, cached := store.cache[Hash(secret)]
	store.cmu.RUnlock()
	if cached {
		t.Error("a shared look-up begun before a Forget was cached by a caller that joined after it")
	}
}

// A look-up that read the row before a Forget must not put it back.
func TestForgetDuringLookup(t *testing.T) {
	ctx := context.Background()
	db, store, uid := openStore(t)
	secret, key, _ := Create(ctx, db, uid, "racy", 0, 0)
	db.Callback().Query().After("gorm:query").Register("forget", func(tx *gorm.DB) {
		if tx.Statement.Table == "api_keys" {
			store.Forget(key.ID) // a revoke lands between the read and the caching
		}
	})
	if _, err := store.Authenticate(ctx, secret); err != nil {
		t.Fatal(err)
	}
	store.cmu.RLock()
	_, cached := store.cache[Hash(secret)]
	store.cmu.RUnlock()
	if cached {
		t.Error("a look-up older than a Forget was cached")
	}
}

// A key in steady use is read again shortly before its cache entry
// expires, by one query in the background that no request waits for; what
// that read finds (a revoke made behind the store's back) is seen from then
// on, before the old entry would have expired.
func TestRefreshAhead(t *testing.T) {
	ctx := context.Background()
	db, store, uid := openStore(t)
	store.SetCacheTTL(time.Minute)
	secret, key, err := Create(ctx, db, uid, "steady", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Authenticate(ctx, secret); err != nil {
		t.Fatal(err)
	}
	var keyQueries atomic.Int64
	started, held := make(chan struct{}, 10), make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(held) }) }
	t.Cleanup(release) // a failed test must not leave the refresh held
	db.Callback().Query().Before("gorm:query").Register("held", func(tx *gorm.DB) {
		if tx.Statement.Table == "api_keys" {
			keyQueries.Add(1)
			started <- struct{}{}
			<-held // the database is slow: nobody may wait for this
		}
	})
	hash := Hash(secret)
	expireIn := func(d time.Duration) time.Time {
		store.cmu.Lock()
		defer store.cmu.Unlock()
		c := store.cache[hash]
		c.until = time.Now().Add(d)
		store.cache[hash] = c
		return c.until
	}
	authenticate := func() error {
		errc := make(chan error, 1)
		go func() { _, err := store.Authenticate(ctx, secret); errc <- err }()
		select {
		case err := <-errc:
			return err
		case <-time.After(5 * time.Second):
			t.Fatal("a request of a cached key waited for its refresh")
			return nil
		}
	}

	// Outside the last quarter of the TTL: no refresh.
	expireIn(30 * time.Second)
	if err := authenticate(); err != nil {
		t.Fatal(err)
	}
	if n := keyQueries.Load(); n != 0 {
		t.Fatalf("%d queries for a key far from its expiry, want 0", n)
	}

	// Inside it: one refresh for any number of requests, none waiting.
	old := expireIn(10 * time.Second)
	for range 50 {
		if err := authenticate(); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("no look-up started for 50 requests near the entry's expiry")
	}
	if n := keyQueries.Load(); n != 1 {
		t.Errorf("%d queries for 50 requests near the entry's expiry, want 1 (the refresh)", n)
	}
	// Past its expiry while the refresh is still out (a database gone
	// silent answers nothing until lookupTimeout): the entry still serves,
	// and nobody joins the refresh.
	expireIn(-time.Second)
	for range 20 {
		if err := authenticate(); err != nil {
			t.Fatalf("a request of an expired entry whose refresh is out: %v", err)
		}
	}
	if n := keyQueries.Load(); n != 1 {
		t.Errorf("%d queries with the refresh out past the expiry, want 1", n)
	}
	release()
	store.refreshes.Wait()
	store.cmu.RLock()
	c, ok := store.cache[hash]
	store.cmu.RUnlock()
	if !ok || c.refreshing || !c.until.After(old.Add(30*time.Second)) {
		t.Fatalf("after the refresh: cached %v, refreshing %v, until %v (old %v); want a fresh entry", ok, c.refreshing, c.until, old)
	}

	// A revoke behind the store's back is found by the next refresh.
	if err := models.RevokeAPIKey(ctx, db, key.ID, 0); err != nil {
		t.Fatal(err)
	}
	expireIn(10 * time.Second)
	if err := authenticate(); err != nil {
		t.Fatalf("the request that starts the refresh: %v (it is served from the cache)", err)
	}
	store.refreshes.Wait()
	if err := authenticate(); !errors.Is(err, ErrRevoked) {
		t.Errorf("after a refresh that read the revoke: %v, want ErrRevoked", err)
	}
}
