package handlers

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/tidwall/gjson"

	"moonji/internal/chat"
	"moonji/internal/jsonguard"
	"moonji/models"
)

// The chat API's handlers run behind RequireAPISession (a session, and the
// CSRF header on state-changing requests) and answer errors in OpenAI's
// shape. Someone else's conversation answers as an unknown one: 404.

// conversationJSON is a conversation in the API.
type conversationJSON struct {
	ID        string               `json:"id"`
	Title     string               `json:"title"`
	Model     string               `json:"model"`
	CreatedAt time.Time            `json:"created_at"`
	UpdatedAt time.Time            `json:"updated_at"`
	Messages  []chat.ExportMessage `json:"messages,omitempty"`
}

func conversationOf(c *models.Conversation) conversationJSON {
	return conversationJSON{ID: c.ID, Title: c.Title, Model: c.Model, CreatedAt: c.CreatedAt, UpdatedAt: c.UpdatedAt}
}

// person is the signed-in caller as the chat sees them.
func (h *Handler) person(c *fiber.Ctx) (chat.Person, bool) {
	p, ok := h.sessionPrincipal(c)
	return chat.Person{UserID: p.UserID, Email: p.Email, Admin: p.Admin}, ok
}

// chatBody checks a JSON body with jsonguard (depth, repeated fields)
// before gjson reads the fields it names, and returns it; on failure it has
// answered.
func chatBody(c *fiber.Ctx, fields ...string) ([]byte, bool, error) {
	var watch jsonguard.Watch
	for _, f := range fields {
		watch = append(watch, jsonguard.Field{Name: f})
	}
	body := c.Body()
	if err := jsonguard.Validate(body, watch); err != nil {
		return nil, false, stopBadRequest(c, err) // the same 400 as every JSON body the API refuses
	}
	if !gjson.ParseBytes(body).IsObject() {
		return nil, false, invalidRequest(c, "the request body must be a JSON object", "")
	}
	return body, true, nil
}

// stringField reads field as a string; a missing one is "" when optional.
func stringField(c *fiber.Ctx, body []byte, field string, optional bool) (string, bool, error) {
	v := gjson.GetBytes(body, field)
	switch {
	case v.Type == gjson.String:
		return v.Str, true, nil
	case !v.Exists() && optional:
		return "", true, nil
	default:
		return "", false, invalidRequest(c, field+" must be a string", field)
	}
}

func invalidRequest(c *fiber.Ctx, msg, _ string) error {
	return apiError(c, http.StatusBadRequest, msg, "invalid_request_error", "invalid_request")
}

// chatError answers the chat's domain errors.
func (h *Handler) chatError(c *fiber.Ctx, err error) error {
	switch {
	case errors.Is(err, chat.ErrNotFound):
		return apiError(c, http.StatusNotFound, "No such conversation.", "invalid_request_error", "not_found")
	case errors.Is(err, chat.ErrUnknownModel):
		return apiError(c, http.StatusBadRequest, "Unknown model: choose one of GET /v1/models.", "invalid_request_error", "model_not_found")
	case errors.Is(err, chat.ErrTooLarge):
		return apiError(c, http.StatusRequestEntityTooLarge,
			"The message is larger than "+strconv.Itoa(chat.MaxContentBytes>>10)+" KiB.", "invalid_request_error", "request_too_large")
	case errors.Is(err, chat.ErrEmpty):
		return apiError(c, http.StatusBadRequest, "The message is empty.", "invalid_request_error", "invalid_request")
	case errors.Is(err, chat.ErrTitleTooLong):
		return apiError(c, http.StatusBadRequest,
			"The title is longer than "+strconv.Itoa(chat.MaxTitleChars)+" characters.", "invalid_request_error", "invalid_request")
	case errors.Is(err, chat.ErrQueryTooLong):
		return apiError(c, http.StatusBadRequest,
			"The search is longer than "+strconv.Itoa(chat.MaxTitleChars)+" characters.", "invalid_request_error", "invalid_request")
	case errors.Is(err, chat.ErrBadCursor):
		return apiError(c, http.StatusBadRequest, "Unknown cursor.", "invalid_request_error", "invalid_request")
	case errors.Is(err, chat.ErrBadFormat):
		return apiError(c, http.StatusBadRequest, "format must be md or json.", "invalid_request_error", "invalid_request")
	case errors.Is(err, chat.ErrBusy):
		return apiError(c, http.StatusConflict, "A reply is still being written in this conversation; wait for it or stop it.",
			"invalid_request_error", "conversation_busy")
	case errors.Is(err, chat.ErrClosed):
		return apiError(c, http.StatusServiceUnavailable, "The server is restarting; try again in a moment.", "server_error", "shutting_down")
	default:
		h.Log.Error("chat request failed", "path", c.Path(), "err", err)
		return apiError(c, http.StatusInternalServerError, "The request failed.", "server_error", "internal_error")
	}
}

