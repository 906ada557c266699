package handlers

import (
	"errors"
	"net/http"
	"slices"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/chat"
	"moonji/internal/gateway"
	"moonji/internal/thread"
	"moonji/models"
	"moonji/views"
)

// sidebarSize is how many conversations the chat's sidebar lists; the
// rest are on /history.
const sidebarSize = 30

// personOf is the chat's view of a session's person.
func personOf(sess *models.Session) chat.Person {
	return chat.Person{UserID: sess.UserID, Email: sess.User.Email, Admin: sess.User.Admin}
}

// Home serves GET /: the new-chat page once signed in, a way to sign in
// before.
func (h *Handler) Home(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil && !errors.Is(err, errBlocked) {
		return err
	}
	if sess == nil || h.Chat == nil {
		return render(c, http.StatusOK, views.Home(pageFor("Home", sess)))
	}
	d, err := h.chatPage(c, sess, "New chat", "")
	if err != nil {
		return err
	}
	if len(d.Models) > 0 {
		d.Model = d.Models[0]
	}
	return render(c, http.StatusOK, views.Chat(d))
}

// ChatConversation serves GET /c/{id}: one of the person's conversations.
// A reply that streams on this replica continues from the chunk it had
// reached; one on another replica shows its saved text, reloaded each
// second.
func (h *Handler) ChatConversation(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	conv, o, err := h.Chat.Outline(c.UserContext(), sess.UserID, c.Params("id"))
	if errors.Is(err, chat.ErrNotFound) {
		return h.message(c, http.StatusNotFound, "Not found", "There is no such conversation.", "New chat", "/")
	}
	if err != nil {
		return err
	}
	title := conv.Title
	if title == "" {
		title = "New chat"
	}
	d, err := h.chatPage(c, sess, title, conv.ID)
	if err != nil {
		return err
	}
	d.Model = conv.Model
	if d.Thread, err = h.threadPage(c, sess.UserID, conv.ID, o, len(o.Path)); err != nil {
		return err
	}
	return render(c, http.StatusOK, views.Chat(d))
}

// ChatEarlier serves GET /c/{id}/earlier?before={mid}: the messages of the
// path shown before message mid, a page of them, under the button for
// those before (when any are left).
func (h *Handler) ChatEarlier(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	_, o, err := h.Chat.Outline(c.UserContext(), sess.UserID, c.Params("id"))
	if errors.Is(err, chat.ErrNotFound) {
		return c.SendStatus(http.StatusNotFound)
	}
	if err != nil {
		return err
	}
	end := slices.Index(o.Path, c.Query("before"))
	if end < 0 {
		// Not on the path shown any more (switched or deleted meanwhile):
		// nothing to add; a reload shows the conversation as it is.
		return c.SendStatus(http.StatusNotFound)
	}
	d, err := h.threadPage(c, sess.UserID, c.Params("id"), o, end)
	if err != nil {
		return err
	}
	return render(c, http.StatusOK, views.EarlierMessages(d))
}

// ChatMessage serves GET /c/{id}/m/{mid}: one message, for a page that
// follows a reply running on another replica.
func (h *Handler) ChatMessage(c *fiber.Ctx) error {
	sess, err := h.session(c)
	if err != nil {
		return err
	}
	m, err := h.Chat.Message(c.UserContext(), sess.UserID, c.Params("id"), c.Params("mid"))
	if err == nil {
		v, err := h.versionedView(c, sess.UserID, *m)
		if err != nil {
			return err
		}
		return render(c, http.StatusOK, views.MessageView(v))
	}
	if !errors.Is(err, chat.ErrNotFound) {
		return err
	}
	// Gone (deleted meanwhile) or someone else's. htmx swaps only 2xx
	// answers, so polling just stops showing news.
	return c.SendStatus(http.StatusNotFound)
}

// chatPage fills what every chat page has: the layout and the sidebar.
func (h *Handler) chatPage(c *fiber.Ctx, sess *models.Session, title, current string) (views.ChatPage, error) {
	sb, err := h.sidebar(c, sess, current)
	if err != nil {
		return views.ChatPage{}, err
	}
	p := pageFor(title, sess)
	p.Wide = true
	// Only the models the person's teams allow: the others do not exist
	// for them (a reply asked of one anyway is refused as unknown).
	allowed, err := h.Gateway.ModelsFor(c.UserContext(), gateway.Principal{UserID: sess.UserID})
	if err != nil {
		return views.ChatPage{}, err
	}
	return views.ChatPage{Page: p, Sidebar: sb, Conversation: current, Models: allowed, Attach: h.attachOptions(allowed)}, nil
}

