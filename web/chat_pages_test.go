package web_test

import (
	"context"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"moonji/internal/mockllm"
	"moonji/models"
)

// page is a response of the chat's pages.
type page struct {
	status int
	header http.Header
	body   string
}

// form sends what the page's htmx sends: a form, the CSRF header and, when
// htmx is set, HX-Request.
func (p *chatter) form(path string, values url.Values, htmx bool) page {
	p.e.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, p.e.URL+path, strings.NewReader(values.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("X-CSRF-Token", p.csrf)
	if htmx {
		req.Header.Set("HX-Request", "true")
	}
	return p.fetch(req)
}

func (p *chatter) page(path string) page {
	p.e.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, p.e.URL+path, nil)
	return p.fetch(req)
}

func (p *chatter) fetch(req *http.Request) page {
	p.e.t.Helper()
	c := *p.c
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := c.Do(req)
	if err != nil {
		p.e.t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer resp.Body.Close()
	return page{status: resp.StatusCode, header: resp.Header, body: readAll(p.e.t, resp.Body)}
}

var (
	liveFollow = regexp.MustCompile(`sse-connect="/api/v1/generations/(inf_[0-9a-z]+)/events\?last_event_id=(\d+)"`)
	streamText = regexp.MustCompile(`(?s)<div class="text" sse-swap="chunk" hx-swap="beforeend">(.*?)</div>`)
)

// The composer's send: a new conversation from /, its URL pushed, the two
// messages and the sidebar in the answer; then a message to it.
func TestChatPageSend(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	p := e.chatter("pia@example.com")
	e.mockBody(map[string]any{"tokens": 5, "tps": 20})

	got := p.form("/chat", url.Values{"conversation": {""}, "model": {"m1"}, "content": {"Plan <b>a</b> trip"}}, true)
	if got.status != http.StatusOK {
		t.Fatalf("send: %d %s", got.status, got.body)
	}
	push := got.header.Get("HX-Push-Url")
	if !strings.HasPrefix(push, "/c/c_") {
		t.Fatalf("HX-Push-Url %q", push)
	}
	conv := strings.TrimPrefix(push, "/c/")
	for _, want := range []string{
		`data-role="user"`, `Plan &lt;b&gt;a&lt;/b&gt; trip`, `data-role="assistant" data-status="streaming"`,
		`id="sidebar"`, `hx-swap-oob="true"`, `value="` + conv + `"`, `id="thread-empty" hx-swap-oob="delete"`,
	} {
		if !strings.Contains(got.body, want) {
			t.Errorf("answer lacks %q:\n%s", want, got.body)
		}
	}
	p.reply(conv)

	// The next message goes to that conversation; a plain form (no htmx)
	// is sent to its page.
	got = p.form("/chat", url.Values{"conversation": {conv}, "model": {"m1"}, "content": {"and back"}}, false)
	if got.status != http.StatusSeeOther || got.header.Get("Location") != "/c/"+conv {
		t.Fatalf("plain send: %d %v", got.status, got.header)
	}
	p.reply(conv)
	if c := p.conversation(conv); len(c.Messages) != 4 || c.Messages[2].Content != "and back" {
		t.Fatalf("conversation %+v", c)
	}
	// A later send's answer holds only its two messages, and no longer
	// removes the empty-thread hint.
	got = p.form("/chat", url.Values{"conversation": {conv}, "content": {"third"}}, true)
	if n := strings.Count(got.body, "<article"); n != 2 || strings.Contains(got.body, "thread-empty") || got.header.Get("HX-Push-Url") != "" {
		t.Errorf("third send: %d articles, push %q\n%s", n, got.header.Get("HX-Push-Url"), got.body)
	}
	p.reply(conv)
	// The page shows all six, finished replies rendered.
	pg := p.page("/c/" + conv)
	if pg.status != http.StatusOK || strings.Count(pg.body, "<article") != 6 || strings.Contains(pg.body, "sse-connect") {
		t.Fatalf("page: %d, %d articles\n%s", pg.status, strings.Count(pg.body, "<article"), pg.body)
	}
}

// What a send refuses shows above the composer (a 200 retargeted there,
// as htmx swaps only 2xx) and changes nothing.
func TestChatPageSendRefusals(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	p := e.chatter("quin@example.com")
	e.mockBody(map[string]any{"tokens": 200, "tps": 50})
	conv := p.newConversation()
	p.send(conv, "busy now")

	for _, c := range []struct {
		name   string
		values url.Values
		want   string
	}{
		{"empty", url.Values{"conversation": {conv}, "content": {"  \n "}}, "Write a message first."},
		{"too long", url.Values{"conversation": {conv}, "content": {strings.Repeat("x", 33<<10)}}, "longer than 32 KiB"},
		{"unknown model", url.Values{"conversation": {""}, "model": {"gpt-<script>"}, "content": {"hi"}}, "Choose one of the listed models."},
		{"switch to unknown model", url.Values{"conversation": {conv}, "model": {"nope"}, "content": {"hi"}}, "Choose one of the listed models."},
		{"unknown conversation", url.Values{"conversation": {"c_doesnotexist"}, "content": {"hi"}}, "no longer exists"},
		{"hostile id", url.Values{"conversation": {`"><script>alert(1)</script>`}, "content": {"hi"}}, "no longer exists"},
		{"busy", url.Values{"conversation": {conv}, "content": {"again"}}, "still being written"},
	} {
		got := p.form("/chat", c.values, true)
		if got.status != http.StatusOK || got.header.Get("HX-Retarget") != "#composer-error" || !strings.Contains(got.body, c.want) {
			t.Errorf("%s: %d %v %s", c.name, got.status, got.header.Get("HX-Retarget"), got.body)
		}
		if strings.Contains(got.body, "<script>") {
			t.Errorf("%s: unescaped script in %s", c.name, got.body)
		}
	}
	// A body past the pages' 64 KiB is refused before any form is parsed.
	if got := p.form("/chat", url.Values{"conversation": {conv}, "content": {strings.Repeat("y", 1<<20)}}, true); got.status != http.StatusRequestEntityTooLarge {
		t.Errorf("1 MB form: %d", got.status)
	}
	// No CSRF token: refused.
	noCSRF := &chatter{e: e, c: p.c}
	if got := noCSRF.form("/chat", url.Values{"conversation": {conv}, "content": {"x"}}, true); got.status != http.StatusForbidden {
		t.Errorf("no CSRF: %d", got.status)
	}
	if c := p.conversation(conv); len(c.Messages) != 2 {
		t.Errorf("refused sends changed the conversation: %+v", c.Messages)
	}
	// Regenerate while the reply streams: busy too.
	if got := p.form("/c/"+conv+"/regenerate", nil, true); !strings.Contains(got.body, "still being written") {
		t.Errorf("regenerate while busy: %s", got.body)
	}
}

// A reload during a reply on its own replica shows the text of the chunks
// so far and follows the events from there: page text + events = the
// saved reply, nothing lost or doubled.
func TestChatPageContinuesALiveReply(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	p := e.chatter("rae@example.com")
	e.mockBody(map[string]any{"tokens": 40, "tps": 40})
	conv := p.newConversation()
	s := p.send(conv, "a live one")
	time.Sleep(300 * time.Millisecond)

	pg := p.page("/c/" + conv)
	m := liveFollow.FindStringSubmatch(pg.body)
	if m == nil || m[1] != s.InferenceID {
		t.Fatalf("page does not follow the reply:\n%s", pg.body)
	}
	seq, _ := strconv.Atoi(m[2])
	shown := html.UnescapeString(streamText.FindStringSubmatch(pg.body)[1])
	if seq == 0 || shown == "" {
		t.Fatalf("page drawn at seq %d with %q: the reply should have started", seq, shown)
	}
	evs := p.events(s.InferenceID, strconv.Itoa(seq))
	checkStream(t, evs, seq+1, "done")
	want := mockllm.CompletionText("a live one", 40)
	if got := shown + text(evs); got != want {
		t.Errorf("page %q + events %q\nwant %q", shown, text(evs), want)
	}
	if r := p.reply(conv); r.Content != want {
		t.Errorf("saved %q", r.Content)
	}
}

// A reply running on another replica is shown from the database and
// reloads itself every second until it ends.
func TestChatPagePollsAReplyOfAnotherReplica(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	p := e.chatter("sam@example.com")
	_, who := e.me(p.c)
	ctx := context.Background()
	conv := &models.Conversation{ID: models.NewConversationID(), UserID: who.ID, Model: "m1", Title: "elsewhere"}
	if err := models.CreateConversation(ctx, e.DB, conv); err != nil {
		t.Fatal(err)
	}
	_ = models.Heartbeat(ctx, e.DB, "sibling", time.Now())
	inf, msgID := "inf_sibling1", models.NewMessageID()
	e.DB.Create(&models.Message{ID: msgID, ConversationID: conv.ID, Role: "assistant", Status: models.MessageStreaming,
		InferenceID: &inf, Replica: "sibling", Content: "so far"})

	pg := p.page("/c/" + conv.ID)
	poll := `hx-get="/c/` + conv.ID + `/m/` + msgID + `" hx-trigger="every 1s"`
	if !strings.Contains(pg.body, poll) || strings.Contains(pg.body, "sse-connect") || !strings.Contains(pg.body, "so far") {
		t.Fatalf("page does not poll the reply:\n%s", pg.body)
	}
	if err := models.SaveMessageContent(ctx, e.DB, msgID, "so far, and more"); err != nil {
		t.Fatal(err)
	}
	frag := p.page("/c/" + conv.ID + "/m/" + msgID)
	if frag.status != http.StatusOK || !strings.Contains(frag.body, "so far, and more") || !strings.Contains(frag.body, poll) {
		t.Fatalf("fragment: %d %s", frag.status, frag.body)
	}
	if err := models.FinishMessage(ctx, e.DB, msgID, models.MessageEnd{Status: models.MessageStopped, Content: "so far, and more"}); err != nil {
		t.Fatal(err)
	}
	frag = p.page("/c/" + conv.ID + "/m/" + msgID)
	if !strings.Contains(frag.body, `data-status="stopped"`) || strings.Contains(frag.body, "hx-trigger") {
		t.Fatalf("finished fragment still polls: %s", frag.body)
	}
}

// Another person's conversation is a 404 on every page route, and nothing
// of it leaks or changes.
func TestChatPagesOwnership(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	owner := e.chatter("tia@example.com")
	other := e.chatter("uma@example.com")
	e.mockBody(map[string]any{"tokens": 3})
	conv := owner.newConversation()
	owner.send(conv, "secret plans")
	reply := owner.reply(conv)

	for _, path := range []string{"/c/" + conv, "/c/" + conv + "/m/" + reply.ID} {
		if got := other.page(path); got.status != http.StatusNotFound || strings.Contains(got.body, "secret plans") {
			t.Errorf("GET %s: %d", path, got.status)
		}
	}
	for _, path := range []string{"/c/" + conv + "/rename", "/c/" + conv + "/delete"} {
		if got := other.form(path, url.Values{"title": {"mine now"}}, false); got.status != http.StatusNotFound {
			t.Errorf("POST %s: %d %s", path, got.status, got.body)
		}
	}
	if got := other.form("/c/"+conv+"/regenerate", nil, true); !strings.Contains(got.body, "no longer exists") {
		t.Errorf("regenerate: %d %s", got.status, got.body)
	}
	if got := other.form("/chat", url.Values{"conversation": {conv}, "content": {"hi"}}, true); !strings.Contains(got.body, "no longer exists") {
		t.Errorf("send: %s", got.body)
	}
	for _, q := range []string{"", "secret"} {
		if got := other.page("/history?q=" + q); got.status != http.StatusOK || strings.Contains(got.body, conv) {
			t.Errorf("history %q shows the other's conversation", q)
		}
	}
	if got := other.page("/"); strings.Contains(got.body, conv) {
		t.Error("the sidebar shows the other's conversation")
	}
	c := owner.conversation(conv)
	if c.Title != "secret plans" || len(c.Messages) != 2 || c.Messages[1].ID != reply.ID {
		t.Errorf("owner's conversation changed: %+v", c)
	}
}

// History: rename and delete go back to the same search, hostile titles
// and queries are shown as text, regenerate replaces the last reply.
func TestChatHistoryPage(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	p := e.chatter("val@example.com")
	e.mockBody(map[string]any{"tokens": 3})
	conv := p.newConversation()
	p.send(conv, "first message")
	first := p.reply(conv)

	got := p.form("/c/"+conv+"/rename", url.Values{"title": {`<img src=x onerror=alert(1)>`}, "q": {"img"}}, false)
	if got.status != http.StatusSeeOther || got.header.Get("Location") != "/history?done=renamed&q=img" {
		t.Fatalf("rename: %d %v", got.status, got.header.Get("Location"))
	}
	pg := p.page("/history?done=renamed&q=" + url.QueryEscape(`"><script>`))
	if pg.status != http.StatusOK || strings.Contains(pg.body, "<script>") || !strings.Contains(pg.body, "Renamed.") {
		t.Fatalf("history with a hostile query: %d\n%s", pg.status, pg.body)
	}
	pg = p.page("/history")
	if !strings.Contains(pg.body, "&lt;img src=x onerror=alert(1)&gt;") || strings.Contains(pg.body, "<img src=x") {
		t.Errorf("hostile title not escaped:\n%s", pg.body)
	}
	if got := p.page("/history?q=" + strings.Repeat("x", 201)); got.status != http.StatusBadRequest {
		t.Errorf("long query: %d", got.status)
	}
	if got := p.page("/history?cursor=%00garbage"); got.status != http.StatusBadRequest {
		t.Errorf("bad cursor: %d", got.status)
	}
	if got := p.form("/c/"+conv+"/rename", url.Values{"title": {strings.Repeat("t", 201)}}, false); got.status != http.StatusBadRequest {
		t.Errorf("long title: %d", got.status)
	}

	// Regenerate: a new version of the last reply, shown; the first kept.
	got = p.form("/c/"+conv+"/regenerate", url.Values{"model": {"m1"}}, true)
	if got.status != http.StatusOK || !strings.Contains(got.body, `data-role="assistant"`) || !strings.Contains(got.body, "2 / 2") {
		t.Fatalf("regenerate: %d %s", got.status, got.body)
	}
	again := p.reply(conv)
	if c := p.conversation(conv); len(c.Messages) != 3 || again.ID == first.ID || again.InferenceID == first.InferenceID ||
		len(c.CurrentPath) != 2 || c.CurrentPath[1] != again.ID || c.Messages[1].ID != first.ID {
		t.Errorf("after regenerate: %+v (path %v)", c.Messages, c.CurrentPath)
	}

	got = p.form("/c/"+conv+"/delete", url.Values{"q": {""}}, false)
	if got.status != http.StatusSeeOther || got.header.Get("Location") != "/history?done=deleted" {
		t.Fatalf("delete: %d %v", got.status, got.header.Get("Location"))
	}
	if got := p.page("/c/" + conv); got.status != http.StatusNotFound {
		t.Errorf("deleted conversation: %d", got.status)
	}
}

// Signed out (a session that expired), htmx is told where to send the
// browser rather than given the sign-in page to swap into a fragment.
func TestChatPagesSignedOut(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	anon := &chatter{e: e, c: &http.Client{}}
	req, _ := http.NewRequest(http.MethodGet, e.URL+"/c/c_x/m/m_y", nil)
	req.Header.Set("HX-Request", "true")
	req.Header.Set("HX-Current-URL", e.URL+"/c/c_x?a=1")
	got := anon.fetch(req)
	if got.status != http.StatusUnauthorized || got.header.Get("HX-Redirect") != "/login?next="+url.QueryEscape("/c/c_x?a=1") {
		t.Errorf("htmx signed out: %d %v", got.status, got.header)
	}
	// A hostile HX-Current-URL leads nowhere else: only its path is kept
	// (and the sign-in keeps only same-origin paths in next).
	req, _ = http.NewRequest(http.MethodPost, e.URL+"/chat", nil)
	req.Header.Set("HX-Request", "true")
	req.Header.Set("HX-Current-URL", "https://evil.example//evil.example/x")
	got = anon.fetch(req)
	if got.status != http.StatusUnauthorized || got.header.Get("HX-Redirect") != "/login?next="+url.QueryEscape("//evil.example/x") {
		t.Errorf("hostile current URL: %d %v", got.status, got.header)
	}
	if got := anon.page("/login?next=" + url.QueryEscape("//evil.example/x")); strings.Contains(got.header.Get("Location"), "evil.example") {
		t.Errorf("sign-in would go to %q", got.header.Get("Location"))
	}
	if got := anon.page("/c/c_x"); got.status != http.StatusSeeOther || !strings.HasPrefix(got.header.Get("Location"), "/login?next=") {
		t.Errorf("page signed out: %d %v", got.status, got.header)
	}
}
