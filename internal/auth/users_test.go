package auth

import (
	"context"
	"errors"
	"testing"

	"moonji/models"
)

func TestUpsertUser(t *testing.T) {
	ctx := context.Background()
	s := testService(t, AdminRule{Claim: "groups", Value: "admins"})
	iss := "https://idp.example.com"

	// First sign-in creates the user from the token.
	u, err := s.upsertUser(ctx, Identity{Issuer: iss, Subject: "s1", Email: "New@Example.com", EmailVerified: true,
		Name: "New Person", Claims: map[string]any{"groups": []any{"admins"}}})
	if err != nil {
		t.Fatal(err)
	}
	if u.ID == 0 || u.Email != "new@example.com" || u.Name != "New Person" || !u.Admin || u.Subject != "s1" {
		t.Fatalf("created %+v", u)
	}
	// The next finds it by issuer + subject, even with a new email, and the
	// admin flag follows the provider.
	again, err := s.upsertUser(ctx, Identity{Issuer: iss, Subject: "s1", Email: "renamed@example.com", EmailVerified: true})
	if err != nil || again.ID != u.ID || again.Email != "renamed@example.com" || again.Admin {
		t.Fatalf("second sign-in: %+v, %v", again, err)
	}

	// A user the CLI created by email is linked when the email is verified...
	cli, _ := models.EnsureUser(ctx, s.db, "cli@example.com")
	linked, err := s.upsertUser(ctx, Identity{Issuer: iss, Subject: "s2", Email: "cli@example.com", EmailVerified: true})
	if err != nil || linked.ID != cli.ID || linked.Subject != "s2" {
		t.Fatalf("link by email: %+v, %v", linked, err)
	}
	// ...but not when the provider does not vouch for it,
	models.EnsureUser(ctx, s.db, "other@example.com")
	if _, err := s.upsertUser(ctx, Identity{Issuer: iss, Subject: "s3", Email: "other@example.com"}); !errors.Is(err, ErrEmailTaken) {
		t.Errorf("unverified link: %v, want ErrEmailTaken", err)
	}
	// ...nor onto another subject of the same provider.
	if _, err := s.upsertUser(ctx, Identity{Issuer: iss, Subject: "s4", Email: "cli@example.com", EmailVerified: true}); !errors.Is(err, ErrEmailConflict) {
		t.Errorf("second subject, same email: %v, want ErrEmailConflict", err)
	}
	if _, err := s.upsertUser(ctx, Identity{Issuer: iss, Subject: "s5"}); !errors.Is(err, ErrNoEmail) {
		t.Errorf("no email: %v, want ErrNoEmail", err)
	}
}

func TestUpsertKeepsAdminWithoutRule(t *testing.T) {
	ctx := context.Background()
	s := testService(t, AdminRule{})
	u, _ := models.EnsureUser(ctx, s.db, "op@example.com")
	s.db.Model(u).Update("admin", true)
	got, err := s.upsertUser(ctx, Identity{Issuer: "i", Subject: "x", Email: "op@example.com", EmailVerified: true})
	if err != nil || !got.Admin {
		t.Fatalf("without an admin rule the stored flag stands: %+v, %v", got, err)
	}
}

// upsertUserWas tells the admin flag a sign-in found (nil for a new
// person), so that the audit log can record a role the claim changed.
func TestUpsertTellsFormerAdminFlag(t *testing.T) {
	ctx := context.Background()
	s := testService(t, AdminRule{Claim: "groups", Value: "ops"})
	admin := Identity{Issuer: "i", Subject: "x", Email: "op@example.com", EmailVerified: true, Claims: map[string]any{"groups": []any{"ops"}}}
	u, was, err := s.upsertUserWas(ctx, admin)
	if err != nil || was != nil || !u.Admin {
		t.Fatalf("new person: %+v, was %v, %v", u, was, err)
	}
	admin.Claims = map[string]any{"groups": []any{}}
	u, was, err = s.upsertUserWas(ctx, admin)
	if err != nil || was == nil || !*was || u.Admin {
		t.Fatalf("demoted by the claim: %+v, was %v, %v", u, was, err)
	}
}
