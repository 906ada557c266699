package handlers

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/audit"
	"moonji/internal/usageexport"
	"moonji/models"
	"moonji/views"
)

// The audit log's page and download (/admin/audit, admins only: the route
// group's RequireAdmin). Both read the same filter from the query string;
// a value that cannot be one is refused with 400 and a sentence, never
// guessed at.

// Page sizes of /admin/audit: the default, and the most ?limit= may ask.
const (
	auditPageSize    = 50
	auditMaxPageSize = 200
)

// auditFilter reads the filter of the query string; problem is a sentence
// for the person when a value is refused.
func auditFilter(c *fiber.Ctx) (f models.AuditFilter, form views.AuditFilter, problem string) {
	form.Action = c.Query("action")
	if form.Action != "" && !audit.Known(form.Action) {
		form.Action = ""
		return f, form, "Choose an action from the list."
	}
	f.Action = form.Action
	var ok bool
	if form.Actor, ok = readFilter(c.Query("actor")); !ok {
		return f, form, "The actor filter is too long: 320 characters at most."
	}
	if form.Target, ok = readFilter(c.Query("target")); !ok {
		return f, form, "The target filter is too long: 320 characters at most."
	}
	f.Actor, f.Target = form.Actor, form.Target
	var from, to time.Time
	if from, problem = auditDate(c.Query("from"), "from"); problem != "" {
		return f, form, problem
	}
	if to, problem = auditDate(c.Query("to"), "to"); problem != "" {
		return f, form, problem
	}
	if !from.IsZero() && !to.IsZero() && to.Before(from) {
		return f, form, "“To” is before “From”: choose a range that ends after it starts."
	}
	if !from.IsZero() {
		f.From, form.From = from, from.Format(time.DateOnly)
	}
	if !to.IsZero() {
		// To is inclusive: the whole day.
		f.To, form.To = to.AddDate(0, 0, 1), to.Format(time.DateOnly)
	}
	if s := c.Query("before"); s != "" {
		n, err := strconv.ParseUint(s, 10, 63)
		if err != nil || n == 0 || len(s) > 19 {
			return f, form, "The page cursor (before) must be an event number; start again from the newest."
		}
		f.Before, form.Before = n, n
	}
	return f, form, ""
}

// auditDate reads a date of the filter: YYYY-MM-DD (UTC), "" for none.
func auditDate(s, name string) (time.Time, string) {
	if s == "" {
		return time.Time{}, ""
	}
	bad := fmt.Sprintf("“%s” must be a date such as 2026-12-01.", name)
	if len(s) != len(time.DateOnly) {
		return time.Time{}, bad
	}
	t, err := time.Parse(time.DateOnly, s)
	if err != nil || t.Year() < 2000 || t.Year() > 9998 {
		return time.Time{}, bad
	}
	return t, ""
}

// auditLimit reads ?limit=: the page size, auditPageSize when absent.
func auditLimit(s string) (int, string) {
	if s == "" {
		return auditPageSize, ""
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > auditMaxPageSize || len(s) > 4 {
		return 0, fmt.Sprintf("The page size (limit) must be a number from 1 to %d.", auditMaxPageSize)
	}
	return n, ""
}

// AdminAudit serves GET /admin/audit?action=&actor=&target=&from=&to=&before=&limit=:
// the audit log, newest first, a page at a time.
func (h *Handler) AdminAudit(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	d := views.AuditPage{Page: dashboardPageFor("Audit log", sess), Actions: audit.Actions}
	f, form, problem := auditFilter(c)
	d.Filter = form
	limit := 0
	if problem == "" {
		limit, problem = auditLimit(c.Query("limit"))
	}
	if problem != "" {
		d.Error = problem
		return render(c, http.StatusBadRequest, views.Audit(d))
	}
	rows, more, err := models.ListAuditEvents(c.UserContext(), h.DB, f, limit)
	if err != nil {
		return err
	}
	for _, r := range rows {
		d.Events = append(d.Events, views.AuditEvent{ID: r.ID, At: r.At, Action: r.Action, Actor: r.Actor, Target: r.Target,
			Address: r.Address, Detail: r.Detail})
	}
	if more {
		d.Older = rows[len(rows)-1].ID
	}
	return render(c, http.StatusOK, views.Audit(d))
}

// AdminAuditExport serves GET /admin/audit/export?format=csv|jsonl and the
// page's filters: every event they choose, newest first, streamed from the
// database a batch at a time as the client reads.
func (h *Handler) AdminAuditExport(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	// One of the constants, not the query's string: that points into a
	// buffer Fiber reuses once the handler returns, and the writer runs after.
	var format string
	switch c.Query("format") {
	case usageexport.CSV:
		format = usageexport.CSV
	case usageexport.JSONL:
		format = usageexport.JSONL
	default:
		return exportProblem(c, "format must be csv or jsonl.")
	}
	f, _, problem := auditFilter(c)
	if problem != "" {
		return exportProblem(c, problem)
	}
	// The filter's strings are copied for the same reason as format.
	f.Actor, f.Target, f.Action = strings.Clone(f.Actor), strings.Clone(f.Target), strings.Clone(f.Action)
	now := time.Now()
	name := fmt.Sprintf("moonji-audit-%s.%s", now.UTC().Format("20060102-150405"), format)
	c.Set(fiber.HeaderContentType, usageexport.ContentType(format))
	c.Set(fiber.HeaderContentDisposition, `attachment; filename="`+name+`"`)
	c.Set(fiber.HeaderCacheControl, "no-store")
	c.Set(fiber.HeaderXContentTypeOptions, "nosniff")
	db, log, admin := h.DB, h.Log, sess.UserID
	ctx, cancel := context.WithCancel(context.Background())
	h.streamBody(ctx, cancel, c, "audit export", func(ctx context.Context, w *bufio.Writer, flush func() error) {
		_ = flush() // arm the deadline before the first rows
		if err := audit.Write(ctx, db, w, format, f, flush); err != nil && !errors.Is(err, context.Canceled) {
			// The status has left already: the download ends short.
			log.Warn("audit export cut short", "user", admin, "format", format, "err", err)
		}
	})
	return nil
}
