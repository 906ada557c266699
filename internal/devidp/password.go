package devidp

import (
	"crypto/rand"
	"fmt"

	"golang.org/x/crypto/bcrypt"
)

// HashPassword returns the bcrypt hash of pw at the default cost. bcrypt refuses passwords longer
// than 72 bytes, and so does HashPassword.
func HashPassword(pw string) ([]byte, error) {
	h, err := bcrypt.GenerateFromPassword([]byte(pw), bcrypt.DefaultCost)
	if err != nil {
		return nil, fmt.Errorf("devidp: hash password: %w", err)
	}
	return h, nil
}

// CheckPassword reports whether pw matches the bcrypt hash.
func CheckPassword(hash []byte, pw string) bool {
	return bcrypt.CompareHashAndPassword(hash, []byte(pw)) == nil
}

// GeneratePassword returns a random password with 130 bits of entropy (26 base32 characters),
// meant for the first-start admin whose password is printed once.
func GeneratePassword() string {
	return rand.Text()
}

// newID returns an unguessable identifier for auth requests, tokens and sessions.
func newID() string {
	return rand.Text()
}
