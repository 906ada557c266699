package auth

import (
	"moonji/internal/csrfmask"
	"moonji/models"
)

// CSRFHeader is the header htmx and scripts send the session's CSRF token in;
// plain forms send it in the CSRFField field instead.
const (
	CSRFHeader = "X-CSRF-Token"
	CSRFField  = "_csrf"
)

// SafeMethod reports whether a method changes nothing and so needs no CSRF
// token.
func SafeMethod(method string) bool {
	switch method {
	case "GET", "HEAD", "OPTIONS":
		return true
	}
	return false
}

// CheckCSRF reports whether token is the session's CSRF token, as it is or
// masked as pages carry it (csrfmask). The token is random per session and
// compared in constant time; a cross-site page can make the browser send
// the cookie but cannot read the token.
func CheckCSRF(sess *models.Session, token string) bool {
	token = csrfmask.Unmask(token)
	return sess != nil && sess.CSRFToken != "" && token != "" && equal(sess.CSRFToken, token)
}
