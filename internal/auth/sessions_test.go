package auth

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"moonji/models"
)

func TestSessionLifecycle(t *testing.T) {
	ctx := context.Background()
	s := testService(t, AdminRule{})
	u, err := models.EnsureUser(ctx, s.db, "a@example.com")
	if err != nil {
		t.Fatal(err)
	}
	cookie, sess, err := s.CreateSession(ctx, u.ID, "id-token", "")
	if err != nil {
		t.Fatal(err)
	}
	if len(cookie) < 43 || sess.ID == cookie || sess.ID != hashToken(cookie) {
		t.Fatalf("cookie %q / stored id %q: want a random cookie stored only as its SHA-256", cookie, sess.ID)
	}
	var stored models.Session
	if err := s.db.First(&stored).Error; err != nil || strings.Contains(stored.ID, cookie) {
		t.Fatalf("stored session %+v (err %v)", stored, err)
	}
	got, err := s.Session(ctx, cookie)
	if err != nil || got.UserID != u.ID || got.User.Email != "a@example.com" || got.CSRFToken == "" {
		t.Fatalf("Session = %+v, %v", got, err)
	}
	if _, err := s.Session(ctx, cookie+"x"); !errors.Is(err, ErrNoSession) {
		t.Errorf("wrong cookie: %v, want ErrNoSession", err)
	}
	if !CheckCSRF(got, got.CSRFToken) || CheckCSRF(got, "") || CheckCSRF(got, got.CSRFToken+"x") {
		t.Error("CSRF check does not match exactly the session's token")
	}

	// Rotation: signing in again with the old cookie ends the old session.
	cookie2, _, err := s.CreateSession(ctx, u.ID, "", cookie)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Session(ctx, cookie); !errors.Is(err, ErrNoSession) {
		t.Errorf("old session after rotation: %v, want ErrNoSession", err)
	}
	ended, err := s.EndSession(ctx, cookie2)
	if err != nil || ended == nil {
		t.Fatalf("EndSession = %v, %v", ended, err)
	}
	if _, err := s.Session(ctx, cookie2); !errors.Is(err, ErrNoSession) {
		t.Errorf("after logout: %v, want ErrNoSession", err)
	}
}

func TestSessionExpiry(t *testing.T) {
	ctx := context.Background()
	s := testService(t, AdminRule{})
	u, _ := models.EnsureUser(ctx, s.db, "a@example.com")

	idle, _, _ := s.CreateSession(ctx, u.ID, "", "")
	past := time.Now().Add(-s.idle - time.Minute)
	s.db.Model(&models.Session{}).Where("id = ?", hashToken(idle)).Update("last_seen_at", past)
	if _, err := s.Session(ctx, idle); !errors.Is(err, ErrNoSession) {
		t.Errorf("idle session: %v, want ErrNoSession", err)
	}

	old, _, _ := s.CreateSession(ctx, u.ID, "", "")
	s.db.Model(&models.Session{}).Where("id = ?", hashToken(old)).Update("expires_at", time.Now().Add(-time.Second))
	if _, err := s.Session(ctx, old); !errors.Is(err, ErrNoSession) {
		t.Errorf("session past its absolute end: %v, want ErrNoSession", err)
	}

	// Activity pushes the idle end back.
	active, _, _ := s.CreateSession(ctx, u.ID, "", "")
	almost := time.Now().Add(-s.idle + time.Hour)
	s.db.Model(&models.Session{}).Where("id = ?", hashToken(active)).Update("last_seen_at", almost)
	if _, err := s.Session(ctx, active); err != nil {
		t.Fatal(err)
	}
	var row models.Session
	s.db.Where("id = ?", hashToken(active)).Take(&row)
	if !row.LastSeenAt.After(almost.Add(time.Minute)) {
		t.Errorf("last seen %v not moved on from %v", row.LastSeenAt, almost)
	}
	var n int64
	s.db.Model(&models.Session{}).Count(&n)
	if n != 1 {
		t.Errorf("%d session rows left, want only the active one", n)
	}
}
