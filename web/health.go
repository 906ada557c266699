package web

import (
	"context"
	"time"

	"github.com/gofiber/fiber/v2"
)

// ready answers /readyz: 200 when the database (and Redis, if configured)
// answer, else 503 naming the part that does not; and each backend's
// health. A database that does not answer is named ("database":
// "unreachable", and "ledger" says since when and how many rows wait) but
// keeps the replica ready: every replica shares the one database, so a 503
// would take them all out of the load balancer at once, while each serves
// on, its usage rows safe in its journal (ledger/outage.go).
func (s *Server) ready(c *fiber.Ctx) error {
	ctx, cancel := context.WithTimeout(c.UserContext(), 2*time.Second)
	defer cancel()
	checks := fiber.Map{}
	ok := true
	if sqlDB, err := s.DB.DB(); err != nil || sqlDB.PingContext(ctx) != nil {
		checks["database"] = "unreachable"
	} else {
		checks["database"] = "ok"
	}
	if st := s.Ledger.Status(); st.DatabaseDown {
		checks["ledger"] = fiber.Map{"database_down_since": st.Since.Format(time.RFC3339), "backlog": st.Backlog,
			"in_journal_only": st.InJournal}
	}
	if s.Redis != nil {
		if err := s.Redis.Ping(ctx).Err(); err != nil {
			checks["redis"] = "unreachable"
			ok = false
		} else {
			checks["redis"] = "ok"
		}
	}
	// Each backend's state is shown, but a backend that is down does not
	// make the gateway unready: every replica would leave the load
	// balancer at once, and the backend's models still answer (from its
	// siblings, or with a clear error).
	backends := fiber.Map{}
	s.stateMu.Lock()
	checkers := s.Health // replaced whole by a reload, never changed
	s.stateMu.Unlock()
	for name, c := range checkers {
		st := c.State()
		b := fiber.Map{"up": st.Up}
		if !st.Up {
			b["reason"] = st.Reason
			b["down_since"] = st.Since.UTC().Format(time.RFC3339)
			if !st.NextProbe.IsZero() {
				b["next_probe"] = st.NextProbe.UTC().Format(time.RFC3339Nano)
			}
			if st.ProbeError != "" {
				b["probe_error"] = st.ProbeError
			}
		}
		backends[name] = b
	}
	if s.Scheduler != nil && s.Scheduler.Degraded() {
		checks["concurrency_limit"] = "per_replica"
	}
	status := fiber.StatusOK
	if !ok {
		status = fiber.StatusServiceUnavailable
	}
	v := s.ConfigVersion()
	return c.Status(status).JSON(fiber.Map{"ready": ok, "checks": checks, "backends": backends,
		"config_version": v.ID, "config_loaded_at": v.LoadedAt.Format(time.RFC3339)})
}
