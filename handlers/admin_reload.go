package handlers

import (
	"context"
	"net/http"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/reload"
	"moonji/views"
)

// AdminReload serves POST /admin/reload (the admin page's button; the page
// guard checked the session, the admin and the CSRF field): it reloads the
// configuration file and shows the dashboard with what changed, or why
// nothing did (422).
func (h *Handler) AdminReload(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	if h.Reloader == nil {
		return fiber.NewError(http.StatusNotFound, "configuration reload is not available")
	}
	res, err := h.Reloader.Reload(c.UserContext(), reload.By{Actor: sess.User.Email, ActorID: sess.UserID,
		Address: h.clientIP(c)})
	if err != nil {
		return h.adminDashboard(c, http.StatusUnprocessableEntity, views.ConfigView{Error: err.Error()})
	}
	return h.adminDashboard(c, http.StatusOK, views.ConfigView{
		Notice: "Configuration reloaded: " + res.Old.ID + " → " + res.New.ID + ". " + res.Changes.Summary() + "."})
}

// configView is the dashboard's configuration section: this replica's
// version and every live replica's, with a mismatch marked.
func (h *Handler) configView(ctx context.Context, v views.ConfigView) views.ConfigView {
	if h.Reloader == nil {
		return v
	}
	own := h.Reloader.ConfigVersion()
	v.Enabled, v.Version, v.LoadedAt = true, own.ID, own.LoadedAt
	replicas, err := h.Reloader.ReplicaVersions(ctx)
	if err != nil {
		h.Log.Warn("list the replicas' configuration versions", "err", err)
		return v
	}
	for _, r := range replicas {
		rc := views.ReplicaConfig{ID: r.ID, Version: r.ConfigVersion, Mismatch: r.ConfigVersion != own.ID}
		if r.ConfigLoadedAt != nil {
			rc.LoadedAt = *r.ConfigLoadedAt
		}
		v.Mismatch = v.Mismatch || rc.Mismatch
		v.Replicas = append(v.Replicas, rc)
	}
	return v
}
