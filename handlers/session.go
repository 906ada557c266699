package handlers

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/auth"
	"moonji/internal/gateway"
	"moonji/models"
)

// localSession is the c.Locals key of the request's session, loaded once.
const localSession = "moonji.session"

// noSession marks in c.Locals that the request was looked at and has none.
type noSession struct{}

// blockedSession marks in c.Locals that the request's cookie named no
// session and came from an address that has failed too often.
type blockedSession struct{}

// errBlocked means the client's address has failed authentication too often.
var errBlocked = errors.New("too many failed authentications from this address; wait a minute")

// session returns the request's live session, or nil. The cookie is looked
// up first, whatever the address: a valid session is never refused because
// others behind the same address (a NAT, a proxy) failed. A cookie that
// names no live session is cleared and counts as a failed authentication of
// the client's address; from an address that has already failed too often it
// is answered errBlocked, without a log line.
func (h *Handler) session(c *fiber.Ctx) (*models.Session, error) {
	switch v := c.Locals(localSession).(type) {
	case *models.Session:
		return v, nil
	case noSession:
		return nil, nil
	case blockedSession:
		return nil, errBlocked
	}
	cookie := c.Cookies(h.Auth.SessionCookieName())
	if cookie == "" {
		c.Locals(localSession, noSession{})
		return nil, nil
	}
	sess, err := h.Auth.Session(c.UserContext(), cookie)
	if errors.Is(err, auth.ErrNoSession) {
		setCookie(c, h.Auth.SessionCookie("", -1))
		now, addr := time.Now(), h.limitKey(c)
		if h.Auth.Failures.Blocked(addr, now) {
			c.Locals(localSession, blockedSession{})
			return nil, errBlocked
		}
		h.Auth.Failures.Fail(addr, now)
		h.Log.Warn("authentication failed", "kind", "session", "reason", "unknown or expired session",
			"remote", h.clientIP(c), "method", c.Method(), "path", c.Path())
		c.Locals(localSession, noSession{})
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	c.Locals(localSession, sess)
	return sess, nil
}

// csrfOK reports whether a state-changing request carries the session's CSRF
// token: in the X-CSRF-Token header (htmx, scripts) or, when form is true,
// the _csrf form field (plain forms). Safe methods need none.
func (h *Handler) csrfOK(c *fiber.Ctx, sess *models.Session, form bool) bool {
	if auth.SafeMethod(c.Method()) {
		return true
	}
	token := c.Get(auth.CSRFHeader)
	if token == "" && form {
		token = c.FormValue(auth.CSRFField)
	}
	if auth.CheckCSRF(sess, token) {
		return true
	}
	h.Log.Warn("CSRF check failed", "user", sess.UserID, "remote", h.clientIP(c), "method", c.Method(), "path", c.Path())
	return false
}

// sessionPrincipal identifies a signed-in person calling /v1 (the chat page).
// A state-changing call must carry the CSRF token in the X-CSRF-Token header:
// /v1 bodies are JSON, and a cross-site form must not spend a person's quota.
func (h *Handler) sessionPrincipal(c *fiber.Ctx) (gateway.Principal, bool) {
	p, ok, _ := h.webPrincipal(c)
	return p, ok
}

// webPrincipal is sessionPrincipal that also says why there is none:
// errBlocked when the cookie failed from a blocked address.
func (h *Handler) webPrincipal(c *fiber.Ctx) (gateway.Principal, bool, error) {
	if h.Auth == nil {
		return gateway.Principal{}, false, nil
	}
	sess, err := h.session(c)
	if err != nil {
		if !errors.Is(err, errBlocked) {
			h.Log.Error("look up session", "err", err)
		}
		return gateway.Principal{}, false, err
	}
	if sess == nil || !h.csrfOK(c, sess, false) {
		return gateway.Principal{}, false, nil
	}
	return gateway.Principal{UserID: sess.UserID, Email: sess.User.Email, Admin: sess.User.Admin,
		Source: gateway.SourceWeb}, true, nil
}

// RequirePageSession guards pages: without a session, GET goes to the
// sign-in and comes back; a state-changing request without the CSRF token
// is refused. API keys are never looked at: a leaked key opens no page.
func (h *Handler) RequirePageSession(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if errors.Is(err, errBlocked) {
		return h.message(c, http.StatusTooManyRequests, "Too many attempts", err.Error(), "", "")
	}
	if err != nil {
		return err
	}
	if sess == nil {
		if isProgram(c) {
			return pageNeedsSession(c)
		}
		next := "/"
		if c.Method() == fiber.MethodGet {
			next = c.OriginalURL()
		}
		if isHTMX(c) {
			// htmx would follow a redirect and swap the sign-in page into a
			// fragment's place: have the browser go there instead, and come
			// back to the page the request came from.
			if u, err := url.Parse(c.Get("HX-Current-URL")); err == nil && u.Path != "" {
				next = u.RequestURI()
			}
			c.Set("HX-Redirect", "/login?next="+url.QueryEscape(next))
			return c.SendStatus(http.StatusUnauthorized)
		}
		return c.Redirect("/login?next="+url.QueryEscape(next), http.StatusSeeOther)
	}
	if !h.csrfOK(c, sess, true) {
		return h.message(c, http.StatusForbidden, "Request refused",
			"The form was stale or came from another site. Reload the page and try again.", "Reload", "/")
	}
	return c.Next()
}

// isProgram reports whether a request comes from a program rather than a
// browser: it sends Authorization: Bearer (an API key, valid or not), in
// any case of the scheme.
func isProgram(c *fiber.Ctx) bool {
	scheme, _, _ := strings.Cut(strings.TrimSpace(c.Get(fiber.HeaderAuthorization)), " ")
	return strings.EqualFold(scheme, "Bearer")
}

// pageNeedsSession answers a program on a page route. It is told, not
// redirected: 401 in OpenAI's error shape, as /v1 answers a missing key,
// with WWW-Authenticate: Bearer. A script gets a status it can act on
// instead of a sign-in page it cannot use; keys open /v1 alone.
func pageNeedsSession(c *fiber.Ctx) error {
	c.Set(fiber.HeaderWWWAuthenticate, "Bearer")
	c.Set(fiber.HeaderCacheControl, "no-store")
	c.Set(fiber.HeaderContentType, fiber.MIMEApplicationJSON)
	return c.Status(http.StatusUnauthorized).Send(gateway.ErrorBody(
		"This page needs a login session: API keys work on /v1 only. Sign in at /login in a browser.",
		"invalid_request_error", "invalid_api_key"))
}

// RequireAPISession guards /api: a session or 401 (JSON), and the CSRF
// header on state-changing requests. API keys are never accepted here.
func (h *Handler) RequireAPISession(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if errors.Is(err, errBlocked) {
		return c.Status(http.StatusTooManyRequests).JSON(fiber.Map{"error": err.Error()})
	}
	if err != nil {
		return err
	}
	if sess == nil {
		return c.Status(http.StatusUnauthorized).JSON(fiber.Map{"error": "sign in first: /api accepts only a login session"})
	}
	if !h.csrfOK(c, sess, false) {
		return c.Status(http.StatusForbidden).JSON(fiber.Map{"error": "missing or wrong " + auth.CSRFHeader + " header"})
	}
	return c.Next()
}

// RequireAdmin refuses non-admins with 403; it runs after a session guard.
func (h *Handler) RequireAdmin(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	if sess == nil || !sess.User.Admin {
		if strings.HasPrefix(c.Path(), "/api/") {
			return c.Status(http.StatusForbidden).JSON(fiber.Map{"error": "admins only"})
		}
		return h.message(c, http.StatusForbidden, "Admins only", "This page is for Moonji's admins.", "Home", "/")
	}
	return c.Next()
}