// CreateConversation serves POST /api/v1/conversations {"model"}.
func (h *Handler) CreateConversation(c *fiber.Ctx) error {
	p, ok := h.person(c)
	if !ok {
		return apiError(c, http.StatusUnauthorized, "Sign in first.", "invalid_request_error", "unauthorized")
	}
	body, ok, err := chatBody(c, "model")
	if !ok {
		return err
	}
	model, ok, err := stringField(c, body, "model", false)
	if !ok {
		return err
	}
	conv, err := h.Chat.Create(c.UserContext(), p, model)
	if err != nil {
		return h.chatError(c, err)
	}
	return c.Status(http.StatusCreated).JSON(conversationOf(conv))
}

// ListConversations serves GET /api/v1/conversations?q=&cursor=.
func (h *Handler) ListConversations(c *fiber.Ctx) error {
	p, ok := h.person(c)
	if !ok {
		return apiError(c, http.StatusUnauthorized, "Sign in first.", "invalid_request_error", "unauthorized")
	}
	page, err := h.Chat.List(c.UserContext(), p.UserID, strings.TrimSpace(c.Query("q")), c.Query("cursor"))
	if err != nil {
		return h.chatError(c, err)
	}
	out := struct {
		Data       []conversationJSON `json:"data"`
		NextCursor *string            `json:"next_cursor"`
	}{Data: []conversationJSON{}}
	for i := range page.Conversations {
		out.Data = append(out.Data, conversationOf(&page.Conversations[i]))
	}
	if page.NextCursor != "" {
		out.NextCursor = &page.NextCursor
	}
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.JSON(out)
}

// Conversation serves GET /api/v1/conversations/{id}: it with its messages.
func (h *Handler) Conversation(c *fiber.Ctx) error {
	p, ok := h.person(c)
	if !ok {
		return apiError(c, http.StatusUnauthorized, "Sign in first.", "invalid_request_error", "unauthorized")
	}
	conv, msgs, err := h.Chat.Get(c.UserContext(), p.UserID, c.Params("id"))
	if err != nil {
		return h.chatError(c, err)
	}
	out := conversationOf(conv)
	out.Messages = make([]chat.ExportMessage, 0, len(msgs))
	for _, m := range msgs {
		out.Messages = append(out.Messages, chat.ExportMessageOf(m))
	}
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.JSON(out)
}

// RenameConversation serves PATCH /api/v1/conversations/{id} {"title"}.
func (h *Handler) RenameConversation(c *fiber.Ctx) error {
	p, ok := h.person(c)
	if !ok {
		return apiError(c, http.StatusUnauthorized, "Sign in first.", "invalid_request_error", "unauthorized")
	}
	body, ok, err := chatBody(c, "title")
	if !ok {
		return err
	}
	title, ok, err := stringField(c, body, "title", false)
	if !ok {
		return err
	}
	id := c.Params("id")
	if err := h.Chat.Rename(c.UserContext(), p.UserID, id, title); err != nil {
		return h.chatError(c, err)
	}
	conv, _, err := h.Chat.Get(c.UserContext(), p.UserID, id)
	if err != nil {
		return h.chatError(c, err)
	}
	return c.JSON(conversationOf(conv))
}

// DeleteConversation serves DELETE /api/v1/conversations/{id}; a reply
// being written there is stopped first.
func (h *Handler) DeleteConversation(c *fiber.Ctx) error {
	p, ok := h.person(c)
	if !ok {
		return apiError(c, http.StatusUnauthorized, "Sign in first.", "invalid_request_error", "unauthorized")
	}
	if err := h.Chat.Delete(c.UserContext(), p.UserID, c.Params("id")); err != nil {
		return h.chatError(c, err)
	}
	return c.SendStatus(http.StatusNoContent)
}

// ExportConversation serves GET /api/v1/conversations/{id}/export?format=md|json
// as a download.
func (h *Handler) ExportConversation(c *fiber.Ctx) error {
	p, ok := h.person(c)
	if !ok {
		return apiError(c, http.StatusUnauthorized, "Sign in first.", "invalid_request_error", "unauthorized")
	}
	ex, err := h.Chat.Export(c.UserContext(), p.UserID, c.Params("id"), c.Query("format"))
	if err != nil {
		return h.chatError(c, err)
	}
	// The file name is the conversation's id: a title would need escaping
	// and could carry anything.
	c.Set(fiber.HeaderContentDisposition, `attachment; filename="`+ex.Filename+`"`)
	c.Set(fiber.HeaderContentType, ex.ContentType)
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.Send(ex.Body)
}

// SendMessage serves POST /api/v1/conversations/{id}/messages {"content"}:
// 202 with the reply's message and inference ids; the reply is written on
// the server, to be followed at /api/v1/generations/{inference_id}/events.
func (h *Handler) SendMessage(c *fiber.Ctx) error {
	p, ok := h.person(c)
	if !ok {
		return apiError(c, http.StatusUnauthorized, "Sign in first.", "invalid_request_error", "unauthorized")
	}
	body, ok, err := chatBody(c, "content")
	if !ok {
		return err
	}
	content, ok, err := stringField(c, body, "content", false)
	if !ok {
		return err
	}
	sent, err := h.Chat.Send(c.UserContext(), p, c.Params("id"), content)
	if err != nil {
		return h.chatError(c, err)
	}
	return c.Status(http.StatusAccepted).JSON(fiber.Map{"message_id": sent.MessageID, "inference_id": sent.InferenceID})
}
