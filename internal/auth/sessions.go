package auth

import (
	"context"
	"errors"
	"net/http"
	"time"

	"moonji/models"
)

// ErrNoSession means the cookie names no live session: missing, unknown,
// idle too long or past its absolute end.
var ErrNoSession = errors.New("no valid session")

// touchEvery spaces out last-seen writes: the idle timeout is hours, so a
// minute's imprecision costs nothing and saves a write per request.
const touchEvery = time.Minute

// CreateSession starts a session for a user and returns the cookie value. The
// session named by oldCookie, if any, is ended: the id changes at every
// sign-in, so a session id planted before sign-in is worthless after it.
func (s *Service) CreateSession(ctx context.Context, userID uint, idToken, oldCookie string) (string, *models.Session, error) {
	if oldCookie != "" {
		if err := models.DeleteSession(ctx, s.db, hashToken(oldCookie)); err != nil {
			return "", nil, err
		}
	}
	cookie, err := randomToken()
	if err != nil {
		return "", nil, err
	}
	csrf, err := randomToken()
	if err != nil {
		return "", nil, err
	}
	now := time.Now().UTC()
	sess := &models.Session{ID: hashToken(cookie), UserID: userID, CSRFToken: csrf, IDToken: idToken,
		CreatedAt: now, LastSeenAt: now, ExpiresAt: now.Add(s.maxAge)}
	if err := models.CreateSession(ctx, s.db, sess); err != nil {
		return "", nil, err
	}
	s.sweep(ctx, now)
	return cookie, sess, nil
}

// Session returns the live session named by a cookie value, with its user,
// and records the activity. A disabled person's session is ended and
// refused: disabling deletes their sessions, and this catches one that a
// sign-in in flight created just after.
func (s *Service) Session(ctx context.Context, cookie string) (*models.Session, error) {
	if cookie == "" || len(cookie) > 200 {
		return nil, ErrNoSession
	}
	sess, err := models.SessionByID(ctx, s.db, hashToken(cookie))
	if errors.Is(err, models.ErrNotFound) {
		return nil, ErrNoSession
	}
	if err != nil {
		return nil, err
	}
	now := time.Now()
	if sess.User.Disabled() || !now.Before(sess.ExpiresAt) || !now.Before(sess.LastSeenAt.Add(s.idle)) {
		if err := models.DeleteSession(ctx, s.db, sess.ID); err != nil {
			s.log.WarnContext(ctx, "delete expired session", "err", err)
		}
		return nil, ErrNoSession
	}
	if now.Sub(sess.LastSeenAt) > touchEvery {
		if err := models.TouchSession(ctx, s.db, sess.ID, now); err != nil {
			// The session still works; it just may idle out a little early.
			s.log.WarnContext(ctx, "record session activity", "err", err)
		} else {
			sess.LastSeenAt = now.UTC()
		}
	}
	return sess, nil
}

// EndSession deletes the session named by a cookie value and returns it (its
// ID token serves the provider's logout), or nil when there was none.
func (s *Service) EndSession(ctx context.Context, cookie string) (*models.Session, error) {
	if cookie == "" {
		return nil, nil
	}
	sess, err := models.SessionByID(ctx, s.db, hashToken(cookie))
	if errors.Is(err, models.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if err := models.DeleteSession(ctx, s.db, sess.ID); err != nil {
		return nil, err
	}
	return sess, nil
}

// SessionCookie builds the session cookie for a value; maxAge < 0 deletes it.
// The browser keeps it for the absolute lifetime; the server enforces idleness.
func (s *Service) SessionCookie(value string, maxAge int) *http.Cookie {
	return &http.Cookie{Name: s.SessionCookieName(), Value: value, Path: "/", MaxAge: maxAge,
		HttpOnly: true, Secure: s.secure, SameSite: http.SameSiteLaxMode}
}

// NewSessionCookie is SessionCookie for a session just created.
func (s *Service) NewSessionCookie(value string) *http.Cookie {
	return s.SessionCookie(value, int(s.maxAge/time.Second))
}

// LoginCookie builds the cookie that carries a sign-in's state to the
// callback. SameSite=Lax still sends it on the provider's top-level redirect
// back; the path keeps it off every other request.
func (s *Service) LoginCookie(value string, maxAge int) *http.Cookie {
	return &http.Cookie{Name: LoginCookieName, Value: value, Path: CallbackPath, MaxAge: maxAge,
		HttpOnly: true, Secure: s.secure, SameSite: http.SameSiteLaxMode}
}

// sweep deletes expired sessions and abandoned sign-ins. It runs at sign-in,
// which is rare enough to be cheap and frequent enough to keep tables small.
func (s *Service) sweep(ctx context.Context, now time.Time) {
	if err := models.DeleteExpiredSessions(ctx, s.db, now, now.Add(-s.idle)); err != nil {
		s.log.WarnContext(ctx, "sweep sessions", "err", err)
	}
	if err := models.DeleteExpiredLoginStates(ctx, s.db, now); err != nil {
		s.log.WarnContext(ctx, "sweep login states", "err", err)
	}
}
