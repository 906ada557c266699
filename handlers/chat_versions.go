package handlers

import (
	"errors"
	"net/http"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/chat"
	"moonji/views"
)

// The page's side of message versions: each action draws the thread again
// (the path shown changes from the message acted on), into #thread for
// htmx; a plain form goes back to the conversation's page.

// ChatShowVersion serves POST /c/{id}/m/{mid}/show: the version arrows.
func (h *Handler) ChatShowVersion(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	if err := h.checkMessageIn(c, sess.UserID); err != nil {
		return h.composerError(c, err)
	}
	if _, err := h.Chat.Show(c.UserContext(), sess.UserID, c.Params("mid")); err != nil {
		return h.composerError(c, err)
	}
	return h.renderThread(c, sess.UserID, c.Params("id"))
}

// ChatEditForm serves GET /c/{id}/m/{mid}/edit: the person's message as a
// form to edit.
func (h *Handler) ChatEditForm(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	m, err := h.Chat.Message(c.UserContext(), sess.UserID, c.Params("id"), c.Params("mid"))
	if errors.Is(err, chat.ErrNotFound) {
		return c.SendStatus(http.StatusNotFound)
	}
	if err != nil {
		return err
	}
	if m.Role != "user" {
		return h.composerError(c, chat.ErrNotEditable)
	}
	return render(c, http.StatusOK, views.EditMessage(h.messageView(sess.UserID, *m)))
}

// ChatEdit serves POST /c/{id}/m/{mid}/edit: the edited text as a new
// version of the person's message, answered at once.
func (h *Handler) ChatEdit(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	if err := h.checkMessageIn(c, sess.UserID); err != nil {
		return h.composerError(c, err)
	}
	id := c.Params("id")
	if err := h.switchModel(c, sess, id, c.FormValue("model")); err != nil {
		return h.composerError(c, err)
	}
	sent, err := h.Chat.Edit(c.UserContext(), personOf(sess), c.Params("mid"), c.FormValue("content"))
	if _, limited := chat.AsLimit(err); err != nil && (!limited || sent.MessageID == "") {
		// Refused for the person's running answers, the edit and its
		// refused reply are stored all the same (shown with Retry).
		return h.composerError(c, err)
	}
	return h.renderThread(c, sess.UserID, id)
}

// ChatRegenerateMessage serves POST /c/{id}/m/{mid}/regenerate: a new
// version of that answer.
func (h *Handler) ChatRegenerateMessage(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	if err := h.checkMessageIn(c, sess.UserID); err != nil {
		return h.composerError(c, err)
	}
	id := c.Params("id")
	if err := h.switchModel(c, sess, id, c.FormValue("model")); err != nil {
		return h.composerError(c, err)
	}
	if _, err := h.Chat.RegenerateMessage(c.UserContext(), personOf(sess), c.Params("mid")); err != nil {
		return h.composerError(c, err)
	}
	return h.renderThread(c, sess.UserID, id)
}

// renderThread answers with conversation id's thread: the messages of its
// path shown.
func (h *Handler) renderThread(c *fiber.Ctx, userID uint, id string) error {
	if !isHTMX(c) {
		return c.Redirect(views.ConversationURL(id), http.StatusSeeOther)
	}
	_, o, err := h.Chat.Outline(c.UserContext(), userID, id)
	if err != nil {
		return h.composerError(c, err)
	}
	d, err := h.threadPage(c, userID, id, o, len(o.Path))
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.ThreadMessages(d))
}

// checkMessageIn makes sure message {mid} is in the person's conversation
// {id}: the thread drawn after an action is that conversation's.
func (h *Handler) checkMessageIn(c *fiber.Ctx, userID uint) error {
	_, err := h.Chat.Message(c.UserContext(), userID, c.Params("id"), c.Params("mid"))
	return err
}
