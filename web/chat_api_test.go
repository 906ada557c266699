package web_test

import (
	"bufio"
	"context"
	"encoding/json"
	"html"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/internal/mockllm"
	"moonji/models"
)

// chatter is a signed-in person using the chat API over real HTTP.
type chatter struct {
	e    *testEnv
	c    *http.Client
	csrf string
}

func (e *testEnv) chatter(email string) *chatter {
	e.t.Helper()
	c := e.signedIn(email, false)
	status, m := e.me(c)
	if status != http.StatusOK {
		e.t.Fatalf("/api/me: %d", status)
	}
	return &chatter{e: e, c: c, csrf: m.CSRFToken}
}

// do sends a JSON request with the CSRF header and returns the status and body.
func (p *chatter) do(method, path, body string) (int, string) {
	p.e.t.Helper()
	hdr := map[string]string{"X-CSRF-Token": p.csrf, "Content-Type": "application/json"}
	req, err := http.NewRequest(method, p.e.URL+path, strings.NewReader(body))
	if err != nil {
		p.e.t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := p.c.Do(req)
	if err != nil {
		p.e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	return resp.StatusCode, readAll(p.e.t, resp.Body)
}

func (p *chatter) newConversation() string {
	p.e.t.Helper()
	status, body := p.do(http.MethodPost, "/api/v1/conversations", `{"model":"m1"}`)
	if status != http.StatusCreated {
		p.e.t.Fatalf("create conversation: %d %s", status, body)
	}
	var out struct{ ID string }
	_ = json.Unmarshal([]byte(body), &out)
	return out.ID
}

type sent struct {
	MessageID   string `json:"message_id"`
	InferenceID string `json:"inference_id"`
}

func (p *chatter) send(conv, content string) sent {
	p.e.t.Helper()
	b, _ := json.Marshal(map[string]string{"content": content})
	status, body := p.do(http.MethodPost, "/api/v1/conversations/"+conv+"/messages", string(b))
	if status != http.StatusAccepted {
		p.e.t.Fatalf("send: %d %s", status, body)
	}
	var s sent
	_ = json.Unmarshal([]byte(body), &s)
	return s
}

type apiMessage struct {
	ID, Role, Content, Status, Reason string
	InferenceID                       string  `json:"inference_id"`
	ParentID                          *string `json:"parent_id"`
}

type apiConversation struct {
	ID, Title, Model string
	Messages         []apiMessage
	CurrentPath      []string `json:"current_path"`
}

func (p *chatter) conversation(id string) apiConversation {
	p.e.t.Helper()
	status, body := p.do(http.MethodGet, "/api/v1/conversations/"+id, "")
	if status != http.StatusOK {
		p.e.t.Fatalf("get conversation: %d %s", status, body)
	}
	var c apiConversation
	if err := json.Unmarshal([]byte(body), &c); err != nil {
		p.e.t.Fatal(err)
	}
	return c
}

// reply waits until the conversation's last message has finished.
func (p *chatter) reply(conv string) apiMessage {
	p.e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := p.conversation(conv)
		if n := len(c.Messages); n > 0 && c.Messages[n-1].Status != models.MessageStreaming {
			return c.Messages[n-1]
		}
		if time.Now().After(deadline) {
			p.e.t.Fatalf("reply still streaming after 10s: %+v", c.Messages)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type sseEvent struct {
	ID, Event, Data string
}

// follow opens the event stream of a generation; events arrive on the
// channel, which closes when the stream ends.
func (p *chatter) follow(ctx context.Context, inference, lastID string) (<-chan sseEvent, *http.Response) {
	p.e.t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.e.URL+"/api/v1/generations/"+inference+"/events", nil)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := p.c.Do(req)
	if err != nil {
		p.e.t.Fatalf("events: %v", err)
	}
	ch := make(chan sseEvent, 1024)
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		close(ch)
		return ch, resp
	}
	go func() {
		defer close(ch)
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		var ev sseEvent
		var data []string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if ev.Event != "" {
					ev.Data = strings.Join(data, "\n")
					ch <- ev
				}
				ev, data = sseEvent{}, nil
			case strings.HasPrefix(line, ":"):
			case strings.HasPrefix(line, "id: "):
				ev.ID = line[4:]
			case strings.HasPrefix(line, "event: "):
				ev.Event = line[7:]
			case strings.HasPrefix(line, "data: "):
				data = append(data, line[6:])
			}
		}
	}()
	return ch, resp
}

