package handlers

import (
	"errors"
	"net/http"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/chat"
)

// The versions of a conversation's messages (internal/thread): edit a
// person's message, regenerate an answer, show a version, delete a
// branch. Each names the message; its conversation must be the caller's
// (else 404, as if there were no such message).

// EditMessage serves POST /api/v1/messages/{id}/edit {"content",
// "attachment_ids"}: a new
// version of the person's message id, shown and answered at once (202, as
// a send).
func (h *Handler) EditMessage(c *fiber.Ctx) error {
	p, ok := h.person(c)
	if !ok {
		return apiError(c, http.StatusUnauthorized, "Sign in first.", "invalid_request_error", "unauthorized")
	}
	msg, err := parseMessageBody(c.Body())
	if err != nil {
		return badBody(c, err)
	}
	sent, err := h.Chat.Edit(c.UserContext(), p, c.Params("id"), msg.Content, msg.AttachmentIDs...)
	if err != nil {
		return h.messageError(c, err)
	}
	return sentJSON(c, sent)
}

// RegenerateMessage serves POST /api/v1/messages/{id}/regenerate: a new
// version of answer id, asked with the messages before it (202).
func (h *Handler) RegenerateMessage(c *fiber.Ctx) error {
	p, ok := h.person(c)
	if !ok {
		return apiError(c, http.StatusUnauthorized, "Sign in first.", "invalid_request_error", "unauthorized")
	}
	sent, err := h.Chat.RegenerateMessage(c.UserContext(), p, c.Params("id"))
	if err != nil {
		return h.messageError(c, err)
	}
	return sentJSON(c, sent)
}

// ShowMessage serves POST /api/v1/messages/{id}/show: message id's version
// becomes the one shown, with the conversation that followed it; the
// answer is the conversation's path shown.
func (h *Handler) ShowMessage(c *fiber.Ctx) error {
	p, ok := h.person(c)
	if !ok {
		return apiError(c, http.StatusUnauthorized, "Sign in first.", "invalid_request_error", "unauthorized")
	}
	conv, err := h.Chat.Show(c.UserContext(), p.UserID, c.Params("id"))
	if err != nil {
		return h.messageError(c, err)
	}
	return h.pathJSON(c, p.UserID, conv.ID)
}

// DeleteMessage serves DELETE /api/v1/messages/{id}: message id and every
// message after it go (its other versions stay; the newest is shown).
func (h *Handler) DeleteMessage(c *fiber.Ctx) error {
	p, ok := h.person(c)
	if !ok {
		return apiError(c, http.StatusUnauthorized, "Sign in first.", "invalid_request_error", "unauthorized")
	}
	conv, err := h.Chat.DeleteMessage(c.UserContext(), p.UserID, c.Params("id"))
	if err != nil {
		return h.messageError(c, err)
	}
	return h.pathJSON(c, p.UserID, conv.ID)
}

// pathJSON answers with conversation id's path shown.
func (h *Handler) pathJSON(c *fiber.Ctx, userID uint, id string) error {
	_, t, err := h.Chat.Thread(c.UserContext(), userID, id)
	if err != nil {
		return h.messageError(c, err)
	}
	return c.JSON(fiber.Map{"conversation_id": id, "current_path": t.PathIDs()})
}

// messageError is chatError for a request that names a message.
func (h *Handler) messageError(c *fiber.Ctx, err error) error {
	if errors.Is(err, chat.ErrNotFound) {
		return apiError(c, http.StatusNotFound, "No such message.", "invalid_request_error", "not_found")
	}
	return h.chatError(c, err)
}
