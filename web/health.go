package web

import (
	"context"
	"time"

	"github.com/gofiber/fiber/v2"
)

// ready answers /readyz: 200 when the database (and Redis, if configured)
// answer, else 503 naming the part that does not.
func (s *Server) ready(c *fiber.Ctx) error {
	ctx, cancel := context.WithTimeout(c.UserContext(), 2*time.Second)
	defer cancel()
	checks := fiber.Map{}
	ok := true
	if sqlDB, err := s.DB.DB(); err != nil || sqlDB.PingContext(ctx) != nil {
		checks["database"] = "unreachable"
		ok = false
	} else {
		checks["database"] = "ok"
	}
	if s.Redis != nil {
		if err := s.Redis.Ping(ctx).Err(); err != nil {
			checks["redis"] = "unreachable"
			ok = false
		} else {
			checks["redis"] = "ok"
		}
	}
	status := fiber.StatusOK
	if !ok {
		status = fiber.StatusServiceUnavailable
	}
	return c.Status(status).JSON(fiber.Map{"ready": ok, "checks": checks})
}