// events reads a whole event stream.
func (p *chatter) events(inference, lastID string) []sseEvent {
	p.e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ch, resp := p.follow(ctx, inference, lastID)
	if resp.StatusCode != http.StatusOK {
		p.e.t.Fatalf("events: %d", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		p.e.t.Fatalf("events content type %q", ct)
	}
	var out []sseEvent
	for ev := range ch {
		out = append(out, ev)
	}
	return out
}

// text joins the chunk events' text, unescaped.
func text(evs []sseEvent) string {
	var b strings.Builder
	for _, ev := range evs {
		if ev.Event == "chunk" {
			b.WriteString(html.UnescapeString(ev.Data))
		}
	}
	return b.String()
}

// checkStream checks that evs are chunks numbered from first on, then one done.
func checkStream(t *testing.T, evs []sseEvent, first int, status string) {
	t.Helper()
	if len(evs) == 0 || evs[len(evs)-1].Event != "done" {
		t.Fatalf("stream does not end with done: %+v", evs)
	}
	for i, ev := range evs[:len(evs)-1] {
		if ev.Event != "chunk" || ev.ID != strconv.Itoa(first+i) {
			t.Fatalf("event %d: %+v, want chunk %d", i, ev, first+i)
		}
	}
	if done := evs[len(evs)-1].Data; !strings.Contains(done, `data-status="`+status+`"`) {
		t.Fatalf("done event %q, want status %s", done, status)
	}
}

func (e *testEnv) mockBody(knobs map[string]any) {
	e.srv.Chat.SetExtraBody(map[string]any{"mock": knobs})
}

// A reply is written on the server, through the gateway, with nobody
// watching: saved done with the engine's text and tokens, one usage row.
func TestChatReplyWithoutViewer(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	p := e.chatter("ann@example.com")
	e.mockBody(map[string]any{"tokens": 12, "tag": "nobody"})
	conv := p.newConversation()
	s := p.send(conv, "Tell me a story\nplease")
	if !strings.HasPrefix(s.InferenceID, "inf_") || s.MessageID == "" {
		t.Fatalf("sent %+v", s)
	}
	m := p.reply(conv)
	want := mockllm.CompletionText("Tell me a story\nplease", 12)
	if m.Status != models.MessageDone || m.Content != want || m.InferenceID != s.InferenceID || m.ID != s.MessageID {
		t.Fatalf("reply %+v, want done %q", m, want)
	}
	c := p.conversation(conv)
	if c.Title != "Tell me a story" || len(c.Messages) != 2 || c.Messages[0].Role != "user" {
		t.Fatalf("conversation %+v", c)
	}
	var msg models.Message
	e.DB.Where("id = ?", s.MessageID).Take(&msg)
	if msg.CompletionTokens != 12 || msg.PromptTokens == 0 {
		t.Errorf("tokens %d/%d", msg.PromptTokens, msg.CompletionTokens)
	}
	row := e.final(s.InferenceID)
	if row.Source != "web" || row.Outcome != models.OutcomeSuccess || row.UserID == nil {
		t.Errorf("usage row %+v", row)
	}
	// The second message goes with the first exchange as context.
	e.mockBody(map[string]any{"tokens": 3, "tag": "second"})
	p.send(conv, "more")
	p.reply(conv)
	rec, err := e.Mock.WaitFor(context.Background(), "second", nil)
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Stream   bool
		Messages []struct{ Role, Content string }
	}
	_ = json.Unmarshal(rec.Body, &body)
	if !body.Stream || len(body.Messages) != 3 || body.Messages[1].Content != want || body.Messages[2].Content != "more" {
		t.Errorf("context sent: %s", rec.Body)
	}
	// A done generation's events: every chunk, then done, at once.
	evs := p.events(s.InferenceID, "")
	checkStream(t, evs, 1, "done")
	if text(evs) != want {
		t.Errorf("events text %q", text(evs))
	}
}

