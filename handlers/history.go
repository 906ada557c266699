package handlers

import (
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/chat"
	"moonji/views"
)

// History serves GET /history?q=&folder=&cursor=: the person's
// conversations, pinned first, then newest first, searched over titles and
// message text, of one folder or all.
func (h *Handler) History(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	d := views.HistoryPage{Page: pageFor("History", sess), Query: strings.TrimSpace(c.Query("q")), Folder: c.Query("folder")}
	switch c.Query("done") {
	case "renamed":
		d.Notice = "Renamed."
	case "deleted":
		d.Notice = "Deleted."
	case "pinned":
		d.Notice = "Pinned."
	case "unpinned":
		d.Notice = "Unpinned."
	case "moved":
		d.Notice = "Moved."
	}
	if d.Folders, err = h.Chat.Folders(c.UserContext(), sess.UserID); err != nil {
		return err
	}
	status := http.StatusOK
	page, err := h.Chat.ListIn(c.UserContext(), sess.UserID, d.Folder, d.Query, c.Query("cursor"))
	var se *chat.SettingError
	switch {
	case errors.As(err, &se):
		status, d.Error, d.Folder = http.StatusBadRequest, "There is no such folder.", ""
	case errors.Is(err, chat.ErrQueryTooLong):
		status, d.Error = http.StatusBadRequest, "The search is too long."
	case errors.Is(err, chat.ErrBadCursor):
		status, d.Error = http.StatusBadRequest, "That page of the list does not exist; start from the first."
	case isLimit(err):
		le, _ := chat.AsLimit(err)
		c.Set(fiber.HeaderRetryAfter, strconv.Itoa(le.RetryAfterSeconds()))
		status, d.Error = http.StatusTooManyRequests, le.Message
	case err != nil:
		return err
	}
	for i := range page.Conversations {
		d.Conversations = append(d.Conversations, linkOf(&page.Conversations[i]))
	}
	d.Next = page.NextCursor
	return render(c, status, views.History(d))
}

// RenameConversationPage serves POST /c/{id}/rename (the history's form).
func (h *Handler) RenameConversationPage(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	err = h.Chat.Rename(c.UserContext(), sess.UserID, c.Params("id"), c.FormValue("title"))
	return h.afterHistoryAction(c, err, "renamed")
}

// DeleteConversationPage serves POST /c/{id}/delete (the history's form,
// after the browser asked for confirmation).
func (h *Handler) DeleteConversationPage(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	err = h.Chat.Delete(c.UserContext(), sess.UserID, c.Params("id"))
	return h.afterHistoryAction(c, err, "deleted")
}

// afterHistoryAction goes back to the history (the same search) with what
// was done, or shows what went wrong.
func (h *Handler) afterHistoryAction(c *fiber.Ctx, err error, done string) error {
	switch {
	case errors.Is(err, chat.ErrNotFound):
		return h.message(c, http.StatusNotFound, "Not found", "There is no such conversation.", "History", "/history")
	case errors.Is(err, chat.ErrTitleTooLong):
		return h.message(c, http.StatusBadRequest, "Not renamed", "A title has at most 200 characters.", "History", "/history")
	case err != nil:
		return err
	}
	v := url.Values{"done": {done}}
	if q := strings.TrimSpace(c.FormValue("q")); q != "" && len(q) <= 4*chat.MaxTitleChars {
		v.Set("q", q)
	}
	if f := c.FormValue("folder_filter"); f != "" && len(f) <= 4*chat.MaxFolderChars {
		v.Set("folder", f)
	}
	return c.Redirect("/history?"+v.Encode(), http.StatusSeeOther)
}
