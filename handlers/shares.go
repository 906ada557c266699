package handlers

import (
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/a-h/templ"
	"github.com/gofiber/fiber/v2"

	"moonji/internal/audit"
	"moonji/internal/share"
	"moonji/models"
	"moonji/views"
)

// Shares serves share links: their JSON API, the chat's Share panel, the
// person's list of links and the page a link opens.
type Shares struct {
	*Handler
	Service *share.Service
	// Public lets anyone with a link open it (share.public); otherwise a
	// signed-out visitor is sent to sign in first.
	Public bool
	// PublicURL starts the links' URLs.
	PublicURL string
}

// sharedCSP is the shared page's policy: Moonji's stylesheets and nothing
// else — no script whatever a conversation holds, no image from elsewhere,
// no form, no frame.
const sharedCSP = "default-src 'none'; script-src 'none'; style-src 'self'; img-src 'self' data:; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// linkURL is the address of link token.
func (h *Shares) linkURL(token string) string { return h.PublicURL + "/s/" + token }

// shareError answers the API's share errors in OpenAI's shape.
func (h *Shares) shareError(c *fiber.Ctx, err error, notFound string) error {
	const invalid = "invalid_request_error"
	switch {
	case errors.Is(err, share.ErrNotFound):
		return apiError(c, http.StatusNotFound, notFound, invalid, "not_found")
	case errors.Is(err, share.ErrBadExpiry):
		return apiErrorParam(c, http.StatusBadRequest, err.Error()+".", invalid, "invalid_request", "expires_in")
	case errors.Is(err, share.ErrTooMany):
		return apiError(c, http.StatusTooManyRequests, "You keep "+strconv.Itoa(h.Service.MaxPerPerson())+
			" share links, the most allowed: revoke some first.", "requests", "too_many_shares")
	case errors.Is(err, share.ErrEmpty):
		return apiError(c, http.StatusBadRequest, "The conversation has no finished message to share yet.", invalid, "nothing_to_share")
	case errors.Is(err, share.ErrTooLarge):
		return apiError(c, http.StatusBadRequest, "The conversation is too long to share.", invalid, "conversation_too_large")
	default:
		return h.chatError(c, err)
	}
}

// CreateShare serves POST /api/v1/conversations/{id}/shares
// {"expires_in", "show_author"}: 201 {"token", "url", "expires_at"}.
func (h *Shares) CreateShare(c *fiber.Ctx) error {
	p, ok := h.person(c)
	if !ok {
		return apiError(c, http.StatusUnauthorized, "Sign in first.", "invalid_request_error", "unauthorized")
	}
	req, err := parseShareBody(c.Body())
	if err != nil {
		return badBody(c, err)
	}
	sh, err := h.Service.Create(c.UserContext(), p.UserID, c.Params("id"), req)
	if err != nil {
		return h.shareError(c, err, "No such conversation.")
	}
	h.recordAs(c, p.UserID, p.Email, audit.ShareCreate, audit.ShareTarget(sh.ConversationID, sh.Title), shareDetail(sh))
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.Status(http.StatusCreated).JSON(fiber.Map{"token": sh.Token, "url": h.linkURL(sh.Token),
		"expires_at": sh.ExpiresAt, "show_author": sh.ShowAuthor})
}

// DeleteShare serves DELETE /api/v1/shares/{token}: the link answers 404
// from now on. Someone else's link is not found.
func (h *Shares) DeleteShare(c *fiber.Ctx) error {
	p, ok := h.person(c)
	if !ok {
		return apiError(c, http.StatusUnauthorized, "Sign in first.", "invalid_request_error", "unauthorized")
	}
	if err := h.revokeShare(c, p.UserID, p.Email, c.Params("token")); err != nil {
		return h.shareError(c, err, "No such share link.")
	}
	return c.SendStatus(http.StatusNoContent)
}

