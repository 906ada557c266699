package handlers

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/chat"
	"moonji/models"
)

// The chat API's handlers run behind RequireAPISession (a session, and the
// CSRF header on state-changing requests) and answer errors in OpenAI's
// shape. Someone else's conversation answers as an unknown one: 404.

// conversationJSON is a conversation in the API.
type conversationJSON struct {
	ID        string    `json:"id"`
	Title     string    `json:"title"`
	Model     string    `json:"model"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// The settings its replies are asked with (null: the engine's own).
	SystemPrompt string   `json:"system_prompt"`
	Temperature  *float64 `json:"temperature"`
	MaxTokens    *int     `json:"max_tokens"`
	// Pinned ones come first in lists; Folder is "" for none.
	Pinned   bool                 `json:"pinned"`
	Folder   string               `json:"folder"`
	Messages []chat.ExportMessage `json:"messages,omitempty"`
	// CurrentPath is the path shown, as message ids from the first.
	CurrentPath []string `json:"current_path,omitempty"`
}

func conversationOf(c *models.Conversation) conversationJSON {
	return conversationJSON{ID: c.ID, Title: c.Title, Model: c.Model, CreatedAt: c.CreatedAt, UpdatedAt: c.UpdatedAt,
		SystemPrompt: c.SystemPrompt, Temperature: c.Temperature, MaxTokens: c.MaxTokens, Pinned: c.Pinned, Folder: c.Folder}
}

// person is the signed-in caller as the chat sees them.
func (h *Handler) person(c *fiber.Ctx) (chat.Person, bool) {
	p, ok := h.sessionPrincipal(c)
	return chat.Person{UserID: p.UserID, Email: p.Email, Admin: p.Admin}, ok
}

// stringBody reads the one string field of a chat API body
// (parseStringBody); on failure it has answered, naming the field.
func stringBody(c *fiber.Ctx, field string) (string, bool, error) {
	v, err := parseStringBody(c.Body(), field)
	if err != nil {
		return "", false, badBody(c, err)
	}
	return v, true, nil
}

// chatError answers the chat's domain errors; param names the body field
// or query parameter at fault where one is (each of these errors comes
// from one field of the API's requests: the model only from creating a
// conversation, the content only from sending a message).
func (h *Handler) chatError(c *fiber.Ctx, err error) error {
	const invalid = "invalid_request_error"
	if le, ok := chat.AsLimit(err); ok {
		return limitError(c, le)
	}
	if resp, ok := attachmentRefusal(c, err); ok {
		return resp
	}
	var se *chat.SettingError
	if errors.As(err, &se) {
		return apiErrorParam(c, http.StatusBadRequest, se.Field+" must be "+se.Message+".", invalid, "invalid_request", se.Field)
	}
	switch {
	case errors.Is(err, chat.ErrNotFound):
		return apiError(c, http.StatusNotFound, "No such conversation.", invalid, "not_found")
	case errors.Is(err, chat.ErrUnknownModel):
		return apiErrorParam(c, http.StatusBadRequest, "Unknown model: choose one of GET /v1/models.", invalid, "model_not_found", "model")
	case errors.Is(err, chat.ErrTooLarge):
		return apiErrorParam(c, http.StatusRequestEntityTooLarge,
			"The message is larger than "+strconv.Itoa(chat.MaxContentBytes>>10)+" KiB.", invalid, "request_too_large", "content")
	case errors.Is(err, chat.ErrEmpty):
		return apiErrorParam(c, http.StatusBadRequest, "The message is empty.", invalid, "invalid_request", "content")
	case errors.Is(err, chat.ErrTitleTooLong):
		return apiErrorParam(c, http.StatusBadRequest,
			"The title is longer than "+strconv.Itoa(chat.MaxTitleChars)+" characters.", invalid, "invalid_request", "title")
	case errors.Is(err, chat.ErrQueryTooLong):
		return apiErrorParam(c, http.StatusBadRequest,
			"The search is longer than "+strconv.Itoa(chat.MaxTitleChars)+" characters.", invalid, "invalid_request", "q")
	case errors.Is(err, chat.ErrTooManyFolders):
		return apiErrorParam(c, http.StatusBadRequest,
			"You have "+strconv.Itoa(chat.MaxFolders)+" folders, the most allowed: use one of them.", invalid, "too_many_folders", "folder")
	case errors.Is(err, chat.ErrBadCursor):
		return apiErrorParam(c, http.StatusBadRequest, "Unknown cursor.", invalid, "invalid_request", "cursor")
	case errors.Is(err, chat.ErrBadFormat):
		return apiErrorParam(c, http.StatusBadRequest, "format must be md or json.", invalid, "invalid_request", "format")
	case errors.Is(err, chat.ErrNotEditable):
		return apiErrorParam(c, http.StatusBadRequest, "Only a person's message can be edited; regenerate an answer instead.", invalid, "invalid_request", "id")
	case errors.Is(err, chat.ErrNotAnswer):
		return apiErrorParam(c, http.StatusBadRequest, "Only an answer can be regenerated; edit a person's message instead.", invalid, "invalid_request", "id")
	case errors.Is(err, chat.ErrNothingToRegenerate):
		return apiError(c, http.StatusConflict, "There is no answer to write again.", invalid, "nothing_to_regenerate")
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

// limitError answers a request refused for one of the person's limits:
// 429 in OpenAI's shape, with its code and Retry-After.
func limitError(c *fiber.Ctx, le *chat.LimitError) error {
	c.Set(fiber.HeaderRetryAfter, strconv.Itoa(le.RetryAfterSeconds()))
	return apiError(c, http.StatusTooManyRequests, le.Message, "requests", le.Code)
}

// CreateConversation serves POST /api/v1/conversations {"model"}.
func (h *Handler) CreateConversation(c *fiber.Ctx) error {
	p, ok := h.person(c)
	if !ok {
		return apiError(c, http.StatusUnauthorized, "Sign in first.", "invalid_request_error", "unauthorized")
	}
	model, ok, err := stringBody(c, "model")
	if !ok {
		return err
	}
	conv, err := h.Chat.Create(c.UserContext(), p, model)
	if err != nil {
		return h.chatError(c, err)
	}
	return c.Status(http.StatusCreated).JSON(conversationOf(conv))
}

// ListConversations serves GET /api/v1/conversations?q=&folder=&cursor=:
// pinned first, then last used first; folder keeps those of one folder.
func (h *Handler) ListConversations(c *fiber.Ctx) error {
	p, ok := h.person(c)
	if !ok {
		return apiError(c, http.StatusUnauthorized, "Sign in first.", "invalid_request_error", "unauthorized")
	}
	page, err := h.Chat.ListIn(c.UserContext(), p.UserID, c.Query("folder"), strings.TrimSpace(c.Query("q")), c.Query("cursor"))
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
	conv, t, err := h.Chat.Thread(c.UserContext(), p.UserID, c.Params("id"))
	if err != nil {
		return h.chatError(c, err)
	}
	out := conversationOf(conv)
	out.Messages = make([]chat.ExportMessage, 0, len(t.All))
	for _, m := range t.All {
		out.Messages = append(out.Messages, chat.ExportMessageOf(m))
	}
	out.CurrentPath = t.PathIDs()
	c.Set(fiber.HeaderCacheControl, "no-store")
	return c.JSON(out)
}

// PatchConversation serves PATCH /api/v1/conversations/{id} {"title",
// "system_prompt", "temperature", "max_tokens", "pinned", "folder"}: each
// optional, the others kept. Everything is checked before anything is
// stored, and stored at once.
func (h *Handler) PatchConversation(c *fiber.Ctx) error {
	p, ok := h.person(c)
	if !ok {
		return apiError(c, http.StatusUnauthorized, "Sign in first.", "invalid_request_error", "unauthorized")
	}
	patch, err := parseConversationPatch(c.Body())
	if err != nil {
		return badBody(c, err)
	}
	ctx, id := c.UserContext(), c.Params("id")
	conv, _, err := h.Chat.Get(ctx, p.UserID, id)
	if err != nil {
		return h.chatError(c, err)
	}
	ch := chat.Change{Title: patch.Title, Pinned: patch.Pinned, Folder: patch.Folder}
	if patch.SystemPrompt != nil || patch.HasTemperature || patch.HasTokens {
		set := models.ConversationSettings{SystemPrompt: conv.SystemPrompt, Temperature: conv.Temperature, MaxTokens: conv.MaxTokens}
		if patch.SystemPrompt != nil {
			set.SystemPrompt = *patch.SystemPrompt
		}
		if patch.HasTemperature {
			set.Temperature = patch.Temperature
		}
		if patch.HasTokens {
			set.MaxTokens = patch.MaxTokens
		}
		ch.Settings = &set
	}
	if err := h.Chat.Change(ctx, p.UserID, id, ch); err != nil {
		return h.chatError(c, err)
	}
	if conv, _, err = h.Chat.Get(ctx, p.UserID, id); err != nil {
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

// SendMessage serves POST /api/v1/conversations/{id}/messages {"content",
// "attachment_ids"}: 202 with the reply's message and inference ids; the reply is written on
// the server, to be followed at /api/v1/generations/{inference_id}/events.
func (h *Handler) SendMessage(c *fiber.Ctx) error {
	p, ok := h.person(c)
	if !ok {
		return apiError(c, http.StatusUnauthorized, "Sign in first.", "invalid_request_error", "unauthorized")
	}
	msg, err := parseMessageBody(c.Body())
	if err != nil {
		return badBody(c, err)
	}
	sent, err := h.Chat.Send(c.UserContext(), p, c.Params("id"), msg.Content, msg.AttachmentIDs...)
	if err != nil {
		return h.chatError(c, err)
	}
	return sentJSON(c, sent)
}

// sentJSON answers a started reply: 202 with its message and inference ids
// (and the person's new message's id, for a send or an edit).
func sentJSON(c *fiber.Ctx, sent chat.Sent) error {
	out := fiber.Map{"message_id": sent.MessageID, "inference_id": sent.InferenceID}
	if sent.UserMessageID != "" {
		out["user_message_id"] = sent.UserMessageID
	}
	return c.Status(http.StatusAccepted).JSON(out)
}