// Two viewers of one reply see the same chunks; a viewer resuming from
// Last-Event-ID gets the rest; both match what is saved.
func TestChatViewersAndReplay(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	p := e.chatter("bo@example.com")
	e.mockBody(map[string]any{"tokens": 30, "tps": 100})
	conv := p.newConversation()
	s := p.send(conv, "hello")
	got := make(chan []sseEvent, 2)
	for range 2 {
		go func() { got <- p.events(s.InferenceID, "") }()
	}
	a, b := <-got, <-got
	checkStream(t, a, 1, "done")
	if len(a) != len(b) || text(a) != text(b) {
		t.Fatalf("viewers differ:\n%+v\n%+v", a, b)
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("event %d differs: %+v / %+v", i, a[i], b[i])
		}
	}
	m := p.reply(conv)
	if m.Content != text(a) || m.Status != models.MessageDone {
		t.Fatalf("saved %q, streamed %q", m.Content, text(a))
	}
	replay := p.events(s.InferenceID, "10")
	checkStream(t, replay, 11, "done")
	if len(replay) != len(a)-10 {
		t.Fatalf("replay from 10: %d events, want %d", len(replay), len(a)-10)
	}
	// ?last_event_id= works as the header does (EventSource cannot set it on a first connect).
	status, body := p.do(http.MethodGet, "/api/v1/generations/"+s.InferenceID+"/events?last_event_id=29", "")
	if status != http.StatusOK || !strings.Contains(body, "id: 30\nevent: chunk") || strings.Contains(body, "id: 29\n") {
		t.Errorf("last_event_id=29: %d %s", status, body)
	}
}

// Stop with seen keeps exactly the chunks the page showed, and the saved
// message says so as soon as the stop answers.
func TestChatStopKeepsWhatWasSeen(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	p := e.chatter("cy@example.com")
	e.mockBody(map[string]any{"tokens": 500, "tps": 20})
	conv := p.newConversation()
	s := p.send(conv, "a long one")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ch, _ := p.follow(ctx, s.InferenceID, "")
	// The page has received five chunks but applied only three: exactly
	// those three are kept, whatever was generated meanwhile.
	var received []sseEvent
	for ev := range ch {
		received = append(received, ev)
		if len(received) == 5 {
			break
		}
	}
	seen := received[:3]
	status, body := p.do(http.MethodPost, "/api/v1/inference/stop", `{"inference_id":"`+s.InferenceID+`","seen":3}`)
	if status != http.StatusOK || !strings.Contains(body, `"acknowledged":true`) {
		t.Fatalf("stop: %d %s", status, body)
	}
	// Right after the stop's 200: exactly the three chunks, stopped.
	c := p.conversation(conv)
	m := c.Messages[len(c.Messages)-1]
	if m.Status != models.MessageStopped || m.Content != text(seen) {
		t.Fatalf("after stop: %+v, want stopped %q", m, text(seen))
	}
	var rest []sseEvent
	for ev := range ch {
		rest = append(rest, ev)
	}
	if len(rest) == 0 || rest[len(rest)-1].Event != "done" || !strings.Contains(rest[len(rest)-1].Data, `data-status="stopped"`) ||
		!strings.Contains(rest[len(rest)-1].Data, html.EscapeString(text(seen))) {
		t.Fatalf("viewer's end: %+v", rest)
	}
	if row := e.final(s.InferenceID); row.Outcome != models.OutcomeStopped {
		t.Errorf("usage row %+v", row)
	}

	// Without seen: what had been generated when the stop took effect.
	s2 := p.send(conv, "again")
	ch2, _ := p.follow(ctx, s2.InferenceID, "")
	var before []sseEvent
	for ev := range ch2 {
		before = append(before, ev)
		if len(before) == 2 {
			break
		}
	}
	status, body = p.do(http.MethodPost, "/api/v1/inference/stop", `{"inference_id":"`+s2.InferenceID+`"}`)
	if status != http.StatusOK {
		t.Fatalf("stop: %d %s", status, body)
	}
	c = p.conversation(conv)
	m = c.Messages[len(c.Messages)-1]
	all := append(before, drain(ch2)...)
	if m.Status != models.MessageStopped || m.Content != text(all) || !strings.HasPrefix(m.Content, text(before)) {
		t.Fatalf("after stop without seen: %+v, streamed %q", m, text(all))
	}
	// The earlier stopped answer went as context with the new message.
	if got := len(c.Messages); got != 4 {
		t.Fatalf("%d messages", got)
	}
}

