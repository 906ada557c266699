package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"moonji/internal/config"
	"moonji/models"
)

// sendStatus sends a message and returns the answer's status, body and
// Retry-After (unlike send, it accepts a refusal).
func (p *chatter) sendStatus(conv, content string) (int, string, string) {
	p.e.t.Helper()
	b, _ := json.Marshal(map[string]string{"content": content})
	req, _ := http.NewRequest(http.MethodPost, p.e.URL+"/api/v1/conversations/"+conv+"/messages", strings.NewReader(string(b)))
	req.Header.Set("X-CSRF-Token", p.csrf)
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.c.Do(req)
	if err != nil {
		p.e.t.Fatalf("send: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), resp.Header.Get("Retry-After")
}

// rowsWithReason counts the ledger's rows of reason.
func (e *testEnv) rowsWithReason(reason string) int64 {
	e.t.Helper()
	_ = e.srv.Ledger.Flush(context.Background())
	var n int64
	if err := e.DB.Model(&models.Usage{}).Where("reason = ?", reason).Count(&n).Error; err != nil {
		e.t.Fatal(err)
	}
	return n
}

// TestOnePersonCannotTakeEveryonesQueue: the reviewer's attack — one
// person sends 20 messages in 20 conversations at once — used to run 4,
// queue 8 and fail the rest, and the next person's message failed with
// "queue full". Now the person gets chat_generations_per_person (4) replies
// and a 429 too_many_generations for each other one, before it takes a
// slot or a queue place (the engine sees 4), each refused reply saved as
// that error beside its message, one rejected row each; the next person is
// served. The greedy replies last until the test stops them, so a slow
// machine spreading the 20 sends over seconds cannot let a fifth in.
func TestOnePersonCannotTakeEveryonesQueue(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db string) {
		e := startEnv(t, db, func(c *config.Config) {
			c.Backends[0].MaxConcurrency, c.Backends[0].MaxQueue = 5, 4
		})
		e.mockBody(map[string]any{"tokens": 2000, "tps": 20}) // until stopped
		greedy, next := e.chatter("greedy@example.com"), e.chatter("next@example.com")
		convs := make([]string, 20)
		for i := range convs {
			convs[i] = greedy.newConversation()
		}
		type answer struct {
			status           int
			body, retryAfter string
		}
		answers := make([]answer, len(convs))
		var wg sync.WaitGroup
		for i, conv := range convs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st, body, ra := greedy.sendStatus(conv, fmt.Sprintf("message %d", i))
				answers[i] = answer{st, body, ra}
			}()
		}
		wg.Wait()
		accepted, refused := 0, 0
		var refusedConvs, acceptedConvs, running []string
		for i, a := range answers {
			switch {
			case a.status == http.StatusAccepted:
				accepted++
				acceptedConvs = append(acceptedConvs, convs[i])
				running = append(running, gjson.Get(a.body, "inference_id").Str)
			case a.status == http.StatusTooManyRequests && gjson.Get(a.body, "error.code").Str == "too_many_generations" && a.retryAfter != "":
				refused++
				refusedConvs = append(refusedConvs, convs[i])
			default:
				t.Errorf("send %d: %d %s (Retry-After %q)", i, a.status, a.body, a.retryAfter)
			}
		}
		if accepted != 4 || refused != 16 {
			t.Fatalf("%d accepted and %d refused, want 4 and 16", accepted, refused)
		}
		// A refused reply is in its conversation, after the person's
		// message, as the error it was.
		for _, conv := range refusedConvs {
			c := greedy.conversation(conv)
			if len(c.Messages) != 2 || c.Messages[0].Role != "user" || c.Messages[1].Status != models.MessageError ||
				!strings.Contains(c.Messages[1].Reason, "4 answers being written") {
				t.Fatalf("refused conversation %+v", c.Messages)
			}
		}
		// The composer shows the person's message and the refused reply,
		// like any failed answer.
		resp, page := e.fetch(greedy.c, http.MethodPost, "/chat", url.Values{"conversation": {refusedConvs[1]}, "content": {"once more"},
			"_csrf": {greedy.csrf}}, map[string]string{"HX-Request": "true", "X-CSRF-Token": greedy.csrf})
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Retry-After") == "" || !strings.Contains(page, "once more") ||
			!strings.Contains(page, "4 answers being written") {
			t.Errorf("the composer past the limit: %d\n%s", resp.StatusCode, page)
		}
		if n := e.rowsWithReason("too_many_generations"); n != 17 {
			t.Errorf("%d rows too_many_generations, want 17", n)
		}
		// The next person is served, while the greedy one's replies run.
		e.mockBody(map[string]any{"tokens": 4})
		nc := next.newConversation()
		next.send(nc, "my turn")
		if m := next.reply(nc); m.Status != models.MessageDone {
			t.Errorf("the next person's reply: %+v", m)
		}
		if n := len(e.Mock.Requests()); n != 5 {
			t.Errorf("the engine got %d requests, want 4 + 1", n)
		}
		// Once the four have ended, the greedy person may send again.
		for _, id := range running {
			if st, body := greedy.do(http.MethodPost, "/api/v1/inference/stop", `{"inference_id":"`+id+`"}`); st != http.StatusOK {
				t.Fatalf("stop %s: %d %s", id, st, body)
			}
		}
		for _, conv := range acceptedConvs {
			if m := greedy.reply(conv); m.Status == models.MessageStreaming {
				t.Fatalf("a stopped reply still streams: %+v", m)
			}
		}
		if st, body, _ := greedy.sendStatus(refusedConvs[0], "again"); st != http.StatusAccepted {
			t.Errorf("after the four ended: %d %s", st, body)
		}
	})
}

