package web_test

import (
	"context"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"moonji/internal/mockllm"
)

// contextOf returns the role: content lines the engine received with the
// generation tagged tag.
func contextOf(t *testing.T, e *testEnv, tag string) []string {
	t.Helper()
	rec, err := e.Mock.WaitFor(context.Background(), tag, nil)
	if err != nil {
		t.Fatalf("the engine never received %q: %v", tag, err)
	}
	var out []string
	for _, m := range gjson.GetBytes(rec.Body, "messages").Array() {
		out = append(out, m.Get("role").Str+": "+m.Get("content").Str)
	}
	return out
}

// ask sends content (tagged tag for the mock engine) and waits for its
// answer; it returns the person's message and the answer.
func ask(t *testing.T, e *testEnv, p *chatter, conv, content, tag string) (user, reply apiMessage) {
	t.Helper()
	e.mockBody(map[string]any{"tokens": 3, "tag": tag})
	p.send(conv, content)
	reply = p.reply(conv)
	msgs := p.conversation(conv).Messages
	return msgs[len(msgs)-2], reply
}

// TestEditRegenerateAndVersions: an edit adds a sibling of the person's
// message and a regenerate one of the answer, both shown at once with
// their answers; showing the first version brings back the conversation
// that followed it; the engine receives the messages of the path shown,
// never another version's. The page shows ‹ 1 / 2 › where there are
// versions; exports keep the path shown (Markdown) or the whole tree
// (JSON); deleting a branch shows the version left.
func TestEditRegenerateAndVersions(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/v.db")
	p := e.chatter("versions@example.com")
	conv := p.newConversation()
	u1, a1 := ask(t, e, p, conv, "first question", "v-one")
	u2, a2 := ask(t, e, p, conv, "second question", "v-two")

	// Edit the first question: answered at once, with only itself as
	// context (what came after the old version is another branch).
	e.mockBody(map[string]any{"tokens": 3, "tag": "v-edit"})
	status, body := p.do(http.MethodPost, "/api/v1/messages/"+u1.ID+"/edit", `{"content":"first question, edited"}`)
	if status != http.StatusAccepted || gjson.Get(body, "user_message_id").Str == "" || gjson.Get(body, "inference_id").Str == "" {
		t.Fatalf("edit: %d %s", status, body)
	}
	eu1 := gjson.Get(body, "user_message_id").Str
	ea1 := p.reply(conv)
	if got := contextOf(t, e, "v-edit"); !slices.Equal(got, []string{"user: first question, edited"}) {
		t.Fatalf("the engine received %q for the edit", got)
	}
	c := p.conversation(conv)
	if !slices.Equal(c.CurrentPath, []string{eu1, ea1.ID}) || len(c.Messages) != 6 {
		t.Fatalf("after the edit: path %v, %d messages", c.CurrentPath, len(c.Messages))
	}
	for _, m := range c.Messages {
		if m.ID == eu1 && m.ParentID != nil {
			t.Fatalf("the edit of a first message has parent %v", *m.ParentID)
		}
	}

	// Regenerate the new answer: a second version beside it, same context.
	e.mockBody(map[string]any{"tokens": 3, "tag": "v-regen"})
	status, body = p.do(http.MethodPost, "/api/v1/messages/"+ea1.ID+"/regenerate", "")
	if status != http.StatusAccepted {
		t.Fatalf("regenerate: %d %s", status, body)
	}
	ra1 := p.reply(conv)
	if got := contextOf(t, e, "v-regen"); !slices.Equal(got, []string{"user: first question, edited"}) {
		t.Fatalf("the engine received %q for the regenerate", got)
	}
	if c = p.conversation(conv); !slices.Equal(c.CurrentPath, []string{eu1, ra1.ID}) {
		t.Fatalf("after regenerate: path %v", c.CurrentPath)
	}
	page := p.page("/c/" + conv)
	if !strings.Contains(page.body, `aria-label="Previous version"`) || !strings.Contains(page.body, "2 / 2") ||
		strings.Contains(page.body, "second question") {
		t.Fatalf("the page of the edited branch:\n%s", page.body)
	}

	// Show the first version: the conversation that followed it is back,
	// and the next message follows it, with exactly that context.
	status, body = p.do(http.MethodPost, "/api/v1/messages/"+u1.ID+"/show", "")
	if want := []string{u1.ID, a1.ID, u2.ID, a2.ID}; status != http.StatusOK ||
		!slices.Equal(jsonStrings(body, "current_path"), want) {
		t.Fatalf("show the first version: %d %s, want path %v", status, body, want)
	}
	page = p.page("/c/" + conv)
	if !strings.Contains(page.body, "second question") || !strings.Contains(page.body, "1 / 2") ||
		strings.Contains(page.body, "first question, edited") {
		t.Fatalf("the page of the first branch:\n%s", page.body)
	}
	ask(t, e, p, conv, "third question", "v-three")
	want := []string{"user: first question", "assistant: " + a1.Content, "user: second question",
		"assistant: " + a2.Content, "user: third question"}
	if got := contextOf(t, e, "v-three"); !slices.Equal(got, want) {
		t.Fatalf("the engine received\n%q\nwant\n%q", got, want)
	}

	// Exports: Markdown is the path shown, JSON every version.
	_, md := p.do(http.MethodGet, "/api/v1/conversations/"+conv+"/export?format=md", "")
	if !strings.Contains(md, "third question") || strings.Contains(md, "edited") {
		t.Errorf("Markdown export:\n%s", md)
	}
	_, js := p.do(http.MethodGet, "/api/v1/conversations/"+conv+"/export?format=json", "")
	if n := len(gjson.Get(js, "messages").Array()); n != 9 || len(gjson.Get(js, "current_path").Array()) != 6 ||
		!strings.Contains(js, "first question, edited") || gjson.Get(js, "messages.1.parent_id").Str != u1.ID {
		t.Errorf("JSON export (%d messages):\n%s", n, js)
	}

	// Refusals: each names what is wrong, nothing changes.
	other := e.chatter("stranger@example.com")
	for _, c := range []struct {
		who          *chatter
		method, path string
		body         string
		status       int
		param        string
	}{
		{p, http.MethodPost, "/api/v1/messages/" + a1.ID + "/edit", `{"content":"x"}`, 400, "id"},
		{p, http.MethodPost, "/api/v1/messages/" + u1.ID + "/regenerate", ``, 400, "id"},
		{p, http.MethodPost, "/api/v1/messages/" + u1.ID + "/edit", `{"content":"   "}`, 400, "content"},
		{p, http.MethodPost, "/api/v1/messages/" + u1.ID + "/edit", `{"content":7}`, 400, "content"},
		{p, http.MethodPost, "/api/v1/messages/" + u1.ID + "/edit", `{"content":"` + strings.Repeat("x", 33<<10) + `"}`, 413, "content"},
		{p, http.MethodPost, "/api/v1/messages/m_nope/edit", `{"content":"x"}`, 404, ""},
		{p, http.MethodPost, "/api/v1/messages/m_nope/show", ``, 404, ""},
		{other, http.MethodPost, "/api/v1/messages/" + u1.ID + "/edit", `{"content":"mine now"}`, 404, ""},
		{other, http.MethodPost, "/api/v1/messages/" + a1.ID + "/regenerate", ``, 404, ""},
		{other, http.MethodPost, "/api/v1/messages/" + eu1 + "/show", ``, 404, ""},
		{other, http.MethodDelete, "/api/v1/messages/" + u1.ID, ``, 404, ""},
	} {
		status, body := c.who.do(c.method, c.path, c.body)
		if status != c.status || gjson.Get(body, "error.param").Str != c.param {
			t.Errorf("%s %s %.40s: %d %s, want %d naming %q", c.method, c.path, c.body, status, body, c.status, c.param)
		}
	}
	if n := len(p.conversation(conv).Messages); n != 9 {
		t.Fatalf("refusals changed the conversation: %d messages, want 9", n)
	}
	// Someone else's conversation's page actions: not found either.
	if got := other.form("/c/"+conv+"/m/"+u1.ID+"/show", nil, true); !strings.Contains(got.body, "no longer exists") {
		t.Errorf("another person's version switch: %d %s", got.status, got.body)
	}

	// Delete the shown branch from the first question: the edited version
	// and its answer are shown, the other branch's five messages are gone.
	status, body = p.do(http.MethodDelete, "/api/v1/messages/"+u1.ID, "")
	if status != http.StatusOK || !slices.Equal(jsonStrings(body, "current_path"), []string{eu1, ra1.ID}) {
		t.Fatalf("delete a branch: %d %s", status, body)
	}
	if c := p.conversation(conv); len(c.Messages) != 3 {
		t.Fatalf("after deleting a branch: %d messages, want 3", len(c.Messages))
	}
}

