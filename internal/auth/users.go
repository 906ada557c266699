package auth

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"gorm.io/gorm"

	"moonji/models"
)

// Errors of a sign-in that reached the provider but cannot become a user.
var (
	ErrNoEmail       = errors.New("the provider sent no email address (is the email scope allowed?)")
	ErrEmailConflict = errors.New("another account of this provider already uses this email address")
	ErrEmailTaken    = errors.New("an account with this email address exists, but the provider does not say the address is verified")
)

// upsertUser returns the user of a signed-in identity, creating or updating
// it. The identity is issuer + subject; failing that, a user of the same
// email is linked when the provider vouches for the address (the CLI creates
// users by email alone, and moving from one provider to another keeps them).
func (s *Service) upsertUser(ctx context.Context, id Identity) (*models.User, error) {
	u, _, err := s.upsertUserWas(ctx, id)
	return u, err
}

// upsertUserWas is upsertUser that also tells the admin flag the person
// had before this sign-in (nil: a new person), for the audit log's record
// of a role the provider's claim changed.
func (s *Service) upsertUserWas(ctx context.Context, id Identity) (_ *models.User, wasAdmin *bool, _ error) {
	email := models.NormalizeEmail(id.Email)
	name := strings.TrimSpace(id.Name)
	var u models.User
	err := s.db.WithContext(ctx).Where("issuer = ? AND subject = ?", id.Issuer, id.Subject).Take(&u).Error
	switch {
	case err == nil:
		if email != "" && email != u.Email && id.EmailVerified {
			if other, err := models.UserByEmail(ctx, s.db, email); errors.Is(err, models.ErrNotFound) {
				u.Email = email
			} else if err == nil && other.ID != u.ID {
				s.log.WarnContext(ctx, "email changed at the provider but is taken here; keeping the old one",
					"user", u.ID, "email", email)
			}
		}
	case errors.Is(err, gorm.ErrRecordNotFound):
		if email == "" {
			return nil, nil, ErrNoEmail
		}
		existing, err := models.UserByEmail(ctx, s.db, email)
		switch {
		case errors.Is(err, models.ErrNotFound):
			u = models.User{Email: email}
		case err != nil:
			return nil, nil, err
		case existing.Issuer == id.Issuer && existing.Subject != "":
			return nil, nil, ErrEmailConflict
		case !id.EmailVerified:
			return nil, nil, ErrEmailTaken
		default:
			u = *existing
			s.log.InfoContext(ctx, "linked sign-in identity to existing user by verified email",
				"user", u.ID, "email", email, "issuer", id.Issuer)
		}
		u.Issuer, u.Subject = id.Issuer, id.Subject
	default:
		return nil, nil, fmt.Errorf("find user by identity: %w", err)
	}
	if name != "" {
		u.Name = name
	}
	if u.ID != 0 {
		was := u.Admin
		wasAdmin = &was
	}
	if s.admin.configured() {
		u.Admin = s.admin.IsAdmin(id)
	}
	// Never the disabled flag, the sign-in time or the budget: a save of a
	// row read before an admin disabled the person (or set their budget)
	// would undo it.
	if err := s.db.WithContext(ctx).Omit("DisabledAt", "LastLoginAt", "Budget", "BudgetPeriod").Save(&u).Error; err != nil {
		return nil, nil, fmt.Errorf("save user %s: %w", email, err)
	}
	if err := s.syncTeams(ctx, u.ID, id); err != nil {
		return nil, nil, err
	}
	return &u, wasAdmin, nil
}

// syncTeams places the person in the teams the teams claim names, when one
// is configured: those of an earlier sign-in's claim that it no longer
// names are left, the ones an admin added stay (models.SyncOIDCTeams). A
// claim that is absent is no teams, unless userinfo, which may have held
// it, failed: then the memberships stay as they are until the next sign-in.
func (s *Service) syncTeams(ctx context.Context, userID uint, id Identity) error {
	if s.teams == "" {
		return nil
	}
	v, ok := lookupClaim(id.Claims, s.teams)
	if !ok && id.userinfoFailed {
		s.log.WarnContext(ctx, "teams claim missing and userinfo failed; teams left as they were", "user", userID)
		return nil
	}
	var names []string
	if ok {
		names = claimStrings(v)
	}
	return models.SyncOIDCTeams(ctx, s.db, userID, names)
}