func drain(ch <-chan sseEvent) []sseEvent {
	var out []sseEvent
	for ev := range ch {
		out = append(out, ev)
	}
	return out
}

// A reply the gateway refuses (rate limit: no OnEnd; queue timeout: after
// waiting) is saved as an error with the gateway's words, and leaves its
// usage row.
func TestChatRefusedReplies(t *testing.T) {
	t.Run("rate_limited", func(t *testing.T) {
		e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db", func(c *config.Config) { c.RateLimit.RequestsPerMinute = 1 })
		p := e.chatter("di@example.com")
		e.mockBody(map[string]any{"tokens": 2})
		conv := p.newConversation()
		p.send(conv, "one")
		if m := p.reply(conv); m.Status != models.MessageDone {
			t.Fatalf("first reply %+v", m)
		}
		s := p.send(conv, "two")
		m := p.reply(conv)
		if m.Status != models.MessageError || !strings.Contains(m.Reason, "Rate limit reached") {
			t.Fatalf("reply %+v", m)
		}
		if row := e.final(s.InferenceID); row.Outcome != models.OutcomeRejected || row.Reason != "rate_limited" {
			t.Errorf("usage row %+v", row)
		}
		evs := p.events(s.InferenceID, "")
		checkStream(t, evs, 1, "error")
		if !strings.Contains(evs[len(evs)-1].Data, "Rate limit reached") {
			t.Errorf("done %q", evs[len(evs)-1].Data)
		}
	})
	t.Run("queue_timeout", func(t *testing.T) {
		e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db", func(c *config.Config) {
			c.Backends[0].MaxConcurrency, c.Backends[0].MaxQueue, c.Backends[0].QueueTimeout = 1, 1, 200*time.Millisecond
		})
		p := e.chatter("ed@example.com")
		e.mockBody(map[string]any{"tokens": 40, "tps": 20, "tag": "busy"})
		busy := p.newConversation()
		p.send(busy, "hold the slot")
		if _, err := e.Mock.WaitFor(context.Background(), "busy", nil); err != nil {
			t.Fatal(err)
		}
		conv := p.newConversation()
		s := p.send(conv, "queued")
		m := p.reply(conv)
		if m.Status != models.MessageError || !strings.Contains(m.Reason, "at capacity") {
			t.Fatalf("reply %+v", m)
		}
		if row := e.final(s.InferenceID); row.Outcome != models.OutcomeRejected {
			t.Errorf("usage row %+v", row)
		}
		// One reply at a time per conversation.
		status, body := p.do(http.MethodPost, "/api/v1/conversations/"+busy+"/messages", `{"content":"x"}`)
		if status != http.StatusConflict {
			t.Errorf("second message while streaming: %d %s", status, body)
		}
	})
}

