package handlers

import (
	"errors"
	"net/http"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/chat"
	"moonji/views"
)

// Settings serves GET /settings: the person's default system prompt.
func (h *Handler) Settings(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	prompt, err := h.Chat.DefaultSystemPrompt(c.UserContext(), sess.UserID)
	if err != nil {
		return err
	}
	d := views.SettingsPage{Page: pageFor("Settings", sess), DefaultSystemPrompt: prompt}
	if c.Query("done") == "saved" {
		d.Notice = "Saved: conversations without a system prompt of their own are asked with this one from their next answer."
	}
	return render(c, http.StatusOK, views.Settings(d))
}

// SaveSettings serves POST /settings. A refused prompt shows the page again
// with why, nothing stored.
func (h *Handler) SaveSettings(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	prompt := c.FormValue("default_system_prompt")
	var se *chat.SettingError
	switch err := h.Chat.SetDefaultSystemPrompt(c.UserContext(), sess.UserID, prompt); {
	case errors.As(err, &se):
		d := views.SettingsPage{Page: pageFor("Settings", sess), DefaultSystemPrompt: prompt,
			Error: "The default system prompt must be " + se.Message + "."}
		if len(prompt) > chat.MaxSystemPromptBytes {
			// Not sent back whole: the field could not hold it.
			d.DefaultSystemPrompt = ""
		}
		return render(c, http.StatusUnprocessableEntity, views.Settings(d))
	case err != nil:
		return err
	}
	return c.Redirect("/settings?done=saved", http.StatusSeeOther)
}