// SharePanel serves GET /c/{id}/share: the Share panel of a conversation.
func (h *Shares) SharePanel(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	if _, _, err := h.Chat.Get(c.UserContext(), sess.UserID, c.Params("id")); errors.Is(err, share.ErrNotFound) {
		return fiber.ErrNotFound
	} else if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.SharePanelView(h.panel(sess, c.Params("id"))))
}

func (h *Shares) panel(sess *models.Session, id string) views.SharePanel {
	return views.SharePanel{ConversationID: id, CSRF: sess.CSRFToken, Public: h.Public,
		Author: share.Author(sess.User.Name, sess.User.Email)}
}

// CreateSharePage serves POST /c/{id}/share: the panel's form. With htmx
// the panel comes back with the link; a plain form goes to /shares, where
// the new link is first.
func (h *Shares) CreateSharePage(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	id := c.Params("id")
	d := h.panel(sess, id)
	d.ShowAuthor = c.FormValue("show_author") != ""
	secs, err := strconv.Atoi(strings.TrimSpace(c.FormValue("expires_in", "0")))
	if err == nil && secs >= 0 && secs <= int(share.MaxExpiry/time.Second) {
		d.Expiry = secs
	} else {
		d.Error = "Choose when the link expires."
		return render(c, http.StatusUnprocessableEntity, views.SharePanelView(d))
	}
	sh, err := h.Service.Create(c.UserContext(), sess.UserID, id, share.Request{ExpiresIn: time.Duration(secs) * time.Second,
		ShowAuthor: d.ShowAuthor})
	switch {
	case errors.Is(err, share.ErrNotFound):
		return fiber.ErrNotFound
	case errors.Is(err, share.ErrBadExpiry):
		d.Error = "A link expires between a minute and a year from now, or never."
	case errors.Is(err, share.ErrTooMany):
		d.Error = "You keep " + strconv.Itoa(h.Service.MaxPerPerson()) + " share links, the most allowed: revoke some on Your shared links first."
	case errors.Is(err, share.ErrEmpty):
		d.Error = "Nothing to share yet: wait for the first answer."
	case errors.Is(err, share.ErrTooLarge):
		d.Error = "This conversation is too long to share."
	case err != nil:
		return err
	}
	if d.Error != "" {
		return render(c, http.StatusUnprocessableEntity, views.SharePanelView(d))
	}
	h.record(c, sess, audit.ShareCreate, audit.ShareTarget(sh.ConversationID, sh.Title), shareDetail(sh))
	if !isHTMX(c) {
		return c.Redirect("/shares", http.StatusSeeOther)
	}
	d.URL, d.Expires = h.linkURL(sh.Token), sh.ExpiresAt
	return render(c, http.StatusOK, views.SharePanelView(d))
}

// SharesList serves GET /shares: the person's links.
func (h *Shares) SharesList(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	d, err := h.sharesPage(c, sess)
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.Shares(d))
}

func (h *Shares) sharesPage(c *fiber.Ctx, sess *models.Session) (views.SharesPage, error) {
	links, err := h.Service.List(c.UserContext(), sess.UserID)
	if err != nil {
		return views.SharesPage{}, err
	}
	d := views.SharesPage{Page: pageFor("Shared links", sess), Public: h.Public, Max: h.Service.MaxPerPerson()}
	for _, l := range links {
		d.Links = append(d.Links, views.ShareLink{Token: l.Token, URL: h.linkURL(l.Token), ConversationID: l.ConversationID,
			Title: l.Title, ShowAuthor: l.ShowAuthor, Created: l.Created, Expires: l.Expires, Expired: l.Expired})
	}
	return d, nil
}

// RevokeSharePage serves POST /shares/{token}/revoke: the list comes back
// without the link (htmx), or the page is loaded again.
func (h *Shares) RevokeSharePage(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	err = h.revokeShare(c, sess.UserID, sess.User.Email, c.Params("token"))
	if errors.Is(err, share.ErrNotFound) {
		return h.message(c, http.StatusNotFound, "Not found", "There is no such link of yours.", "Your shared links", "/shares")
	}
	if err != nil {
		return err
	}
	if !isHTMX(c) {
		return c.Redirect("/shares", http.StatusSeeOther)
	}
	d, err := h.sharesPage(c, sess)
	if err != nil {
		return err
	}
	d.Notice = "Revoked: the link no longer opens."
	return render(c, http.StatusOK, views.ShareList(d))
}

