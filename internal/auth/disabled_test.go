package auth

import (
	"context"
	"errors"
	"testing"
	"time"

	"gorm.io/gorm"

	"moonji/models"
)

// A sign-in records its time; a disabled person's sign-in is refused after
// the provider vouched for them (ErrDisabled), starts no session, records
// no time, and does not enable them again by saving their row.
func TestDisabledCannotSignIn(t *testing.T) {
	ctx := context.Background()
	e := newIDPEnv(t, "right-password")
	if resp := e.signIn(t, jarClient(t), "admin@localhost", "right-password"); resp.StatusCode != 200 || e.err != nil {
		t.Fatalf("first sign-in: %d, %v", resp.StatusCode, e.err)
	}
	first := e.last
	u, _ := models.UserByID(ctx, e.svc.db, first.User.ID)
	if u.LastLoginAt == nil || time.Since(*u.LastLoginAt) > time.Minute || first.User.LastLoginAt == nil {
		t.Fatalf("last login after a sign-in: %v", u.LastLoginAt)
	}
	signedInAt := *u.LastLoginAt

	if _, _, err := models.DisableUser(ctx, e.svc.db, u.ID, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Session(ctx, first.Cookie); !errors.Is(err, ErrNoSession) {
		t.Errorf("session after disabling: %v, want ErrNoSession", err)
	}
	e.last = nil
	resp := e.signIn(t, jarClient(t), "admin@localhost", "right-password")
	if resp.StatusCode != 400 || !errors.Is(e.err, ErrDisabled) || e.last != nil {
		t.Fatalf("sign-in of a disabled person: %d, %v, want ErrDisabled", resp.StatusCode, e.err)
	}
	var n int64
	e.svc.db.Model(&models.Session{}).Count(&n)
	if n != 0 {
		t.Errorf("%d sessions after a refused sign-in", n)
	}
	u, _ = models.UserByID(ctx, e.svc.db, u.ID)
	if !u.Disabled() {
		t.Error("the refused sign-in enabled the person again (its save overwrote the flag)")
	}
	if u.LastLoginAt == nil || !u.LastLoginAt.Equal(signedInAt) {
		t.Errorf("last login %v after a refused sign-in, want %v kept", u.LastLoginAt, signedInAt)
	}

	if _, err := models.EnableUser(ctx, e.svc.db, u.ID); err != nil {
		t.Fatal(err)
	}
	if resp := e.signIn(t, jarClient(t), "admin@localhost", "right-password"); resp.StatusCode != 200 || e.err != nil {
		t.Fatalf("sign-in after enabling: %d, %v", resp.StatusCode, e.err)
	}
}

// A session that outlived a disable (a sign-in in flight created it just
// after the sessions were deleted) is refused and ended when next used.
func TestSessionOfDisabledPerson(t *testing.T) {
	ctx := context.Background()
	s := testService(t, AdminRule{})
	u, _ := models.EnsureUser(ctx, s.db, "late@example.com")
	cookie, _, err := s.CreateSession(ctx, u.ID, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Session(ctx, cookie); err != nil {
		t.Fatal(err)
	}
	if err := s.db.Model(u).Update("disabled_at", time.Now()).Error; err != nil {
		t.Fatal(err)
	}
	if _, err := s.Session(ctx, cookie); !errors.Is(err, ErrNoSession) {
		t.Errorf("session of a disabled person: %v, want ErrNoSession", err)
	}
	var n int64
	s.db.Model(&models.Session{}).Count(&n)
	if n != 0 {
		t.Errorf("%d sessions left: the refused one was not ended", n)
	}
}

// An admin disables the person while their sign-in saves their row (read
// before the disable): the save must not enable them again.
func TestUpsertKeepsDisabled(t *testing.T) {
	ctx := context.Background()
	s := testService(t, AdminRule{})
	id := Identity{Issuer: "https://idp.example.com", Subject: "s1", Email: "racer@example.com", EmailVerified: true}
	u, err := s.upsertUser(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	once := false
	s.db.Callback().Update().Before("gorm:update").Register("disable_meanwhile", func(tx *gorm.DB) {
		if tx.Statement.Table == "users" && !once {
			once = true
			if _, _, err := models.DisableUser(ctx, s.db, u.ID, time.Now()); err != nil {
				t.Error(err)
			}
		}
	})
	again, err := s.upsertUser(ctx, id)
	if err != nil || !once {
		t.Fatalf("second upsert: %v (disable ran: %v)", err, once)
	}
	if again.Disabled() {
		t.Fatal("the disable ran before the upsert read the row: the race is not reproduced")
	}
	if stored, _ := models.UserByID(ctx, s.db, u.ID); !stored.Disabled() {
		t.Error("a sign-in's save enabled a person disabled meanwhile")
	}
}
