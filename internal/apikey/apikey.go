// Package apikey issues and checks the API keys programs use on /v1. A key is
// 256 random bits shown once; only its SHA-256 is stored, and last-used times
// are batched so that authenticating a request never writes to the database.
//
// Successful look-ups are cached in memory for a few seconds (CacheTTL),
// keyed by the SHA-256, so that a busy key costs no query per request.
// Expiry is still checked on every request. A revoke made through this
// process (Store.Forget, called by the web pages) takes effect at once; one
// made elsewhere — the CLI, another replica, a direct UPDATE — takes effect
// here within CacheTTL. The same holds for changes to a key's RPM or to its
// owner's admin flag, and for disabling its owner: the cached key carries
// its owner's row, so Store.ForgetUser (called by the people page) stops
// all of a person's keys here at once, and other replicas refuse them once
// their cached copy is older than CacheTTL and the owner is read again.
// Unknown, revoked, expired and disabled owners' keys are never cached, so
// presenting made-up keys cannot fill the cache.
//
// While the database fails, a key read successfully within StaleIfError
// keeps working from that read (stale-if-error), without its requests
// waiting on the database: a refresh runs in the background, and a key it
// finds revoked, expired or disabled is refused from then on. A key with no
// such read gets ErrUnavailable (503), never ErrUnknown.
//
// Every key has a scope (models.ScopeInference or models.ScopeAdmin),
// chosen at its creation; Authenticate accepts inference keys only, so no
// /v1 path can forget the check, and AuthenticateAdmin admin keys only.
// An admin key is never served from the cache: each use reads it and its
// owner, so that it stops working at once when its owner is no longer an
// admin or is disabled, on every replica.
package apikey

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
	"gorm.io/gorm"

	"moonji/models"
)

// Prefix starts every key, so that a leaked key is recognisable (secret
// scanners, logs) and cannot be confused with another service's.
const Prefix = "mj-"

// prefixLen is how much of a key is kept in clear for lists: "mj-" plus 8.
const prefixLen = len(Prefix) + 8

// Errors returned by Authenticate. All of them mean 401.
var (
	ErrMalformed = errors.New("malformed API key")
	ErrUnknown   = errors.New("unknown API key")
	ErrRevoked   = errors.New("API key revoked")
	ErrExpired   = errors.New("API key expired")
	// ErrOwnerDisabled means the key is fine but an admin disabled its owner.
	ErrOwnerDisabled = errors.New("API key owner disabled")
	// ErrUnavailable means the key could not be checked: the database
	// failed and no recent read of the key is at hand. It means 503.
	ErrUnavailable = errors.New("API key could not be checked: the database is unavailable")
	// ErrWrongScope means the key is fine but has another scope than the
	// endpoint takes (an admin key on /v1, an inference key on the admin
	// API). It means 403.
	ErrWrongScope = errors.New("API key has another scope")
	// ErrNotAdmin means an admin-scoped key whose owner is no longer an
	// admin. It means 403.
	ErrNotAdmin = errors.New("API key owner is not an admin")
)

// Errors of creating a key.
var (
	// ErrScope is a scope that is not one of the key scopes.
	ErrScope = errors.New("unknown key scope")
	// ErrAdminScopeOwner refuses the admin scope for a key whose owner is
	// not an admin (or is disabled).
	ErrAdminScopeOwner = errors.New("only an admin's key may have the admin scope")
)

// StaleIfError is how old a key's last successful read may be and still be
// used while the database fails.
const StaleIfError = 10 * time.Minute

// PublicPrefix returns the part of a presented key that lists show ("mj-"
// and eight characters): enough to tell which key was used, useless to an
// attacker. Anything that does not look like a Moonji key gives a
// placeholder, so that no other secret reaches a log.
func PublicPrefix(presented string) string {
	if !strings.HasPrefix(presented, Prefix) || len(presented) < prefixLen+8 {
		return "(not a moonji key)"
	}
	return presented[:prefixLen]
}