// Streaming replies of a previous life, or of a dead replica, are closed
// at start; a live sibling's are left alone.
func TestChatLeftoversClosedAtStart(t *testing.T) {
	dbURL := "sqlite://" + t.TempDir() + "/moonji.db"
	db, err := models.Open(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	_ = models.Heartbeat(context.Background(), db, "sibling", now)
	for _, r := range []string{"me", "sibling"} {
		// One conversation each: a conversation has one streaming reply at most.
		conv := &models.Conversation{ID: models.NewConversationID(), UserID: 1, Model: "m1"}
		if err := models.CreateConversation(context.Background(), db, conv); err != nil {
			t.Fatal(err)
		}
		id := "inf_" + r
		if err := db.Create(&models.Message{ID: models.NewMessageID(), ConversationID: conv.ID, Role: "assistant",
			Status: models.MessageStreaming, InferenceID: &id, Replica: r, Content: "partial"}).Error; err != nil {
			t.Fatal(err)
		}
	}
	models.Close(db)
	e := startEnv(t, dbURL, func(c *config.Config) { c.ReplicaID = "me" })
	for id, want := range map[string]string{"inf_me": models.MessageError, "inf_sibling": models.MessageStreaming} {
		m, _, err := models.MessageByInference(context.Background(), e.DB, id)
		if err != nil {
			t.Fatal(err)
		}
		if m.Status != want || m.Content != "partial" || (want == models.MessageError && m.Reason != "gateway_restart") {
			t.Errorf("%s: %+v", id, m)
		}
	}
}

// Someone else's conversations and generations are unknown (404) on every
// route; keys and requests without the CSRF header are refused.
func TestChatAPIGuards(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	owner := e.chatter("fay@example.com")
	other := e.chatter("gus@example.com")
	e.mockBody(map[string]any{"tokens": 2})
	conv := owner.newConversation()
	s := owner.send(conv, "mine")
	owner.reply(conv)

	for _, r := range []struct{ method, path, body string }{
		{http.MethodGet, "/api/v1/conversations/" + conv, ""},
		{http.MethodPatch, "/api/v1/conversations/" + conv, `{"title":"x"}`},
		{http.MethodDelete, "/api/v1/conversations/" + conv, ""},
		{http.MethodGet, "/api/v1/conversations/" + conv + "/export?format=md", ""},
		{http.MethodPost, "/api/v1/conversations/" + conv + "/messages", `{"content":"x"}`},
		{http.MethodGet, "/api/v1/generations/" + s.InferenceID + "/events", ""},
		{http.MethodPost, "/api/v1/inference/stop", `{"inference_id":"` + s.InferenceID + `"}`},
	} {
		if status, body := other.do(r.method, r.path, r.body); status != http.StatusNotFound || !strings.Contains(body, `"error"`) {
			t.Errorf("other person %s %s: %d %s", r.method, r.path, status, body)
		}
	}
	if status, body := other.do(http.MethodGet, "/api/v1/conversations", ""); status != http.StatusOK || strings.Contains(body, conv) {
		t.Errorf("other's list: %d %s", status, body)
	}
	// The owner's is intact.
	if c := owner.conversation(conv); len(c.Messages) != 2 {
		t.Fatalf("owner's conversation %+v", c)
	}

	// A key opens nothing under /api.
	req, _ := http.NewRequest(http.MethodGet, e.URL+"/api/v1/conversations", nil)
	req.Header.Set("Authorization", "Bearer "+e.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("key on /api: %d", resp.StatusCode)
	}
	// No CSRF header: refused before anything happens.
	noCSRF := &chatter{e: e, c: owner.c}
	for _, r := range []struct{ method, path, body string }{
		{http.MethodPost, "/api/v1/conversations", `{"model":"m1"}`},
		{http.MethodPost, "/api/v1/conversations/" + conv + "/messages", `{"content":"x"}`},
		{http.MethodDelete, "/api/v1/conversations/" + conv, ""},
		{http.MethodPatch, "/api/v1/conversations/" + conv, `{"title":"x"}`},
	} {
		if status, _ := noCSRF.do(r.method, r.path, r.body); status != http.StatusForbidden {
			t.Errorf("no CSRF %s %s: %d", r.method, r.path, status)
		}
	}
}

// Hostile or wrong inputs are refused with 4xx in OpenAI's shape.
func TestChatAPIRefusesBadInput(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	p := e.chatter("hal@example.com")
	conv := p.newConversation()
	huge, _ := json.Marshal(map[string]string{"content": strings.Repeat("a", 33<<10)})
	longTitle, _ := json.Marshal(map[string]string{"title": strings.Repeat("é", 201)})
	for _, r := range []struct {
		method, path, body string
		want               int
	}{
		{http.MethodPost, "/api/v1/conversations", `{"model":"nope"}`, http.StatusBadRequest},
		{http.MethodPost, "/api/v1/conversations", `{"model":1}`, http.StatusBadRequest},
		{http.MethodPost, "/api/v1/conversations", `{"model":"m1"`, http.StatusBadRequest},
		{http.MethodPost, "/api/v1/conversations", `{"model":"m1","model":"m1"}`, http.StatusBadRequest},
		{http.MethodPost, "/api/v1/conversations", strings.Repeat("[", 5000), http.StatusBadRequest},
		{http.MethodPost, "/api/v1/conversations/" + conv + "/messages", string(huge), http.StatusRequestEntityTooLarge},
		{http.MethodPost, "/api/v1/conversations/" + conv + "/messages", `{"content":"  "}`, http.StatusBadRequest},
		{http.MethodPost, "/api/v1/conversations/" + conv + "/messages", `{"content":["x"]}`, http.StatusBadRequest},
		{http.MethodPatch, "/api/v1/conversations/" + conv, string(longTitle), http.StatusBadRequest},
		{http.MethodGet, "/api/v1/conversations?cursor=%%%", "", http.StatusBadRequest},
		{http.MethodGet, "/api/v1/conversations?q=" + strings.Repeat("%25", 201), "", http.StatusBadRequest},
		{http.MethodGet, "/api/v1/conversations/" + conv + "/export?format=pdf", "", http.StatusBadRequest},
		{http.MethodGet, "/api/v1/generations/inf_nope/events", "", http.StatusNotFound},
	} {
		status, body := p.do(r.method, r.path, r.body)
		if status != r.want || !strings.Contains(body, `"error":{"message"`) {
			t.Errorf("%s %s %.40q: %d %s, want %d", r.method, r.path, r.body, status, body, r.want)
		}
	}
	// LIKE's wildcards in a search are plain characters: they match nothing here.
	if status, body := p.do(http.MethodGet, "/api/v1/conversations?q=%25", ""); status != http.StatusOK || !strings.Contains(body, `"data":[]`) {
		t.Errorf("q=%%: %d %s", status, body)
	}
	// None of it left a message.
	if c := p.conversation(conv); len(c.Messages) != 0 {
		t.Errorf("messages %+v", c.Messages)
	}
}

// Rename, list (newest first, pages, title search), export and delete.
func TestChatConversationLifecycle(t *testing.T) {
	// 53 conversations at once: past the default per-minute limit.
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db", func(c *config.Config) { c.Limits.ConversationsPerMinute = 1000 })
	p := e.chatter("ivy@example.com")
	e.mockBody(map[string]any{"tokens": 3})
	var ids []string
	for i := range 53 {
		id := p.newConversation()
		if status, body := p.do(http.MethodPatch, "/api/v1/conversations/"+id, `{"title":"Chat `+strconv.Itoa(i)+`"}`); status != http.StatusOK {
			t.Fatalf("rename: %d %s", status, body)
		}
		ids = append(ids, id)
	}
	type page struct {
		Data       []struct{ ID, Title string }
		NextCursor *string `json:"next_cursor"`
	}
	var first, second page
	_, body := p.do(http.MethodGet, "/api/v1/conversations", "")
	_ = json.Unmarshal([]byte(body), &first)
	if len(first.Data) != 50 || first.NextCursor == nil || first.Data[0].ID != ids[52] {
		t.Fatalf("first page: %d, cursor %v, first %+v", len(first.Data), first.NextCursor, first.Data[0])
	}
	_, body = p.do(http.MethodGet, "/api/v1/conversations?cursor="+*first.NextCursor, "")
	_ = json.Unmarshal([]byte(body), &second)
	if len(second.Data) != 3 || second.NextCursor != nil || second.Data[2].ID != ids[0] {
		t.Fatalf("second page: %s", body)
	}
	var found page
	_, body = p.do(http.MethodGet, "/api/v1/conversations?q=CHAT%2052", "")
	_ = json.Unmarshal([]byte(body), &found)
	if len(found.Data) != 1 || found.Data[0].ID != ids[52] {
		t.Fatalf("search: %s", body)
	}

	conv := ids[0]
	p.send(conv, "Export me")
	p.reply(conv)
	req, _ := http.NewRequest(http.MethodGet, e.URL+"/api/v1/conversations/"+conv+"/export?format=json", nil)
	resp, err := p.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	exported := readAll(t, resp.Body)
	resp.Body.Close()
	if cd := resp.Header.Get("Content-Disposition"); !strings.HasPrefix(cd, "attachment;") || !strings.Contains(exported, "Export me") {
		t.Errorf("export: %q %s", cd, exported)
	}
	status, md := p.do(http.MethodGet, "/api/v1/conversations/"+conv+"/export?format=md", "")
	if status != http.StatusOK || !strings.Contains(md, "# Chat 0") || !strings.Contains(md, "Export me") {
		t.Errorf("markdown export: %d %s", status, md)
	}
	if status, _ := p.do(http.MethodDelete, "/api/v1/conversations/"+conv, ""); status != http.StatusNoContent {
		t.Fatalf("delete: %d", status)
	}
	if status, _ := p.do(http.MethodGet, "/api/v1/conversations/"+conv, ""); status != http.StatusNotFound {
		t.Errorf("deleted conversation: %d", status)
	}
	var n int64
	e.DB.Model(&models.Message{}).Where("conversation_id = ?", conv).Count(&n)
	if n != 0 {
		t.Errorf("%d messages left", n)
	}
}

// Deleting a conversation stops its running reply first.
func TestChatDeleteStopsReply(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	p := e.chatter("jo@example.com")
	e.mockBody(map[string]any{"tokens": 500, "tps": 20, "tag": "deleted"})
	conv := p.newConversation()
	s := p.send(conv, "long")
	if _, err := e.Mock.WaitFor(context.Background(), "deleted", func(r mockllm.Record) bool { return r.ChunksSent > 0 }); err != nil {
		t.Fatal(err)
	}
	if status, body := p.do(http.MethodDelete, "/api/v1/conversations/"+conv, ""); status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", status, body)
	}
	if row := e.final(s.InferenceID); row.Outcome != models.OutcomeStopped {
		t.Errorf("usage row %+v", row)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := e.Mock.WaitFor(ctx, "deleted", func(r mockllm.Record) bool { return r.Cancelled }); err != nil {
		t.Errorf("engine not cancelled: %v", err)
	}
}

// A reply running on another replica is followed through the database:
// heartbeats meanwhile, done once its message has finished there.
func TestChatFollowsReplyOfAnotherReplica(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	p := e.chatter("kim@example.com")
	_, who := e.me(p.c)
	conv := &models.Conversation{ID: models.NewConversationID(), UserID: who.ID, Model: "m1"}
	if err := models.CreateConversation(context.Background(), e.DB, conv); err != nil {
		t.Fatal(err)
	}
	_ = models.Heartbeat(context.Background(), e.DB, "sibling", time.Now())
	inf, msgID := "inf_elsewhere", models.NewMessageID()
	e.DB.Create(&models.Message{ID: msgID, ConversationID: conv.ID, Role: "assistant", Status: models.MessageStreaming,
		InferenceID: &inf, Replica: "sibling"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch, resp := p.follow(ctx, inf, "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("events: %d", resp.StatusCode)
	}
	time.Sleep(300 * time.Millisecond)
	if err := models.FinishMessage(context.Background(), e.DB, msgID, models.MessageEnd{Status: models.MessageDone, Content: "from <there> **in Markdown**"}); err != nil {
		t.Fatal(err)
	}
	evs := drain(ch)
	checkStream(t, evs, 1, "done")
	// Rendered as Markdown on the server; HTML in it shown as text.
	if d := evs[len(evs)-1].Data; !strings.Contains(d, "from &lt;there&gt;") || !strings.Contains(d, "<strong>in Markdown</strong>") {
		t.Errorf("done %q", evs[len(evs)-1].Data)
	}
	// Someone else cannot follow it.
	other := e.chatter("lou@example.com")
	if _, resp := other.follow(ctx, inf, ""); resp.StatusCode != http.StatusNotFound {
		t.Errorf("other person: %d", resp.StatusCode)
	}
}

// An event stream lives as long as its generation, however short the
// stream_write_timeout: that limit is about a /v1 client that stops
// reading, not about the age of a response (a server-wide WriteTimeout
// once cut every event stream at that age).
func TestChatEventStreamOutlivesTheWriteTimeout(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db", func(c *config.Config) { c.StreamWriteTimeout = 300 * time.Millisecond })
	p := e.chatter("long@example.com")
	e.mockBody(map[string]any{"tokens": 12, "tps": 8}) // about 1.5 s
	s := p.send(p.newConversation(), "take your time")
	evs := p.events(s.InferenceID, "")
	checkStream(t, evs, 1, "done")
	if n := len(evs); n != 13 {
		t.Errorf("%d events, want 12 chunks and done", n)
	}
}

// A busy database does not pause a reply: partial saves run beside the
// reading, so viewers keep getting chunks while every write waits, and
// the reply is saved whole once the database is free again.
func TestChatReplyGoesOnWhileTheDatabaseIsBusy(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	p := e.chatter("wes@example.com")
	e.mockBody(map[string]any{"tokens": 150, "tps": 30})
	conv := p.newConversation()
	s := p.send(conv, "keep going")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ch, resp := p.follow(ctx, s.InferenceID, "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("events: %d", resp.StatusCode)
	}
	for first := false; !first; {
		ev := <-ch
		first = ev.Event == "chunk"
	}
	// Take SQLite's write lock (transactions begin IMMEDIATE) for 3 s.
	tx := e.DB.Begin()
	if tx.Error != nil {
		t.Fatal(tx.Error)
	}
	if err := tx.Exec("UPDATE replicas SET seen_at = seen_at").Error; err != nil {
		t.Fatal(err)
	}
	locked := time.After(3 * time.Second)
	got := 0
	for waiting := true; waiting; {
		select {
		case ev := <-ch:
			if ev.Event == "chunk" {
				got++
			}
		case <-locked:
			waiting = false
		}
	}
	tx.Rollback()
	// 30 tokens/s for 3 s: about 90 chunks; a reply that waited for its
	// save would have delivered only those of the second before that save.
	if got < 60 {
		t.Errorf("%d chunks while the database was busy", got)
	}
	drain(ch)
	if r := p.reply(conv); r.Status != models.MessageDone || r.Content != mockllm.CompletionText("keep going", 150) {
		t.Errorf("saved %s %q", r.Status, r.Content)
	}
}
