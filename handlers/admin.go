package handlers

import (
	"fmt"
	"net/http"
	"time"

	"github.com/gofiber/fiber/v2"

	"moonji/models"
	"moonji/views"
)

// Sizes of the dashboard's lists: each is one query with this limit.
const (
	dashboardTop    = 10 // top people, top keys
	dashboardRecent = 20 // recent rejections, recent errors
)

// AdminDashboard serves GET /admin: usage and cost over time, latencies,
// top users, keys and teams (with what each cost), recent rejections and
// errors, and the live backends. Each part
// is one query, whatever the number of rows.
func (h *Handler) AdminDashboard(c *fiber.Ctx) error {
	return h.adminDashboard(c, http.StatusOK, views.ConfigView{})
}

// adminDashboard renders /admin with cfg's message (a reload's outcome).
func (h *Handler) adminDashboard(c *fiber.Ctx, status int, cfg views.ConfigView) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	now := time.Now()
	rng, w := dashboardWindow(c.Query("range"), range24h, now)
	ctx := c.UserContext()
	d := views.AdminDashboard{Page: dashboardPageFor("Dashboard", sess), Backends: h.backendsView(now)}
	d.Config = h.configView(ctx, cfg)

	points, err := models.UsageOverTime(ctx, h.DB, w, 0)
	if err != nil {
		return fmt.Errorf("dashboard usage: %w", err)
	}
	d.Usage = usageView(points, w, rng, "/admin")
	d.Usage.Currency = h.Currency

	lat, err := models.Latencies(ctx, h.DB, w)
	if err != nil {
		return fmt.Errorf("dashboard latencies: %w", err)
	}
	for _, l := range lat {
		d.Latencies = append(d.Latencies, views.Latency{Model: l.Model, TTFT: views.Percentiles(l.TTFT), Queue: views.Percentiles(l.Queue)})
	}

	users, err := models.TopUsers(ctx, h.DB, w, dashboardTop)
	if err != nil {
		return fmt.Errorf("dashboard top users: %w", err)
	}
	for _, u := range users {
		d.TopUsers = append(d.TopUsers, views.UserTotal{Email: u.Email, Requests: u.Requests, Tokens: u.Tokens, Cost: u.Cost})
	}
	teams, err := models.TopTeams(ctx, h.DB, w, dashboardTop)
	if err != nil {
		return fmt.Errorf("dashboard top teams: %w", err)
	}
	for _, t := range teams {
		d.TopTeams = append(d.TopTeams, views.TeamTotal{ID: t.TeamID, Name: t.Name, Requests: t.Requests, Tokens: t.Tokens, Cost: t.Cost})
	}
	keys, err := models.TopKeys(ctx, h.DB, w, 0, dashboardTop)
	if err != nil {
		return fmt.Errorf("dashboard top keys: %w", err)
	}
	d.TopKeys = viewKeyTotals(keys)

	rejected, err := models.RecentUsage(ctx, h.DB, models.OutcomeRejected, dashboardRecent)
	if err != nil {
		return fmt.Errorf("dashboard rejections: %w", err)
	}
	failed, err := models.RecentUsage(ctx, h.DB, models.OutcomeError, dashboardRecent)
	if err != nil {
		return fmt.Errorf("dashboard errors: %w", err)
	}
	// The rows name keys by id: one query finds the prefixes of both lists.
	var ids []uint
	for _, rows := range [][]models.Usage{rejected, failed} {
		for i := range rows {
			if rows[i].KeyID != nil {
				ids = append(ids, *rows[i].KeyID)
			}
		}
	}
	prefixes, err := models.APIKeyPrefixes(ctx, h.DB, ids)
	if err != nil {
		return err
	}
	d.Rejected = usageEvents(rejected, prefixes)
	d.Errors = usageEvents(failed, prefixes)
	return render(c, status, views.Admin(d))
}

// AdminBackends serves GET /admin/backends: the live backends fragment the
// dashboard refreshes. It reads the gates of this replica only (each
// replica admits its own requests), under their locks, and no database.
func (h *Handler) AdminBackends(c *fiber.Ctx) error {
	return render(c, http.StatusOK, views.AdminBackends(h.backendsView(time.Now())))
}

func (h *Handler) backendsView(now time.Time) views.BackendsView {
	v := views.BackendsView{Updated: now}
	for _, b := range h.Gateway.Backends() {
		v.Backends = append(v.Backends, views.BackendLive{Name: b.Name, Kind: b.Kind, Models: b.Models,
			InFlight: b.InFlight, MaxConcurrency: b.MaxConcurrency, Queued: b.Queued, MaxQueue: b.MaxQueue,
			OldestWait: b.OldestWait, Down: !b.Up})
	}
	return v
}

func usageEvents(rows []models.Usage, prefixes map[uint]string) []views.UsageEvent {
	out := make([]views.UsageEvent, len(rows))
	for i := range rows {
		r := &rows[i]
		out[i] = views.UsageEvent{At: r.CreatedAt, Who: r.User, Model: r.Model, Status: r.Status, Reason: r.Reason,
			InferenceID: r.InferenceID}
		if r.KeyID != nil {
			out[i].KeyPrefix = prefixes[*r.KeyID]
		}
	}
	return out
}