// TestEventStreamsPerPersonAreCapped: one session opened 400 event streams
// on one reply (3 goroutines each). Now a person holds at most
// event_streams_per_person (16) on a replica; past it 429 too_many_streams
// with Retry-After, and a closed stream frees its place.
func TestEventStreamsPerPersonAreCapped(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db")
	e.mockBody(map[string]any{"tokens": 2000, "tps": 20})
	p := e.chatter("viewer@example.com")
	s := p.send(p.newConversation(), "a long one")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var open []context.CancelFunc
	for i := range 16 {
		sctx, scancel := context.WithCancel(ctx)
		if _, resp := p.follow(sctx, s.InferenceID, ""); resp.StatusCode != http.StatusOK {
			t.Fatalf("stream %d: %d", i+1, resp.StatusCode)
		}
		open = append(open, scancel)
	}
	for range 4 {
		_, resp := p.follow(ctx, s.InferenceID, "")
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("stream 17: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
	// Someone else is not bound by this person's streams.
	other := e.chatter("other@example.com")
	theirs := other.send(other.newConversation(), "hi")
	if _, resp := other.follow(ctx, theirs.InferenceID, ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("another person's stream: %d", resp.StatusCode)
	}
	// A stream closed by its viewer gives its place back.
	open[0]()
	waitFor(t, "a closed stream's place to come back", 20*time.Second, func() bool {
		_, resp := p.follow(ctx, s.InferenceID, "")
		return resp.StatusCode == http.StatusOK
	})
	// Stop the reply so that the streams end.
	if st, body := p.do(http.MethodPost, "/api/v1/inference/stop", `{"inference_id":"`+s.InferenceID+`"}`); st != http.StatusOK {
		t.Fatalf("stop: %d %s", st, body)
	}
}

// TestConversationCreationIsLimited: 500 conversations in 0.7 s were
// counted by nothing. Now creation counts against conversations_per_minute
// and conversations_per_person: 429 too_many_conversations with
// Retry-After past either, through the API and the composer.
func TestConversationCreationIsLimited(t *testing.T) {
	t.Run("per minute", func(t *testing.T) {
		e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db")
		p := e.chatter("maker@example.com")
		create := func() int {
			st, body := p.do(http.MethodPost, "/api/v1/conversations", `{"model":"m1"}`)
			if st != http.StatusCreated && (st != http.StatusTooManyRequests || gjson.Get(body, "error.code").Str != "too_many_conversations") {
				t.Fatalf("a conversation: %d %s", st, body)
			}
			return st
		}
		// 30 a minute come back one every 2 s: a burst that a busy machine
		// stretches past that gets one more for each 2 s it took.
		start, made := time.Now(), 0
		for range 40 {
			if create() == http.StatusCreated {
				made++
			}
		}
		want := config.DefaultLimits.ConversationsPerMinute
		if came := int(time.Since(start) / (2 * time.Second)); made < want || made > want+came {
			t.Fatalf("%d conversations made in a burst of %v, want %d", made, time.Since(start), want)
		}
		// The composer says so too, above itself, right after the API has
		// refused one.
		for create() == http.StatusCreated { // one came back meanwhile
		}
		resp, body := e.fetch(p.c, http.MethodPost, "/chat", url.Values{"model": {"m1"}, "content": {"hi"}, "_csrf": {p.csrf}},
			map[string]string{"HX-Request": "true", "X-CSRF-Token": p.csrf})
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, "conversations in the last minute") {
			t.Errorf("composer past the limit: %d\n%s", resp.StatusCode, body)
		}
		// Another person is not bound by it.
		if st, _ := e.chatter("else@example.com").do(http.MethodPost, "/api/v1/conversations", `{"model":"m1"}`); st != http.StatusCreated {
			t.Errorf("another person: %d", st)
		}
	})
	t.Run("per person", func(t *testing.T) {
		e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", func(c *config.Config) {
			c.Limits.ConversationsPerPerson, c.Limits.ConversationsPerMinute = 5, 1000
		})
		p := e.chatter("keeper@example.com")
		for range 5 {
			p.newConversation()
		}
		req, _ := http.NewRequest(http.MethodPost, e.URL+"/api/v1/conversations", strings.NewReader(`{"model":"m1"}`))
		req.Header.Set("X-CSRF-Token", p.csrf)
		resp, err := p.c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body := readAll(t, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests || gjson.Get(body, "error.code").Str != "too_many_conversations" ||
			resp.Header.Get("Retry-After") == "" || !strings.Contains(body, "delete some") {
			t.Fatalf("sixth conversation: %d %s", resp.StatusCode, body)
		}
	})
}

