package handlers

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/usageexport"
	"moonji/models"
	"moonji/views"
)

// usageKeysLimit bounds the person's key table: far more keys than anyone
// keeps, but a bound all the same (revoked keys stay in the ledger).
const usageKeysLimit = 100

// Export's since: the default, and how far back a download may reach.
const (
	exportDefaultSince = "30d"
	exportMaxAge       = 366 * 24 * time.Hour
)

// exportChoices are the download form's "since" options.
var exportChoices = []struct{ value, label string }{
	{"24h", "the last 24 hours"}, {"7d", "the last 7 days"}, {"30d", "the last 30 days"},
	{"90d", "the last 90 days"}, {"366d", "the last year"},
}

// Usage serves GET /usage: the signed-in person's own requests, tokens and
// cost, by day (or hour) and model, and by key and the web chat; and the
// budgets their spending counts against. Every query is bound to the
// session's user id: nobody sees another person's use here.
func (h *Handler) Usage(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	if sess == nil || sess.UserID == 0 {
		// The route's guard sees to this; a zero id would mean "everyone".
		return fiber.ErrUnauthorized
	}
	rng, w := dashboardWindow(c.Query("range"), range30d, time.Now())
	ctx := c.UserContext()
	points, err := models.UsageOverTime(ctx, h.DB, w, sess.UserID)
	if err != nil {
		return fmt.Errorf("usage page: %w", err)
	}
	keys, err := models.TopKeys(ctx, h.DB, w, sess.UserID, usageKeysLimit+1)
	if err != nil {
		return fmt.Errorf("usage page keys: %w", err)
	}
	chat, err := models.ChatTotal(ctx, h.DB, w, sess.UserID)
	if err != nil {
		return fmt.Errorf("usage page chat: %w", err)
	}
	d := views.UsagePage{Page: dashboardPageFor("Usage", sess), Usage: usageView(points, w, rng, "/usage")}
	d.Usage.Currency = h.Currency
	if len(keys) > usageKeysLimit {
		keys, d.KeysCapped = keys[:usageKeysLimit], true
	}
	if chat.Requests > 0 {
		// The chat last: it is no key, whatever it used.
		keys = append(keys, chat)
	}
	d.Keys = viewKeyTotals(keys)
	if d.Budgets, d.BudgetsUnknown, err = h.personBudgets(ctx, sess.UserID, time.Now()); err != nil {
		return fmt.Errorf("usage page budgets: %w", err)
	}
	for _, ch := range exportChoices {
		d.ExportSince = append(d.ExportSince, views.ExportChoice{Value: ch.value, Label: ch.label, Selected: ch.value == exportDefaultSince})
	}
	return render(c, http.StatusOK, views.Usage(d))
}

// UsageExport serves GET /usage/export?format=csv|jsonl&since=: the
// person's own ledger rows, in the format of `moonji usage export`, as a
// download. Rows are streamed from the database as the client reads them.
func (h *Handler) UsageExport(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	if sess == nil || sess.UserID == 0 {
		return fiber.ErrUnauthorized
	}
	// One of the constants, not the query's string: that points into a
	// buffer Fiber reuses once the handler returns, and the writer below
	// runs after.
	var format string
	switch c.Query("format") {
	case usageexport.CSV:
		format = usageexport.CSV
	case usageexport.JSONL:
		format = usageexport.JSONL
	default:
		return exportProblem(c, "format must be csv or jsonl.")
	}
	now := time.Now()
	since, problem := exportSince(c.Query("since"), now)
	if problem != "" {
		return exportProblem(c, problem)
	}

	name := fmt.Sprintf("moonji-usage-%s.%s", now.UTC().Format("20060102-150405"), format)
	c.Set(fiber.HeaderContentType, usageexport.ContentType(format))
	c.Set(fiber.HeaderContentDisposition, `attachment; filename="`+name+`"`)
	c.Set(fiber.HeaderCacheControl, "no-store")
	c.Set(fiber.HeaderXContentTypeOptions, "nosniff")
	// The writer runs after this handler returns: only what is copied out
	// here (streamBody). A client that stops reading fails a write after
	// StreamWriteTimeout instead of keeping the rows' query open.
	db, log, user, currency := h.DB, h.Log, sess.UserID, h.Currency
	ctx, cancel := context.WithCancel(context.Background())
	h.streamBody(ctx, cancel, c, "usage export", func(ctx context.Context, w *bufio.Writer, flush func() error) {
		_ = flush() // arm the deadline before the first rows
		if err := usageexport.Write(ctx, db, w, format, currency, since, user, flush); err != nil && !errors.Is(err, context.Canceled) {
			// The status has left already: the download ends short.
			log.Warn("usage export cut short", "user", user, "format", format, "err", err)
		}
	})
	return nil
}

// exportSince reads ?since= like the CLI's --since (RFC 3339, a date, or a
// duration such as 7d), 30 days when absent, and at most a year back.
func exportSince(s string, now time.Time) (time.Time, string) {
	if s == "" {
		s = exportDefaultSince
	}
	if len(s) > 64 {
		return time.Time{}, "since is too long: give a time (RFC 3339), a date (YYYY-MM-DD) or a duration such as 7d."
	}
	since, err := usageexport.ParseSince(s, now)
	if err != nil {
		return time.Time{}, "since: " + err.Error() + "."
	}
	if since.Before(now.Add(-exportMaxAge)) {
		return time.Time{}, "since reaches back at most a year (366d); export older rows with `moonji usage export`."
	}
	return since, ""
}

// exportProblem answers a bad export request: 400 with a sentence saying
// what to change, as plain text (it is read in a browser tab or by curl).
func exportProblem(c *fiber.Ctx, msg string) error {
	c.Set(fiber.HeaderContentType, fiber.MIMETextPlainCharsetUTF8)
	c.Set(fiber.HeaderCacheControl, "no-store")
	c.Set(fiber.HeaderXContentTypeOptions, "nosniff")
	return c.Status(http.StatusBadRequest).SendString(msg + "\n")
}
