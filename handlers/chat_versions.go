package handlers

import (
	"errors"
	"net/http"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/chat"
	"moonji/models"
	"moonji/views"
)

// The page's side of message versions: each action draws the thread again
// (the path shown changes from the message acted on), into #thread for
// htmx; a plain form goes back to the conversation's page.

// ChatShowVersion serves POST /c/{id}/m/{mid}/show: the version arrows.
func (h *Handler) ChatShowVersion(c *fiber.Ctx) error {
	return h.versionAction(c, func(sess *models.Session, m *models.Message) error {
		_, err := h.Chat.Show(c.UserContext(), sess.UserID, m.ID)
		return err
	})
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
	return h.versionAction(c, func(sess *models.Session, m *models.Message) error {
		sent, err := h.Chat.Edit(c.UserContext(), personOf(sess), m.ID, c.FormValue("content"))
		if _, limited := chat.AsLimit(err); limited && sent.MessageID != "" {
			// Refused for the person's running answers, the edit and its
			// refused reply are stored all the same (shown with Retry).
			return nil
		}
		return err
	})
}

// ChatRegenerateMessage serves POST /c/{id}/m/{mid}/regenerate: a new
// version of that answer.
func (h *Handler) ChatRegenerateMessage(c *fiber.Ctx) error {
	return h.versionAction(c, func(sess *models.Session, m *models.Message) error {
		_, err := h.Chat.RegenerateMessage(c.UserContext(), personOf(sess), m.ID)
		return err
	})
}

// ChatDeleteMessage serves POST /c/{id}/m/{mid}/delete: the person's
// message and everything that followed it go; its other versions stay,
// the newest shown.
func (h *Handler) ChatDeleteMessage(c *fiber.Ctx) error {
	return h.versionAction(c, func(sess *models.Session, m *models.Message) error {
		// The page offers Delete beside Edit, on a person's message only;
		// an answer is refused as an edit of it is.
		if m.Role != models.RoleUser {
			return chat.ErrNotEditable
		}
		_, err := h.Chat.DeleteMessage(c.UserContext(), sess.UserID, m.ID)
		return err
	})
}

// versionAction runs act on message {mid} once it is known to be in the
// person's conversation {id} (and the model the form names, if any, is the
// conversation's), then answers with the thread drawn again.
func (h *Handler) versionAction(c *fiber.Ctx, act func(sess *models.Session, m *models.Message) error) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	id := c.Params("id")
	m, err := h.Chat.Message(c.UserContext(), sess.UserID, id, c.Params("mid"))
	if err != nil {
		return h.composerError(c, err)
	}
	if err := h.switchModel(c, sess, id, c.FormValue("model")); err != nil {
		return h.composerError(c, err)
	}
	if err := act(sess, m); err != nil {
		return h.composerError(c, err)
	}
	return h.renderThread(c, sess, id)
}

// renderThread answers with conversation id's thread: the messages of its
// path shown; and, out of band, the sidebar, where an edit, a regenerate
// or a delete moved the conversation up (each touches it).
func (h *Handler) renderThread(c *fiber.Ctx, sess *models.Session, id string) error {
	if !isHTMX(c) {
		return c.Redirect(views.ConversationURL(id), http.StatusSeeOther)
	}
	_, o, err := h.Chat.Outline(c.UserContext(), sess.UserID, id)
	if err != nil {
		return h.composerError(c, err)
	}
	d, err := h.threadPage(c, sess.UserID, id, o, len(o.Path))
	if err != nil {
		return err
	}
	sb, err := h.sidebar(c, sess, id)
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.ThreadRedrawn(d, sb))
}