// TestDeleteMessageOnThePage: the page's Delete on a person's message
// deletes that version and what followed it, and draws the thread again
// with the other version shown (and the sidebar); deleting the last
// message leaves the conversation's empty state. An answer's id is
// refused as an edit of it is; another person's message, or one named
// under another conversation, is not found; a branch whose reply streams
// stays. Nothing refused deletes anything.
func TestDeleteMessageOnThePage(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/delete.db")
	p := e.chatter("deleter@example.com")
	conv := p.newConversation()
	u1, a1 := ask(t, e, p, conv, "first question", "d-one")
	u2, a2 := ask(t, e, p, conv, "second question", "d-two")
	e.mockBody(map[string]any{"tokens": 3, "tag": "d-edit"})
	status, body := p.do(http.MethodPost, "/api/v1/messages/"+u2.ID+"/edit", `{"content":"second question, edited"}`)
	if status != http.StatusAccepted {
		t.Fatalf("edit: %d %s", status, body)
	}
	eu2 := gjson.Get(body, "user_message_id").Str
	ea2 := p.reply(conv)
	deleteURL := func(conv, mid string) string { return "/c/" + conv + "/m/" + mid + "/delete" }
	unchanged := func(what string) {
		t.Helper()
		if c := p.conversation(conv); len(c.Messages) != 6 || !slices.Equal(c.CurrentPath, []string{u1.ID, a1.ID, eu2, ea2.ID}) {
			t.Fatalf("%s changed the conversation: %d messages, path %v", what, len(c.Messages), c.CurrentPath)
		}
	}

	// An answer: refused above the composer, as the other actions are.
	got := p.form(deleteURL(conv, ea2.ID), nil, true)
	if got.header.Get("HX-Retarget") != "#composer-error" || !strings.Contains(got.body, "cannot be changed this way") {
		t.Errorf("delete an answer: %d %v %s", got.status, got.header, got.body)
	}
	if got := p.form(deleteURL(conv, ea2.ID), nil, false); got.status != http.StatusBadRequest {
		t.Errorf("delete an answer by a plain form: %d", got.status)
	}
	unchanged("deleting an answer")

	// Someone else's message, and the person's own under another of
	// their conversations: not found. Without the CSRF token: forbidden.
	other := e.chatter("not-the-owner@example.com")
	if got := other.form(deleteURL(conv, eu2), nil, false); got.status != http.StatusNotFound {
		t.Errorf("another person's message: %d %s", got.status, got.body)
	}
	if got := other.form(deleteURL(conv, eu2), nil, true); !strings.Contains(got.body, "no longer exists") {
		t.Errorf("another person's message by htmx: %d %s", got.status, got.body)
	}
	elsewhere := p.newConversation()
	if got := p.form(deleteURL(elsewhere, eu2), nil, false); got.status != http.StatusNotFound {
		t.Errorf("a message named under another conversation: %d %s", got.status, got.body)
	}
	for _, mid := range []string{"x", "%27%20OR%201%3D1%20--", "%00", strings.Repeat("a", 1500), eu2 + "%20"} {
		if got := p.form(deleteURL(conv, mid), nil, false); got.status != http.StatusNotFound {
			t.Errorf("message id %.40q: %d, want 404", mid, got.status)
		}
	}
	noCSRF := &chatter{e: e, c: p.c}
	if got := noCSRF.form(deleteURL(conv, eu2), nil, true); got.status != http.StatusForbidden {
		t.Errorf("no CSRF: %d", got.status)
	}
	unchanged("a refused delete")

	// The edited version: it and its answer go, the first version and
	// its answer are shown, with no version arrows left; the sidebar
	// comes along, the conversation still in it, and the refusal shown
	// above the composer is cleared.
	got = p.form(deleteURL(conv, eu2), nil, true)
	if got.status != http.StatusOK || !strings.Contains(got.body, ">second question</div>") ||
		strings.Contains(got.body, "second question, edited") || strings.Contains(got.body, "Previous version") ||
		!strings.Contains(got.body, `id="sidebar"`) || !strings.Contains(got.body, `data-conversation="`+conv+`"`) ||
		!strings.Contains(got.body, `<p id="composer-error" class="error" role="alert" hidden hx-swap-oob="true">`) {
		t.Fatalf("delete the edited version: %d\n%s", got.status, got.body)
	}
	if c := p.conversation(conv); len(c.Messages) != 4 || !slices.Equal(c.CurrentPath, []string{u1.ID, a1.ID, u2.ID, a2.ID}) {
		t.Fatalf("after deleting the edited version: %d messages, path %v", len(c.Messages), c.CurrentPath)
	}

	// A branch whose reply is still streaming stays.
	e.mockBody(map[string]any{"tokens": 500, "tps": 20})
	s := p.send(conv, "a long answer, please")
	c := p.conversation(conv)
	asked := c.Messages[len(c.Messages)-2]
	if got := p.form(deleteURL(conv, asked.ID), nil, true); !strings.Contains(got.body, "still being written") {
		t.Errorf("delete while the reply streams: %d %s", got.status, got.body)
	}
	if got := p.form(deleteURL(conv, u1.ID), nil, true); !strings.Contains(got.body, "still being written") {
		t.Errorf("delete a branch above the streaming reply: %d %s", got.status, got.body)
	}
	if status, body := p.do(http.MethodPost, "/api/v1/inference/stop", `{"inference_id":"`+s.InferenceID+`"}`); status != http.StatusOK {
		t.Fatalf("stop: %d %s", status, body)
	}
	p.reply(conv)
	if n := len(p.conversation(conv).Messages); n != 6 {
		t.Fatalf("deletes refused while streaming changed the conversation: %d messages, want 6", n)
	}

	// The first message: the conversation is empty, shown as a new one
	// is, and still in the sidebar.
	got = p.form(deleteURL(conv, u1.ID), url.Values{}, true)
	if got.status != http.StatusOK || !strings.Contains(got.body, `id="thread-empty"`) || strings.Contains(got.body, "<article") {
		t.Fatalf("delete the first message: %d\n%s", got.status, got.body)
	}
	if n := len(p.conversation(conv).Messages); n != 0 {
		t.Fatalf("after deleting the first message: %d messages", n)
	}
	if pg := p.page("/c/" + conv); !strings.Contains(pg.body, `id="thread-empty"`) || !strings.Contains(pg.body, `data-conversation="`+conv+`"`) {
		t.Fatalf("the emptied conversation's page:\n%s", pg.body)
	}
}