// TestSearchesAreRateLimited: a person's history searches count against
// searches_per_minute (the list without a query, which every page draws,
// does not): 429 too_many_searches with Retry-After, on the API and the
// history page.
func TestSearchesAreRateLimited(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", func(c *config.Config) { c.Limits.SearchesPerMinute = 5 })
	p := e.chatter("seeker@example.com")
	for i := range 5 {
		if st, body := p.do(http.MethodGet, "/api/v1/conversations?q=story", ""); st != http.StatusOK {
			t.Fatalf("search %d: %d %s", i+1, st, body)
		}
	}
	for range 3 {
		if st, body := p.do(http.MethodGet, "/api/v1/conversations", ""); st != http.StatusOK {
			t.Fatalf("the plain list past the search limit: %d %s", st, body)
		}
	}
	st, body := p.do(http.MethodGet, "/api/v1/conversations?q=story", "")
	if st != http.StatusTooManyRequests || gjson.Get(body, "error.code").Str != "too_many_searches" {
		t.Fatalf("sixth search: %d %s", st, body)
	}
	resp, page := e.fetch(p.c, http.MethodGet, "/history?q=story", nil, nil)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || !strings.Contains(page, "You searched 5 times") {
		t.Fatalf("history page past the limit: %d", resp.StatusCode)
	}
	if st, _ := e.chatter("other@example.com").do(http.MethodGet, "/api/v1/conversations?q=story", ""); st != http.StatusOK {
		t.Errorf("another person's search: %d", st)
	}
}