// Shared serves GET /s/{token}: the copy a link opens. Unknown, revoked
// and expired links get one and the same 404. Unless share.public, a
// signed-out visitor is sent to sign in and back first, before anything
// about the link is looked up.
func (h *Shares) Shared(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil && !errors.Is(err, errBlocked) {
		return err
	}
	c.Set(fiber.HeaderReferrerPolicy, "no-referrer")
	c.Set("X-Robots-Tag", "noindex")
	if sess == nil {
		if !h.Public {
			c.Set(fiber.HeaderCacheControl, "no-store")
			return c.Redirect("/login?next="+url.QueryEscape(c.Path()), http.StatusSeeOther)
		}
		// Anyone may ask: each asking counts against their address's
		// budget of requests without a credential.
		if h.Keyless != nil {
			if ok, retry, _ := h.Keyless.Allow(h.limitKey(c), time.Now()); !ok {
				c.Set(fiber.HeaderRetryAfter, strconv.Itoa(max(1, int(retry.Seconds()+0.5))))
				return h.message(c, http.StatusTooManyRequests, "Too many requests", "Wait a minute and try again.", "", "")
			}
		}
	}
	got, err := h.Service.Open(c.UserContext(), c.Params("token"))
	if errors.Is(err, share.ErrNotFound) {
		return sharedPage(c, http.StatusNotFound, views.ShareGone())
	}
	if err != nil {
		return err
	}
	d := views.SharedPage{Title: got.Title, Created: got.Created, Author: got.Author}
	for _, m := range got.Messages {
		d.Messages = append(d.Messages, views.SharedMessage{Role: m.Role, Status: m.Status, Model: m.Model, Text: m.Content, HTML: m.HTML})
	}
	return sharedPage(c, http.StatusOK, views.Shared(d))
}

// sharedPage writes a page a link opens: render's headers, with the
// strict policy of sharedCSP instead of the pages' own.
func sharedPage(c *fiber.Ctx, status int, comp templ.Component) error {
	c.Set(fiber.HeaderContentType, fiber.MIMETextHTMLCharsetUTF8)
	c.Set(fiber.HeaderCacheControl, "no-store")
	c.Set(fiber.HeaderXFrameOptions, "DENY")
	c.Set(fiber.HeaderContentSecurityPolicy, sharedCSP)
	c.Set(fiber.HeaderXContentTypeOptions, "nosniff")
	c.Status(status)
	return comp.Render(c.UserContext(), c.Response().BodyWriter())
}

// revokeShare revokes the person's link token and records it, naming the
// link by its conversation: the token is the link's secret and is never
// recorded, not even in part.
func (h *Shares) revokeShare(c *fiber.Ctx, userID uint, email, token string) error {
	var target string
	if share.ValidToken(token) {
		if sh, err := models.ShareOf(c.UserContext(), h.DB, userID, token); err == nil {
			target = audit.ShareTarget(sh.ConversationID, sh.Title)
		}
	}
	if err := h.Service.Revoke(c.UserContext(), userID, token); err != nil {
		return err
	}
	if target == "" {
		target = "a share link"
	}
	h.recordAs(c, userID, email, audit.ShareRevoke, target, "")
	return nil
}

// shareDetail is a new link's settings, as its audit event's detail.
func shareDetail(sh *models.Share) string {
	var ch audit.Changes
	if sh.ExpiresAt != nil {
		ch.Note("expires %s", sh.ExpiresAt.UTC().Format(time.RFC3339))
	} else {
		ch.Note("expires never")
	}
	ch.Note("author shown %t", sh.ShowAuthor)
	return ch.String()
}