func jsonStrings(body, path string) []string {
	var out []string
	for _, v := range gjson.Get(body, path).Array() {
		out = append(out, v.Str)
	}
	return out
}

// TestStopThenSendKeepsTheStoppedAnswer: a stopped answer is in the
// conversation, and in the context of a message sent right after the
// stop, exactly as the page showed it.
func TestStopThenSendKeepsTheStoppedAnswer(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/stop.db")
	p := e.chatter("stopper@example.com")
	e.mockBody(map[string]any{"tokens": 500, "tps": 20})
	conv := p.newConversation()
	s := p.send(conv, "a long story")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ch, _ := p.follow(ctx, s.InferenceID, "")
	var shown []sseEvent
	for ev := range ch {
		shown = append(shown, ev)
		if len(shown) == 4 {
			break
		}
	}
	if status, body := p.do(http.MethodPost, "/api/v1/inference/stop", `{"inference_id":"`+s.InferenceID+`","seen":4}`); status != http.StatusOK {
		t.Fatalf("stop: %d %s", status, body)
	}
	e.mockBody(map[string]any{"tokens": 2, "tag": "after-stop"})
	p.send(conv, "go on")
	p.reply(conv)
	want := []string{"user: a long story", "assistant: " + text(shown), "user: go on"}
	if got := contextOf(t, e, "after-stop"); !slices.Equal(got, want) {
		t.Fatalf("the engine received\n%q\nwant\n%q", got, want)
	}
	if text(shown) == mockllm.CompletionText("a long story", 500) {
		t.Fatal("the answer was not stopped")
	}
}

// A share link copies the path shown: after an edit, the edited version
// and its answer, not the version it replaced nor what followed that.
func TestShareCopiesThePathShown(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/share-path.db")
	p := e.chatter("sharer-path@example.com")
	conv := p.newConversation()
	u1, _ := ask(t, e, p, conv, "original question", "sp-one")
	ask(t, e, p, conv, "follow-up question", "sp-two")
	e.mockBody(map[string]any{"tokens": 3, "tag": "sp-edit"})
	if status, body := p.do(http.MethodPost, "/api/v1/messages/"+u1.ID+"/edit", `{"content":"edited question"}`); status != http.StatusAccepted {
		t.Fatalf("edit: %d %s", status, body)
	}
	p.reply(conv)
	pg := p.page("/s/" + p.share(conv, `{}`))
	// (The conversation keeps the title its first message gave it.)
	if pg.status != http.StatusOK || !strings.Contains(pg.body, `<div class="text">edited question</div>`) ||
		strings.Contains(pg.body, `<div class="text">original question`) || strings.Contains(pg.body, "follow-up question") {
		t.Fatalf("the shared page: %d\n%s", pg.status, pg.body)
	}
}
