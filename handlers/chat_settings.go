package handlers

import (
	"errors"
	"math"
	"net/http"
	"strconv"
	"strings"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/chat"
	"moonji/models"
	"moonji/views"
)

// ChatSettings serves GET /c/{id}/settings: the conversation's settings
// panel, for its Settings button.
func (h *Handler) ChatSettings(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	conv, _, err := h.Chat.Get(c.UserContext(), sess.UserID, c.Params("id"))
	if errors.Is(err, chat.ErrNotFound) {
		return fiber.ErrNotFound
	}
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.ConversationSettingsPanel(settingsView(conv, sess)))
}

// ChatSaveSettings serves POST /c/{id}/settings: the panel's form. A
// refused value shows the panel again with why, nothing stored.
func (h *Handler) ChatSaveSettings(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	ctx, id := c.UserContext(), c.Params("id")
	conv, _, err := h.Chat.Get(ctx, sess.UserID, id)
	if errors.Is(err, chat.ErrNotFound) {
		return fiber.ErrNotFound
	}
	if err != nil {
		return err
	}
	d := views.ConversationSettings{ConversationID: id, CSRF: sess.CSRFToken, SystemPrompt: c.FormValue("system_prompt"),
		Temperature: strings.TrimSpace(c.FormValue("temperature")), MaxTokens: strings.TrimSpace(c.FormValue("max_tokens"))}
	set := models.ConversationSettings{SystemPrompt: strings.TrimSpace(d.SystemPrompt)}
	if d.Temperature != "" {
		t, err := strconv.ParseFloat(d.Temperature, 64)
		if err != nil || math.IsNaN(t) || math.IsInf(t, 0) {
			return h.refuseSettings(c, conv, sess, d, "Temperature must be a number from 0 to 2.")
		}
		set.Temperature = &t
	}
	if d.MaxTokens != "" {
		n, err := strconv.Atoi(d.MaxTokens)
		if err != nil {
			return h.refuseSettings(c, conv, sess, d, "Maximum length must be a whole number of tokens.")
		}
		set.MaxTokens = &n
	}
	var se *chat.SettingError
	switch err := h.Chat.Update(ctx, sess.UserID, id, nil, &set); {
	case errors.As(err, &se):
		return h.refuseSettings(c, conv, sess, d, settingSentence(se))
	case errors.Is(err, chat.ErrNotFound):
		return fiber.ErrNotFound
	case err != nil:
		return err
	}
	if conv, _, err = h.Chat.Get(ctx, sess.UserID, id); err != nil {
		return err
	}
	saved := settingsView(conv, sess)
	saved.Notice = "Saved: the next answer is asked with these."
	if c.Get("HX-Request") == "" {
		return c.Redirect(views.ConversationURL(id), http.StatusSeeOther)
	}
	return render(c, http.StatusOK, views.ConversationSettingsPanel(saved))
}

// refuseSettings shows the panel again with what was sent (cut to what
// fits the fields) and why it was refused.
func (h *Handler) refuseSettings(c *fiber.Ctx, conv *models.Conversation, sess *models.Session, d views.ConversationSettings, why string) error {
	if len(d.SystemPrompt) > chat.MaxSystemPromptBytes {
		d.SystemPrompt = conv.SystemPrompt
	}
	for _, f := range []*string{&d.Temperature, &d.MaxTokens} {
		if len(*f) > 32 {
			*f = ""
		}
	}
	d.Error = why
	return render(c, http.StatusUnprocessableEntity, views.ConversationSettingsPanel(d))
}

// settingSentence words a refused setting for the panel.
func settingSentence(se *chat.SettingError) string {
	names := map[string]string{"system_prompt": "The system prompt", "temperature": "Temperature", "max_tokens": "Maximum length"}
	return names[se.Field] + " must be " + se.Message + "."
}

// settingsView is a conversation's settings as its panel shows them.
func settingsView(conv *models.Conversation, sess *models.Session) views.ConversationSettings {
	d := views.ConversationSettings{ConversationID: conv.ID, CSRF: sess.CSRFToken, SystemPrompt: conv.SystemPrompt}
	if conv.Temperature != nil {
		d.Temperature = strconv.FormatFloat(*conv.Temperature, 'f', -1, 64)
	}
	if conv.MaxTokens != nil {
		d.MaxTokens = strconv.Itoa(*conv.MaxTokens)
	}
	return d
}
