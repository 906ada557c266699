package handlers

import (
	"errors"
	"net/http"
	"strconv"
	"strings"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/audit"
	"moonji/internal/auth"
)

// Login serves GET /login: it sends the browser to the provider with a fresh
// state and PKCE challenge (the embedded provider or a real one, by the same
// code). A browser already signed in goes straight on.
func (h *Handler) Login(c *fiber.Ctx) error {
	next := auth.SafeNext(c.Query("next"))
	if sess, err := h.session(c); err == nil && sess != nil {
		return c.Redirect(next, http.StatusSeeOther)
	}
	redirect, state, err := h.Auth.BeginLogin(c.UserContext(), next)
	if err != nil {
		h.Log.Error("start sign-in", "err", err)
		if errors.Is(err, auth.ErrProviderUnreachable) {
			return h.message(c, http.StatusBadGateway, "Sign-in unavailable",
				"The sign-in provider cannot be reached. Try again in a moment.", "Try again", "/login")
		}
		return err
	}
	setCookie(c, h.Auth.LoginCookie(state, int(auth.DefaultLoginTimeout.Seconds())))
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.Redirect(redirect, http.StatusSeeOther)
}

// Callback serves GET /auth/callback, where the provider sends the browser
// back: it completes the sign-in and starts a session with a new id.
func (h *Handler) Callback(c *fiber.Ctx) error {
	login, err := h.Auth.FinishLogin(c.UserContext(), auth.Callback{
		CookieState:      strings.Clone(c.Cookies(auth.LoginCookieName)),
		State:            c.Query("state"),
		Code:             c.Query("code"),
		Error:            c.Query("error"),
		ErrorDescription: c.Query("error_description"),
		OldSession:       strings.Clone(c.Cookies(h.Auth.SessionCookieName())),
	})
	// The state is single-use whatever happened.
	setCookie(c, h.Auth.LoginCookie("", -1))
	if err != nil {
		h.recordFailedSignIn(c, err)
		return h.loginFailed(c, err)
	}
	h.recordSignIn(c, login)
	setCookie(c, h.Auth.NewSessionCookie(login.Cookie))
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.Redirect(login.Next, http.StatusSeeOther)
}

// loginFailed explains a failed callback. Expected failures are the
// person's to fix; the rest are logged as errors.
func (h *Handler) loginFailed(c *fiber.Ctx, err error) error {
	switch {
	case errors.Is(err, auth.ErrLoginExpired):
		h.Log.Warn("sign-in callback refused", "reason", err.Error(), "remote", h.clientIP(c))
		return h.message(c, http.StatusBadRequest, "Sign-in expired",
			"This sign-in has expired or was started in another window.", "Sign in again", "/login")
	case errors.Is(err, auth.ErrProviderRefused):
		h.Log.Warn("sign-in refused by the provider", "err", err, "remote", h.clientIP(c))
		return h.message(c, http.StatusForbidden, "Sign-in refused",
			"The sign-in provider did not sign you in.", "Try again", "/login")
	case errors.Is(err, auth.ErrDisabled):
		// auth has logged who; the person learns why, not how to get around it.
		return h.message(c, http.StatusForbidden, "Account disabled",
			"An admin has disabled your Moonji account. Ask an admin to enable it again.", "Home", "/")
	case errors.Is(err, auth.ErrNoEmail), errors.Is(err, auth.ErrEmailConflict), errors.Is(err, auth.ErrEmailTaken):
		h.Log.Warn("sign-in cannot become a user", "err", err, "remote", h.clientIP(c))
		return h.message(c, http.StatusForbidden, "Cannot sign you in", err.Error()+".", "Home", "/")
	}
	h.Log.Error("complete sign-in", "err", err, "remote", h.clientIP(c))
	return h.message(c, http.StatusBadGateway, "Sign-in failed",
		"The sign-in could not be completed. Try again.", "Try again", "/login")
}

// Logout serves POST /logout (a form with the CSRF token, so that another
// site cannot sign people out). It ends the session here, then sends the
// browser to the provider's end_session, when it has one, to end the
// sign-in there too.
func (h *Handler) Logout(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil && !errors.Is(err, errBlocked) {
		return err
	}
	if sess == nil {
		return c.Redirect("/", http.StatusSeeOther)
	}
	if !h.csrfOK(c, sess, true) {
		return h.message(c, http.StatusForbidden, "Request refused",
			"The form was stale or came from another site. Reload the page and try again.", "Home", "/")
	}
	ended, err := h.Auth.EndSession(c.UserContext(), strings.Clone(c.Cookies(h.Auth.SessionCookieName())))
	if err != nil {
		return err
	}
	setCookie(c, h.Auth.SessionCookie("", -1))
	h.Log.Info("signed out", "user", sess.UserID)
	h.record(c, sess, audit.SignOut, audit.PersonTarget(sess.User.Email), "")
	idToken := ""
	if ended != nil {
		idToken = ended.IDToken
	}
	if u := h.Auth.LogoutURL(c.UserContext(), idToken); u != "" {
		return c.Redirect(u, http.StatusSeeOther)
	}
	return c.Redirect("/", http.StatusSeeOther)
}

// recordSignIn records a sign-in and, when the provider's claim changed
// the person's role with it, that change.
func (h *Handler) recordSignIn(c *fiber.Ctx, login *auth.Login) {
	sess := login.Session
	target := audit.PersonTarget(login.User.Email)
	detail := ""
	if login.User.Admin {
		detail = "admin"
	}
	h.record(c, sess, audit.SignIn, target, detail)
	if login.WasAdmin != nil && *login.WasAdmin != login.User.Admin {
		var ch audit.Changes
		ch.Set("admin", strconv.FormatBool(*login.WasAdmin), strconv.FormatBool(login.User.Admin))
		ch.Note("by the sign-in provider's claim")
		h.record(c, sess, audit.PersonUpdate, target, ch.String())
	}
}
