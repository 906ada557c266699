package handlers

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/chat"
	"moonji/models"
	"moonji/views"
)

// ChatSend serves POST /chat (the composer): the person's message to the
// conversation in the form's "conversation" field, or to a new one with
// the form's model when it is empty. htmx gets the two new messages to
// append, the sidebar (out of band) and, for a new conversation, its URL
// to push; a plain form goes to the conversation's page.
func (h *Handler) ChatSend(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	p := personOf(sess)
	ctx := c.UserContext()
	id, model, content := c.FormValue("conversation"), c.FormValue("model"), c.FormValue("content")
	attached, err := formAttachmentIDs(c.Request().PostArgs().PeekMulti("attachment_ids"))
	if err != nil {
		return h.composerError(c, err)
	}
	created := false
	if id == "" {
		conv, err := h.Chat.Create(ctx, p, model)
		if err != nil {
			return h.composerError(c, err)
		}
		id, created = conv.ID, true
	} else if err := h.switchModel(c, sess, id, model); err != nil {
		return h.composerError(c, err)
	}
	sent, err := h.Chat.Send(ctx, p, id, content, attached...)
	if le, ok := chat.AsLimit(err); ok && sent.MessageID != "" {
		// Refused for the person's running answers, but the message and
		// its refused reply are in the conversation: shown like any
		// failed answer, with Retry.
		c.Set(fiber.HeaderRetryAfter, strconv.Itoa(le.RetryAfterSeconds()))
	} else if err != nil {
		return h.composerError(c, err)
	}
	if !isHTMX(c) {
		return c.Redirect(views.ConversationURL(id), http.StatusSeeOther)
	}
	if created {
		c.Set("HX-Push-Url", views.ConversationURL(id))
	}
	return h.renderExchange(c, sess, id, created)
}

// ChatRegenerate serves POST /c/{id}/regenerate: the last reply of the
// path shown written again, as a new version. htmx gets the thread.
func (h *Handler) ChatRegenerate(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	id := c.Params("id")
	if err := h.switchModel(c, sess, id, c.FormValue("model")); err != nil {
		return h.composerError(c, err)
	}
	if _, err := h.Chat.Regenerate(c.UserContext(), personOf(sess), id); err != nil {
		return h.composerError(c, err)
	}
	return h.renderThread(c, sess, id)
}

// switchModel makes model (the picker's choice, when sent) the one that
// writes the next replies of conversation id.
func (h *Handler) switchModel(c *fiber.Ctx, sess *models.Session, id, model string) error {
	if model == "" {
		return nil
	}
	return h.Chat.SetModel(c.UserContext(), sess.UserID, id, model)
}

// renderExchange answers a send: the conversation's last two messages (the
// person's and the reply), and out of band the sidebar and, for a new
// conversation, its id in the composer and its title.
func (h *Handler) renderExchange(c *fiber.Ctx, sess *models.Session, id string, created bool) error {
	conv, msgs, err := h.Chat.Last(c.UserContext(), sess.UserID, id, 3)
	if err != nil {
		return err
	}
	sb, err := h.sidebar(c, sess, id)
	if err != nil {
		return err
	}
	// Three read, two shown: a third tells whether these are the first.
	d := views.ExchangeData{Sidebar: sb, Conversation: id, Title: conv.Title, Created: created, First: len(msgs) <= 2}
	for _, m := range msgs[max(0, len(msgs)-2):] {
		d.Messages = append(d.Messages, h.messageView(sess.UserID, m))
	}
	if err := h.fillAttachments(c, id, d.Messages); err != nil {
		return err
	}
	return render(c, http.StatusOK, views.Exchange(d))
}

// composerError shows why a send failed above the composer (htmx swaps
// only 2xx answers, so it is a 200 retargeted there), or as a page to a
// plain form.
func (h *Handler) composerError(c *fiber.Ctx, err error) error {
	status, msg := http.StatusBadRequest, ""
	if m, ok := attachmentProblem(err); ok {
		msg = m
	}
	switch {
	case msg != "":
	case errors.Is(err, chat.ErrNotFound):
		status, msg = http.StatusNotFound, "This conversation no longer exists."
	case errors.Is(err, chat.ErrUnknownModel):
		msg = "Choose one of the listed models."
	case errors.Is(err, chat.ErrTooLarge):
		status, msg = http.StatusRequestEntityTooLarge, "The message is longer than "+strconv.Itoa(chat.MaxContentBytes>>10)+" KiB."
	case errors.Is(err, chat.ErrEmpty):
		msg = "Write a message first."
	case errors.Is(err, chat.ErrBusy):
		status, msg = http.StatusConflict, "An answer is still being written here: wait for it, or stop it."
	case errors.Is(err, chat.ErrNotEditable), errors.Is(err, chat.ErrNotAnswer):
		msg = "That message cannot be changed this way."
	case errors.Is(err, chat.ErrNothingToRegenerate):
		status, msg = http.StatusConflict, "There is no answer to write again."
	case errors.Is(err, chat.ErrClosed):
		status, msg = http.StatusServiceUnavailable, "The server is restarting; try again in a moment."
	case isLimit(err):
		le, _ := chat.AsLimit(err)
		status, msg = http.StatusTooManyRequests, le.Message
		c.Set(fiber.HeaderRetryAfter, strconv.Itoa(le.RetryAfterSeconds()))
	default:
		h.Log.Error("chat send failed", "path", c.Path(), "err", err)
		status, msg = http.StatusInternalServerError, "Sending failed. Try again."
	}
	if !isHTMX(c) {
		return h.message(c, status, "Not sent", msg, "Back", "/")
	}
	c.Set("HX-Retarget", "#composer-error")
	c.Set("HX-Reswap", "outerHTML")
	return render(c, http.StatusOK, views.ComposerError(msg))
}

func isLimit(err error) bool {
	_, ok := chat.AsLimit(err)
	return ok
}
