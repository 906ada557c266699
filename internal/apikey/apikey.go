// Package apikey issues and checks the API keys programs use on /v1. A key is
// 256 random bits shown once; only its SHA-256 is stored, and last-used times
// are batched so that authenticating a request never writes to the database.
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
)

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
	key = &models.APIKey{UserID: userID, Name: strings.TrimSpace(name), Prefix: secret[:prefixLen], Hash: hash, RPM: rpm}
	if expires > 0 {
		at := time.Now().UTC().Add(expires)
		key.ExpiresAt = &at
	}
	if err := models.CreateAPIKey(ctx, db, key); err != nil {
		return "", nil, err
	}
	return secret, key, nil
}

// Store authenticates keys and remembers when each was last used.
type Store struct {
	db       *gorm.DB
	log      *slog.Logger
	mu       sync.Mutex
	lastUsed map[uint]time.Time
	stop     chan struct{}
	done     chan struct{}
}

// NewStore returns a Store that writes last-used times every interval.
func NewStore(db *gorm.DB, log *slog.Logger, interval time.Duration) *Store {
	if log == nil {
		log = slog.Default()
	}
	s := &Store{db: db, log: log, lastUsed: map[uint]time.Time{}, stop: make(chan struct{}), done: make(chan struct{})}
	go s.flushLoop(interval)
	return s
}

// Authenticate finds the active key for a secret.
func (s *Store) Authenticate(ctx context.Context, secret string) (*models.APIKey, error) {
	if !strings.HasPrefix(secret, Prefix) || len(secret) < prefixLen+8 || len(secret) > 200 {
		return nil, ErrMalformed
	}
	key, err := models.APIKeyByHash(ctx, s.db, Hash(secret))
	if errors.Is(err, models.ErrNotFound) {
		return nil, ErrUnknown
	}
	if err != nil {
		return nil, err
	}
	now := time.Now()
	switch key.Status(now) {
	case "revoked":
		return nil, ErrRevoked
	case "expired":
		return nil, ErrExpired
	}
	s.mu.Lock()
	s.lastUsed[key.ID] = now.UTC()
	s.mu.Unlock()
	return key, nil
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
}
