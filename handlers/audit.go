package handlers

import (
	"errors"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/audit"
	"moonji/internal/auth"
	"moonji/models"
)

// record appends an audit event made by the signed-in person of sess from
// this request's address (clientIP: X-Forwarded-For only from a trusted
// proxy). Recording never fails the change it records (audit.Log.Record).
func (h *Handler) record(c *fiber.Ctx, sess *models.Session, action, target, detail string) {
	if sess == nil {
		h.recordAs(c, 0, "", action, target, detail)
		return
	}
	h.recordAs(c, sess.UserID, sess.User.Email, action, target, detail)
}

// recordAs is record for an actor known by id and email.
func (h *Handler) recordAs(c *fiber.Ctx, actorID uint, actor, action, target, detail string) {
	h.Audit.Record(c.UserContext(), audit.Event{ActorID: actorID, Actor: actor, Action: action, Target: target,
		Detail: detail, Address: h.clientIP(c)})
}

// signInFailureReasons say, per failure, why a sign-in failed; the
// provider's own words are anyone's text and are not stored whole.
func signInFailureReason(err error) string {
	switch {
	case errors.Is(err, auth.ErrLoginExpired):
		return "expired or unknown sign-in state"
	case errors.Is(err, auth.ErrProviderRefused):
		return "refused by the provider: " + boundText(strings.TrimPrefix(err.Error(), auth.ErrProviderRefused.Error()+": "), 200)
	case errors.Is(err, auth.ErrDisabled):
		return "account disabled"
	case errors.Is(err, auth.ErrNoEmail):
		return "the provider sent no email"
	case errors.Is(err, auth.ErrEmailConflict):
		return "email used by another account of this provider"
	case errors.Is(err, auth.ErrEmailTaken):
		return "email taken and not verified by the provider"
	}
	return "sign-in could not be completed"
}

// boundText cuts s to at most n runes.
func boundText(s string, n int) string {
	s = models.StorableText(s)
	if r := []rune(s); len(r) > n {
		return string(r[:n]) + "…"
	}
	return s
}

// recordFailedSignIn records a failed sign-in: who it claimed to be when
// the provider said, and why. Anyone can fail a sign-in as often as they
// like (a callback with a made-up state costs nothing), so recording is
// bounded per address by AuditSignInFailures: past the bound, one event
// says that the address's further failures in this window go unrecorded
// (they are still logged), so that a flood cannot fill the table.
func (h *Handler) recordFailedSignIn(c *fiber.Ctx, err error) {
	e := audit.Event{Action: audit.SignInFailed, Target: "sign-in", Address: h.clientIP(c), Detail: signInFailureReason(err)}
	var lf *auth.LoginFailure
	if errors.As(err, &lf) {
		e.ActorID, e.Actor = lf.UserID, lf.Email
		if lf.Email != "" {
			e.Target = audit.PersonTarget(lf.Email)
		}
	}
	if l := h.AuditSignInFailures; l != nil {
		ok, _, first := l.Allow(h.limitKey(c), time.Now())
		if !ok {
			if first {
				e.ActorID, e.Actor, e.Target = 0, "", "sign-in"
				e.Detail = "more failed sign-ins from this address: not recorded until the minute ends"
				h.Audit.Record(c.UserContext(), e)
			}
			return
		}
	}
	h.Audit.Record(c.UserContext(), e)
}