// Generate returns a new secret key and its SHA-256 hash.
func Generate() (secret, hash string, err error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", fmt.Errorf("read random bytes: %w", err)
	}
	secret = Prefix + base64.RawURLEncoding.EncodeToString(b[:])
	return secret, Hash(secret), nil
}

// Hash returns the hex SHA-256 of a secret key.
func Hash(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// Create issues a key for a user and stores only its hash. The secret is
// returned once and never again.
func Create(ctx context.Context, db *gorm.DB, userID uint, name string, expires time.Duration, rpm int) (secret string, key *models.APIKey, err error) {
	return CreateLimited(ctx, db, userID, name, expires, rpm, models.Limits{})
}

// CreateLimited is Create for a key with a budget and a list of models
// (models.Limits.Check), stored with the key in one row: the key never
// exists without them.
func CreateLimited(ctx context.Context, db *gorm.DB, userID uint, name string, expires time.Duration, rpm int, limits models.Limits) (secret string, key *models.APIKey, err error) {
	return create(ctx, db, userID, models.ScopeInference, name, expires, rpm, limits)
}

// CreateScoped is CreateLimited for a key of the given scope, owned by
// owner: the admin scope only for an admin who is not disabled
// (ErrAdminScopeOwner). That is checked again at every use of the key.
func CreateScoped(ctx context.Context, db *gorm.DB, owner *models.User, scope, name string, expires time.Duration, rpm int, limits models.Limits) (secret string, key *models.APIKey, err error) {
	if !models.ValidScope(scope) {
		return "", nil, fmt.Errorf("%w %q (want %s or %s)", ErrScope, scope, models.ScopeInference, models.ScopeAdmin)
	}
	if scope == models.ScopeAdmin && (!owner.Admin || owner.Disabled()) {
		return "", nil, fmt.Errorf("%w: %s is not an admin", ErrAdminScopeOwner, owner.Email)
	}
	return create(ctx, db, owner.ID, scope, name, expires, rpm, limits)
}

func create(ctx context.Context, db *gorm.DB, userID uint, scope, name string, expires time.Duration, rpm int, limits models.Limits) (secret string, key *models.APIKey, err error) {
	if limits, err = limits.Check(); err != nil {
		return "", nil, err
	}
	if strings.TrimSpace(name) == "" {
		return "", nil, errors.New("a key needs a name")
	}
	if rpm < 0 {
		return "", nil, errors.New("rpm must not be negative")
	}
	secret, hash, err := Generate()
	if err != nil {
		return "", nil, err
	}
	key = &models.APIKey{UserID: userID, Name: strings.TrimSpace(name), Prefix: secret[:prefixLen], Hash: hash, Scope: scope, RPM: rpm,
		Budget: limits.Budget, BudgetPeriod: limits.BudgetPeriod, Models: limits.Models}
	if expires > 0 {
		at := time.Now().UTC().Add(expires)
		key.ExpiresAt = &at
	}
	if err := models.CreateAPIKey(ctx, db, key); err != nil {
		return "", nil, err
	}
	return secret, key, nil
}

// DefaultCacheTTL is how long a successful look-up is reused: the longest a
// revoke made outside this process (CLI, another replica) takes to be seen.
const DefaultCacheTTL = 5 * time.Second

// lookupTimeout bounds one look-up of a key in the database.
const lookupTimeout = 10 * time.Second

// maxCached bounds the cache. Only keys that exist and are active get in,
// so the bound is a guard, not something an attacker can reach.
const maxCached = 10_000

// refreshAhead is the part of the cache's TTL, at its end, in which a
// request of a key starts reading it again (refresh): a key in steady use
// then never expires, and none of its requests waits for the database.
const refreshAhead = 4 // the last quarter

// cached is one remembered look-up.
type cached struct {
	key        models.APIKey
	until      time.Time
	refreshing bool // a refresh is under way
	// failing: the last look-up of this key failed (the database); past
	// until, the key is served from this entry while it is younger than
	// StaleIfError, and refreshed in the background.
	failing bool
	tried   time.Time // when that look-up failed: one refresh a second
}

// Store authenticates keys and remembers when each was last used.
type Store struct {
	db       *gorm.DB
	log      *slog.Logger
	mu       sync.Mutex
	lastUsed map[uint]time.Time
	stop     chan struct{}
	done     chan struct{}

	// lookups lets the requests that miss the cache for the same key at the
	// same time share one query: when a busy key's entry expires, the
	// requests arriving during its look-up would otherwise each query the
	// database, and a slow moment of the database would queue them all.
	lookups   singleflight.Group
	refreshes sync.WaitGroup // the refreshes under way, waited for by Close

	cmu    sync.RWMutex
	ttl    time.Duration
	cache  map[string]cached // SHA-256 of the secret → active key
	gen    uint64            // bumped by Forget and ForgetUser: look-ups begun before it are not cached
	closed bool              // set by Close: no refresh starts after it
}

// NewStore returns a Store that writes last-used times every interval and
// caches successful look-ups for DefaultCacheTTL.
func NewStore(db *gorm.DB, log *slog.Logger, interval time.Duration) *Store {
	if log == nil {
		log = slog.Default()
	}
	s := &Store{db: db, log: log, lastUsed: map[uint]time.Time{}, stop: make(chan struct{}), done: make(chan struct{}),
		ttl: DefaultCacheTTL, cache: map[string]cached{}}
	go s.flushLoop(interval)
	return s
}

// SetCacheTTL changes how long successful look-ups are reused; 0 turns the
// cache off. Call it before the store is used.
func (s *Store) SetCacheTTL(ttl time.Duration) {
	s.cmu.Lock()
	s.ttl = ttl
	clear(s.cache)
	s.cmu.Unlock()
}

// wellFormed reports whether secret could be a key at all.
func wellFormed(secret string) bool {
	return strings.HasPrefix(secret, Prefix) && len(secret) >= prefixLen+8 && len(secret) <= 200
}

// Authenticate finds the active inference key for a secret (/v1). A valid
// key of another scope gets ErrWrongScope.
func (s *Store) Authenticate(ctx context.Context, secret string) (*models.APIKey, error) {
	if !wellFormed(secret) {
		return nil, ErrMalformed
	}
	hash := Hash(secret)
	now := time.Now()
	s.cmu.RLock()
	c, hit := s.cache[hash]
	gen, ttl := s.gen, s.ttl
	s.cmu.RUnlock()
	var key *models.APIKey
	read := false // key was read from the database just now
	fresh := hit && now.Before(c.until)
	stale := hit && !fresh && now.Before(c.until.Add(StaleIfError))
	switch {
	// A stale entry serves while the database fails, and while a refresh
	// is still out: a database that went silent fails a refresh only at
	// lookupTimeout, and the key's requests must not queue behind it.
	case fresh, stale && (c.failing || c.refreshing):
		k := c.key // a copy: callers may not share the cached value
		key = &k
		due := c.until.Sub(now) < ttl/refreshAhead
		if stale {
			due = now.Sub(c.tried) >= time.Second
		}
		if !c.refreshing && due {
			s.refresh(hash, ttl)
		}
	default:
		var err error
		key, gen, err = s.lookup(ctx, hash)
		if errors.Is(err, models.ErrNotFound) {
			return nil, ErrUnknown
		}
		if err != nil {
			if !stale {
				return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
			}
			s.markFailing(hash)
			k := c.key
			key = &k
		} else {
			read = true
		}
	}
	// Checked on every request, cached or not: a key that expires while
	// cached stops working at its expiry, not at the end of the TTL.
	switch key.Status(now) {
	case "revoked":
		s.drop(hash)
		return nil, ErrRevoked
	case "expired":
		s.drop(hash)
		return nil, ErrExpired
	}
	if key.User.Disabled() {
		s.drop(hash)
		return nil, ErrOwnerDisabled
	}
	if read {
		// A key of another scope is cached too: its scope never changes,
		// and a client retrying it on /v1 then costs no query.
		s.remember(hash, key, gen, now.Add(ttl), ttl)
	}
	if key.KeyScope() != models.ScopeInference {
		return nil, ErrWrongScope
	}
	s.mu.Lock()
	s.lastUsed[key.ID] = now.UTC()
	s.mu.Unlock()
	return key, nil
}

// AuthenticateAdmin finds the active admin-scoped key for a secret (the
// admin API), read from the database on every call, never from the cache,
// with its owner: a key whose owner is no longer an admin gets ErrNotAdmin
// at once, one whose owner is disabled ErrOwnerDisabled; a valid key of
// another scope gets ErrWrongScope. There is no stale-if-error here: the
// admin API cannot work without the database anyway.
func (s *Store) AuthenticateAdmin(ctx context.Context, secret string) (*models.APIKey, error) {
	if !wellFormed(secret) {
		return nil, ErrMalformed
	}
	hash := Hash(secret)
	// A scope never changes: an inference key this replica has cached is
	// refused without a query, so a flood of them costs the database
	// nothing.
	s.cmu.RLock()
	c, hit := s.cache[hash]
	s.cmu.RUnlock()
	if hit && c.key.KeyScope() != models.ScopeAdmin {
		return nil, ErrWrongScope
	}
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	key, err := models.APIKeyByHash(ctx, s.db, hash)
	if errors.Is(err, models.ErrNotFound) {
		return nil, ErrUnknown
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	now := time.Now()
	switch {
	case key.Status(now) == "revoked":
		return nil, ErrRevoked
	case key.Status(now) == "expired":
		return nil, ErrExpired
	case key.User.Disabled():
		return nil, ErrOwnerDisabled
	case key.KeyScope() != models.ScopeAdmin:
		return nil, ErrWrongScope
	case !key.User.Admin:
		return nil, ErrNotAdmin
	}
	s.mu.Lock()
	s.lastUsed[key.ID] = now.UTC()
	s.mu.Unlock()
	return key, nil
}

// lookup reads the key of hash from the database, once for all the
// callers asking for it at the same time; each gets its own copy, and the
// cache generation of when the query began (a caller that joined after a
// Forget must not cache a row read before it). The query does not end when
// the caller that started it leaves, since the others wait on it too;
// lookupTimeout bounds it instead.
func (s *Store) lookup(ctx context.Context, hash string) (*models.APIKey, uint64, error) {
	type found struct {
		key *models.APIKey
		gen uint64
	}
	v, err, _ := s.lookups.Do(hash, func() (any, error) {
		s.cmu.RLock()
		gen := s.gen
		s.cmu.RUnlock()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lookupTimeout)
		defer cancel()
		key, err := models.APIKeyByHash(ctx, s.db, hash)
		return found{key, gen}, err
	})
	if err != nil {
		return nil, 0, err
	}
	f := v.(found)
	k := *f.key
	return &k, f.gen, nil
}

// refresh reads the key of hash again in the background, for the cache
// entry that is about to expire; the request that asked goes on with the
// cached copy. One refresh runs per entry. An active key read replaces the
// entry, unless a Forget came after the refresh began; a key revoked,
// expired, disabled or gone is dropped, so that its next request is refused
// by a look-up of its own; on an error the entry expires as it would have.
func (s *Store) refresh(hash string, ttl time.Duration) {
	s.cmu.Lock()
	c, ok := s.cache[hash]
	if !ok || c.refreshing || s.closed {
		s.cmu.Unlock()
		return
	}
	c.refreshing = true
	s.cache[hash] = c
	s.refreshes.Add(1) // under cmu, so never after Close's Wait began
	s.cmu.Unlock()
	go func() {
		defer s.refreshes.Done()
		key, gen, err := s.lookup(context.Background(), hash)
		now := time.Now()
		switch {
		case errors.Is(err, models.ErrNotFound):
			s.drop(hash)
		case err != nil:
			if !c.failing { // once per key and outage, not once a second
				s.log.Warn("api key cache refresh failed; the last read serves while it is younger than StaleIfError",
					"key_id", c.key.ID, "err", err)
			}
			s.markFailing(hash)
		case key.Status(now) != "active" || key.User.Disabled():
			s.drop(hash)
		default:
			s.remember(hash, key, gen, now.Add(ttl), ttl)
		}
	}()
}

// remember caches an active key, unless a Forget came after the look-up
// began (the row read may predate a revoke).
func (s *Store) remember(hash string, key *models.APIKey, gen uint64, until time.Time, ttl time.Duration) {
	if ttl <= 0 {
		return
	}
	s.cmu.Lock()
	defer s.cmu.Unlock()
	if s.gen != gen {
		return
	}
	if len(s.cache) >= maxCached {
		now := time.Now()
		for h, c := range s.cache {
			if !now.Before(c.until) {
				delete(s.cache, h)
			}
		}
		if len(s.cache) >= maxCached {
			clear(s.cache)
		}
	}
	s.cache[hash] = cached{key: *key, until: until}
}

// markFailing notes that the database failed to read the key of hash, and
// that its refresh is over.
func (s *Store) markFailing(hash string) {
	s.cmu.Lock()
	if c, ok := s.cache[hash]; ok {
		c.failing, c.refreshing, c.tried = true, false, time.Now()
		s.cache[hash] = c
	}
	s.cmu.Unlock()
}

func (s *Store) drop(hash string) {
	s.cmu.Lock()
	delete(s.cache, hash)
	s.cmu.Unlock()
}

// Forget drops key id from the cache at once. Call it after revoking the key
// (or changing it) in the database, so that this process stops accepting
// it immediately rather than within the cache's TTL. A nil Store is a no-op.
func (s *Store) Forget(id uint) {
	s.forget(func(k *models.APIKey) bool { return k.ID == id })
}

// ForgetUser drops every key of user userID from the cache at once. Call it
// after disabling the user in the database: this process then reads the
// owner again on their next request and refuses it. Other replicas do the
// same when their cached copies expire, within CacheTTL. A nil Store is a
// no-op.
func (s *Store) ForgetUser(userID uint) {
	s.forget(func(k *models.APIKey) bool { return k.UserID == userID })
}

// forget drops the cached keys that match, and makes look-ups begun before
// it uncacheable (they may have read the row before the change).
func (s *Store) forget(match func(*models.APIKey) bool) {
	if s == nil {
		return
	}
	s.cmu.Lock()
	defer s.cmu.Unlock()
	s.gen++
	for h, c := range s.cache {
		if match(&c.key) {
			delete(s.cache, h)
		}
	}
}

// Revoke revokes key id in the database (see models.RevokeAPIKey for owner)
// and forgets it here.
func (s *Store) Revoke(ctx context.Context, id, owner uint) error {
	err := models.RevokeAPIKey(ctx, s.db, id, owner)
	s.Forget(id)
	return err
}

// Flush writes the pending last-used times now.
func (s *Store) Flush(ctx context.Context) {
	s.mu.Lock()
	pending := s.lastUsed
	s.lastUsed = map[uint]time.Time{}
	s.mu.Unlock()
	if len(pending) == 0 {
		return
	}
	if err := models.TouchAPIKeys(ctx, s.db, pending); err != nil {
		s.log.Warn("write api key last-used times", "keys", len(pending), "err", err)
	}
}

func (s *Store) flushLoop(interval time.Duration) {
	defer close(s.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			s.Flush(context.Background())
		case <-s.stop:
			s.Flush(context.Background())
			return
		}
	}
}

// Close writes the pending last-used times and stops the writer.
func (s *Store) Close() {
	close(s.stop)
	<-s.done
	s.cmu.Lock()
	s.closed = true
	s.cmu.Unlock()
	s.refreshes.Wait()
}
