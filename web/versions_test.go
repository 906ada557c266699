package web_test

import (
	"context"
	"net/http"
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
