package handlers

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/chat"
	"moonji/views"
)

// The sidebar's and the history's Pin, Unpin and Move to folder forms.
// From the sidebar (htmx) the answer is the sidebar again, out of band,
// with the conversation's menu open (and why, when refused); from the
// history, or without scripts, the list again.

// ChatPin serves POST /c/{id}/pin {pinned: 1 or 0}.
func (h *Handler) ChatPin(c *fiber.Ctx) error {
	pinned := c.FormValue("pinned") == "1"
	done := "unpinned"
	if pinned {
		done = "pinned"
	}
	return h.organize(c, chat.Change{Pinned: &pinned}, done)
}

// ChatMoveToFolder serves POST /c/{id}/folder {folder} ("": out of any
// folder).
func (h *Handler) ChatMoveToFolder(c *fiber.Ctx) error {
	folder := c.FormValue("folder")
	return h.organize(c, chat.Change{Folder: &folder}, "moved")
}

// organize applies ch to the conversation and answers the form.
func (h *Handler) organize(c *fiber.Ctx, ch chat.Change, done string) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	id := c.Params("id")
	err = h.Chat.Change(c.UserContext(), sess.UserID, id, ch)
	why, refused := organizeRefusal(err)
	switch {
	case errors.Is(err, chat.ErrNotFound):
		if isHTMX(c) {
			return c.SendStatus(http.StatusNotFound)
		}
		return h.message(c, http.StatusNotFound, "Not found", "There is no such conversation.", "History", "/history")
	case err != nil && !refused:
		return err
	case c.FormValue("from") == "history":
		if refused {
			return h.message(c, http.StatusBadRequest, "Not moved", why, "History", "/history")
		}
		return h.afterHistoryAction(c, nil, done)
	case !isHTMX(c):
		// The sidebar's form without scripts: back to the page it was on.
		back := "/"
		if cur := currentOf(c.FormValue("current")); cur != "" {
			back = views.ConversationURL(cur)
		}
		if refused {
			return h.message(c, http.StatusBadRequest, "Not moved", why, "Back", back)
		}
		return c.Redirect(back, http.StatusSeeOther)
	}
	sb, err := h.sidebar(c, sess, currentOf(c.FormValue("current")))
	if err != nil {
		return err
	}
	sb.Open, sb.Error = id, why
	// htmx swaps only what succeeded: a refusal is a sidebar that says why.
	return render(c, http.StatusOK, views.SidebarNav(sb))
}

// organizeRefusal words a refused pin or move for the person.
func organizeRefusal(err error) (string, bool) {
	var se *chat.SettingError
	switch {
	case errors.As(err, &se):
		return "A folder's name must be " + se.Message + ".", true
	case errors.Is(err, chat.ErrTooManyFolders):
		return "You have " + strconv.Itoa(chat.MaxFolders) + " folders, the most allowed: use one of them.", true
	}
	return "", false
}

// currentOf is the open conversation a form names, when it looks like an
// id (it is only compared and written back into the page).
func currentOf(id string) string {
	if len(id) > 40 {
		return ""
	}
	return id
}

// ChatSidebar serves GET /sidebar?current=: the sidebar alone, for the page
// to draw again after a conversation was dropped onto a folder.
func (h *Handler) ChatSidebar(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	sb, err := h.sidebar(c, sess, currentOf(c.Query("current")))
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.SidebarNav(sb))
}