// sidebar lists the person's latest conversations, pinned first, and
// their folders.
func (h *Handler) sidebar(c *fiber.Ctx, sess *models.Session, current string) (views.Sidebar, error) {
	page, err := h.Chat.List(c.UserContext(), sess.UserID, "", "")
	if err != nil {
		return views.Sidebar{}, err
	}
	folders, err := h.Chat.Folders(c.UserContext(), sess.UserID)
	if err != nil {
		return views.Sidebar{}, err
	}
	sb := views.Sidebar{Current: current, More: page.NextCursor != "" || len(page.Conversations) > sidebarSize,
		Folders: folders, CSRF: sess.CSRFToken}
	for i, conv := range page.Conversations {
		if i == sidebarSize {
			break
		}
		sb.Conversations = append(sb.Conversations, linkOf(&conv))
	}
	return sb, nil
}

func linkOf(c *models.Conversation) views.ConversationLink {
	return views.ConversationLink{ID: c.ID, Title: c.Title, Model: c.Model, Updated: c.UpdatedAt, Pinned: c.Pinned, Folder: c.Folder}
}

// messageView is a stored message as the page shows it; a reply streaming
// on this replica shows the text of its live log, to follow from there.
func (h *Handler) messageView(userID uint, m models.Message) views.ChatMessage {
	v := views.ChatMessage{ID: m.ID, ConversationID: m.ConversationID, Role: m.Role, Status: m.Status,
		Model: m.Model, Text: m.Content}
	if m.InferenceID != nil {
		v.InferenceID = *m.InferenceID
	}
	if m.Role != models.RoleAssistant {
		return v
	}
	if m.Status == models.MessageStreaming {
		if text, seq, live := h.Chat.Progress(userID, v.InferenceID); live {
			v.Text, v.Seq, v.Live = text, seq, true
		}
		return v
	}
	v.HTML = h.Chat.RenderFinal(chat.Final{Status: m.Status, Content: m.Content, Reason: m.Reason,
		PromptTokens: m.PromptTokens, CompletionTokens: m.CompletionTokens, Cost: m.Cost})
	return v
}

// threadPageSize is how many messages of the path shown a page draws at
// once (the last ones); "Show earlier messages" loads as many before them.
// A first screen's worth: rendering an answer's Markdown costs
// milliseconds, and a 500-message conversation would weigh megabytes.
const threadPageSize = 30

// threadPage is the part of o's path shown that ends before index end
// (len(o.Path) for its end), as the page shows it, each message with its
// place among its versions. Only those messages' texts are read.
func (h *Handler) threadPage(c *fiber.Ctx, userID uint, conv string, o chat.Outline, end int) (views.ThreadData, error) {
	start := max(0, end-threadPageSize)
	msgs, err := h.Chat.Messages(c.UserContext(), conv, o.Path[start:end])
	if err != nil {
		return views.ThreadData{}, err
	}
	d := views.ThreadData{Conversation: conv, Messages: make([]views.ChatMessage, 0, len(msgs))}
	if start > 0 {
		d.Earlier = o.Path[start]
	}
	for _, m := range msgs {
		d.Messages = append(d.Messages, withVersion(h.messageView(userID, m), o.Tree, m))
	}
	if err := h.fillAttachments(c, conv, d.Messages); err != nil {
		return views.ThreadData{}, err
	}
	return d, nil
}

// withVersion adds m's place among its versions in tree to v.
func withVersion(v views.ChatMessage, tree *thread.Tree, m models.Message) views.ChatMessage {
	ver := tree.VersionOf(m.ID)
	v.Version, v.Versions, v.PrevID, v.NextID = ver.Index, ver.Count, ver.Prev, ver.Next
	v.Group = "root"
	if m.ParentID != nil {
		v.Group = *m.ParentID
	}
	return v
}

// versionedView is message m as the page shows it, with its versions.
func (h *Handler) versionedView(c *fiber.Ctx, userID uint, m models.Message) (views.ChatMessage, error) {
	_, o, err := h.Chat.Outline(c.UserContext(), userID, m.ConversationID)
	if err != nil {
		return views.ChatMessage{}, err
	}
	return withVersion(h.messageView(userID, m), o.Tree, m), nil
}
