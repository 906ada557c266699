package auth

import (
	"context"
	"errors"
	"strconv"

	"gorm.io/gorm"

	"moonji/internal/devidp"
	"moonji/models"
)

// DevAccounts lets the embedded development provider sign in Moonji's own
// users: the subject is the user's id, the password its bcrypt hash.
type DevAccounts struct{ DB *gorm.DB }

var _ devidp.Accounts = DevAccounts{}

// AccountByEmail implements devidp.Accounts; emails match case-insensitively.
func (a DevAccounts) AccountByEmail(ctx context.Context, email string) (*devidp.Account, error) {
	u, err := models.UserByEmail(ctx, a.DB, email)
	return account(u, err)
}

// AccountBySubject implements devidp.Accounts.
func (a DevAccounts) AccountBySubject(ctx context.Context, subject string) (*devidp.Account, error) {
	id, err := strconv.ParseUint(subject, 10, 64)
	if err != nil || id == 0 {
		return nil, nil
	}
	u, err := models.UserByID(ctx, a.DB, uint(id))
	return account(u, err)
}

func account(u *models.User, err error) (*devidp.Account, error) {
	if errors.Is(err, models.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &devidp.Account{Subject: strconv.FormatUint(uint64(u.ID), 10), Email: u.Email, Name: u.Name,
		Admin: u.Admin, PasswordHash: u.PasswordHash}, nil
}