// TestDisablingEndsWhatThePersonHolds: a person disabled by an admin kept
// their open event streams (61 events in the next 6 s) and their running
// replies finished. Now, on the replica that disabled them, their event
// stream ends, their running and queued replies and their /v1 stream are
// cancelled (rows cancelled, person_disabled) within a second; on another
// replica within the key cache's time (5 s).
func TestDisablingEndsWhatThePersonHolds(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db string) {
		a := startEnv(t, db, func(c *config.Config) { c.Backends[0].MaxConcurrency = 2 })
		b := startEnv(t, db)
		for _, e := range []*testEnv{a, b} {
			e.mockBody(map[string]any{"tokens": 4000, "tps": 20}) // minutes
		}
		pa := a.chatter("leaver@example.com")
		pb := &chatter{e: b, c: pa.c, csrf: pa.csrf} // the same session, on the other replica
		boss := a.signedIn("boss@example.com", true)
		bossToken := mustMe(a, boss).CSRFToken
		key := a.newKey("leaver@example.com", 0)
		leaver, _ := models.UserByEmail(context.Background(), a.DB, "leaver@example.com")

		// On A: a /v1 stream and a reply running (A's two slots), a second
		// reply queued behind them, the running reply followed live.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		v1 := a.postWith(ctx, key, `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tokens":4000,"tps":20}}`)
		v1Lines := make(chan string, 1)
		go func() {
			b, _ := io.ReadAll(v1.Body)
			v1Lines <- string(b)
		}()
		running := pa.send(pa.newConversation(), "running")
		waitFor(t, "the reply to run on A", 10*time.Second, func() bool { return a.srv.Gateway.Backends()[0].InFlight == 2 })
		queued := pa.send(pa.newConversation(), "queued")
		waitFor(t, "the reply to queue on A", 10*time.Second, func() bool { return a.srv.Gateway.Backends()[0].Queued == 1 })
		evA, resp := pa.follow(ctx, running.InferenceID, "")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("events on A: %d", resp.StatusCode)
		}
		// On B: a reply running, followed live.
		elsewhere := pb.send(pb.newConversation(), "elsewhere")
		evB, resp := pb.follow(ctx, elsewhere.InferenceID, "")
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("events on B: %d", resp.StatusCode)
		}
		<-evA // both streams are live
		<-evB

		disabled := time.Now()
		if resp, body := a.fetch(boss, http.MethodPost, personPath(leaver.ID, "disable"), url.Values{"_csrf": {bossToken}}, nil); resp.StatusCode != 200 {
			t.Fatalf("disable: %d %s", resp.StatusCode, body)
		}
		ended := func(ch <-chan sseEvent) time.Duration {
			timeout := time.After(20 * time.Second)
			for {
				select {
				case _, open := <-ch:
					if !open {
						return time.Since(disabled)
					}
				case <-timeout:
					return 20 * time.Second
				}
			}
		}
		// A second, with room for a busy machine.
		if d := ended(evA); d > 3*time.Second {
			t.Errorf("the event stream on A ended %v after the disable", d)
		}
		select {
		case body := <-v1Lines:
			if !strings.Contains(body, `"code":"person_disabled"`) {
				t.Errorf("the /v1 stream ended without saying why:\n%s", tail(body))
			}
		case <-time.After(3 * time.Second):
			t.Errorf("the /v1 stream still runs 3 s after the disable")
			cancel()
		}
		// The key cache's time (5 s), with room for a busy machine.
		if d := ended(evB); d > 12*time.Second {
			t.Errorf("the event stream on B ended %v after the disable", d)
		}
		for _, c := range []struct {
			e  *testEnv
			id string
		}{{a, v1.Header.Get("X-Inference-Id")}, {a, running.InferenceID}, {a, queued.InferenceID}, {b, elsewhere.InferenceID}} {
			row := c.e.final(c.id)
			if row.Outcome != models.OutcomeCancelled || row.Reason != "person_disabled" {
				t.Errorf("row of %s: %s/%s, want cancelled/person_disabled", c.id, row.Outcome, row.Reason)
			}
		}
		for _, id := range []string{running.InferenceID, queued.InferenceID, elsewhere.InferenceID} {
			m, _, err := models.MessageByInference(context.Background(), a.DB, id)
			if err != nil || m.Status != models.MessageError || !strings.Contains(m.Reason, "withdrawn") {
				t.Errorf("reply %s: %v", id, err)
				if m != nil {
					t.Errorf("reply %s: %s (%s)", id, m.Status, m.Reason)
				}
			}
		}
		if n := a.srv.Gateway.Backends()[0].InFlight; n != 0 {
			t.Errorf("A still holds %d slots", n)
		}
	})
}
