package handlers

import (
	"github.com/a-h/templ"
	"github.com/gofiber/fiber/v2"

	"moonji/models"
	"moonji/views"
)

// pageCSP allows only Moonji's own scripts and styles. It has no form-action
// on purpose: browsers apply it to the redirects after a POST, and logging
// out redirects to the provider, which may be on another origin.
const pageCSP = "default-src 'self'; img-src 'self' data:; object-src 'none'; frame-ancestors 'none'; base-uri 'none'"

// render writes an HTML page or fragment, kept out of caches (pages may show
// a key's secret) and out of frames.
func render(c *fiber.Ctx, status int, comp templ.Component) error {
	c.Set(fiber.HeaderContentType, fiber.MIMETextHTMLCharsetUTF8)
	c.Set(fiber.HeaderCacheControl, "no-store")
	c.Set(fiber.HeaderXFrameOptions, "DENY")
	c.Set(fiber.HeaderContentSecurityPolicy, pageCSP)
	c.Set(fiber.HeaderXContentTypeOptions, "nosniff")
	c.Status(status)
	return comp.Render(c.UserContext(), c.Response().BodyWriter())
}

// pageFor is the layout data for a page seen through a session (nil: signed out).
func pageFor(title string, sess *models.Session) views.Page {
	p := views.Page{Title: title}
	if sess != nil {
		p.User = &views.User{Email: sess.User.Email, Name: sess.User.Name, Admin: sess.User.Admin}
		p.CSRF = sess.CSRFToken
	}
	return p
}

// dashboardPageFor is pageFor for the pages of numbers, tables and charts
// (usage, keys, the admin's), which load dashboard.css; the chat does not.
func dashboardPageFor(title string, sess *models.Session) views.Page {
	p := pageFor(title, sess)
	p.Dashboard = true
	return p
}

// message renders a page with a sentence and a way on, for the request's session.
func (h *Handler) message(c *fiber.Ctx, status int, title, text, linkText, link string) error {
	var sess *models.Session
	if v, ok := c.Locals(localSession).(*models.Session); ok {
		sess = v
	}
	return render(c, status, views.Message(pageFor(title, sess), text, linkText, link))
}

// isHTMX reports whether htmx sent the request, which then wants a fragment.
func isHTMX(c *fiber.Ctx) bool { return c.Get("HX-Request") == "true" }
