package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/coder/websocket"
	"github.com/tidwall/gjson"

	"moonji/internal/engine"
	"moonji/internal/enginelink/protocol"
	"moonji/internal/mockllm"
)

// A streamed answer reaches the gateway frame by frame, each byte as the
// upstream wrote it, in seq order, then chat.done with the finish reason
// and the usage its last chunk carried.
func TestStreamIsRelayedByteForByte(t *testing.T) {
	e := startEnv(t)
	c := e.dial(t, nil)
	body := chatBody("m1", true, map[string]any{"replay": "chat_stream.sse"})
	resp, want := e.direct(t, body)
	file, err := os.ReadFile(filepath.Join(fixtures, "chat_stream.sse"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(want, file) {
		t.Fatal("mockllm's replay differs from its recording: the comparison below would prove nothing")
	}
	c.open("s1", "m1", body)
	a := c.collect([]string{"s1"}, nil)["s1"]
	if a.response == nil || a.response.Status != 200 || !a.response.Stream || a.response.ContentType != resp.Header.Get("Content-Type") {
		t.Fatalf("chat.response = %+v, want 200 %q streamed", a.response, resp.Header.Get("Content-Type"))
	}
	if got := a.frames(t); !bytes.Equal(got, want) {
		t.Fatalf("relayed stream differs from mockllm's:\n got %.300q\nwant %.300q", got, want)
	}
	for i, ch := range a.chunks {
		if strings.Count(ch.Frame, "data:") != 1 || !strings.HasSuffix(ch.Frame, "\n\n") {
			t.Fatalf("chunk %d is not one whole frame: %q", i+1, ch.Frame)
		}
	}
	if a.done == nil || a.done.FinishReason != "length" || a.done.Usage == nil ||
		*a.done.Usage != (protocol.Usage{PromptTokens: 5, CompletionTokens: 64}) {
		t.Fatalf("chat.done = %+v (usage %+v), want length with 5+64 tokens", a.done, a.done.Usage)
	}
}

// mockllm's own generated stream, too: identical to a direct call's but for
// the random completion id and the created second (the two calls may fall
// on either side of a second's turn).
func TestGeneratedStreamMatchesDirectCall(t *testing.T) {
	e := startEnv(t)
	c := e.dial(t, nil)
	// A whole sentence, so that the answer finishes "stop".
	n := mockllm.SentenceLength("Tell me a story.", 12)
	body := chatBody("m1", true, map[string]any{"tokens": n})
	_, want := e.direct(t, body)
	c.open("s1", "m1", body)
	a := c.collect([]string{"s1"}, nil)["s1"]
	ids := regexp.MustCompile(`chatcmpl-[0-9a-f]+`)
	created := regexp.MustCompile(`"created":[0-9]+`)
	same := func(b []byte) string {
		return created.ReplaceAllString(ids.ReplaceAllString(string(b), "ID"), `"created":0`)
	}
	got := a.frames(t)
	if same(got) != same(want) {
		t.Fatalf("relayed stream differs from a direct call's:\n got %q\nwant %q", got, want)
	}
	if a.done == nil || a.done.FinishReason != "stop" || a.done.Usage == nil || a.done.Usage.CompletionTokens != n {
		t.Fatalf("chat.done = %+v", a.done)
	}
}

// The body reaches the upstream exactly as the gateway sent it, but for
// the model renamed to the configured upstream name.
func TestBodyPassesThroughWithTheModelRenamed(t *testing.T) {
	e := startEnv(t)
	c := e.dial(t, nil)
	body := `{"model":"renamed","stream":false,"top_p":null,"x_unknown":{"a":[1,2]},"messages":[{"role":"user","content":"hi <&>"}],"mock":{"tag":"r1","tokens":3}}`
	c.open("s1", "renamed", body)
	a := c.collect([]string{"s1"}, nil)["s1"]
	if a.response == nil || a.response.Status != 200 {
		t.Fatalf("answer = %+v", a)
	}
	rec := e.mock.Requests()[0]
	if want := strings.Replace(body, `"model":"renamed"`, `"model":"upstream-name"`, 1); string(rec.Body) != want {
		t.Fatalf("upstream got %s\nwant %s", rec.Body, want)
	}
}

// A non-streamed answer, and an upstream's error answer, arrive whole with
// their status, content type and body exactly as the upstream sent them.
func TestWholeAnswersAreExact(t *testing.T) {
	e := startEnv(t)
	c := e.dial(t, nil)
	for i, mock := range []map[string]any{{"replay": "chat_nonstream.json"}, {"fail_status": 503, "fail_message": "busy <now> & \"later\""}} {
		body := chatBody("m1", false, mock)
		resp, want := e.direct(t, body)
		s := fmt.Sprintf("w%d", i)
		c.open(s, "m1", body)
		a := c.collect([]string{s}, nil)[s]
		r := a.response
		if r == nil || r.Stream || r.Status != resp.StatusCode || r.ContentType != resp.Header.Get("Content-Type") || r.Body != string(want) {
			t.Fatalf("%v: chat.response = %+v\nwant %d %q %q", mock, r, resp.StatusCode, resp.Header.Get("Content-Type"), want)
		}
	}
}

// 100 sessions at once on one connection: each gets its own answer and
// nothing else (its own completion id, its own length, seq from 1).
func TestManySessionsOnOneConnection(t *testing.T) {
	e := startEnv(t)
	c := e.dial(t, nil)
	const n = 100
	var names []string
	for i := range n {
		s := fmt.Sprintf("s%d", i)
		names = append(names, s)
		c.open(s, "m1", chatBody("m1", true, map[string]any{"tokens": 3 + i%10, "tps": 200}))
	}
	answers := c.collect(names, nil)
	seen := map[string]string{}
	for i, s := range names {
		a := answers[s]
		frames := a.frames(t)
		if a.done == nil || a.done.Usage == nil || a.done.Usage.CompletionTokens != 3+i%10 {
			t.Fatalf("%s: done %+v err %+v", s, a.done, a.err)
		}
		// role chunk, the tokens, the finish chunk, the usage chunk, [DONE]
		if len(a.chunks) != 3+i%10+4 {
			t.Fatalf("%s: %d chunks for %d tokens", s, len(a.chunks), 3+i%10)
		}
		var id string
		for _, ch := range a.chunks[:len(a.chunks)-1] {
			got := gjson.Get(strings.TrimPrefix(ch.Frame, "data: "), "id").Str
			if id == "" {
				id = got
			}
			if got != id {
				t.Fatalf("%s got a frame of completion %s among %s's", s, got, id)
			}
		}
		if other, dup := seen[id]; dup || id == "" {
			t.Fatalf("%s and %s share completion %q", s, other, id)
		}
		seen[id] = s
		if !bytes.HasSuffix(frames, []byte("data: [DONE]\n\n")) || a.after != 0 {
			t.Fatalf("%s: stream ends %q, %d envelopes after its end", s, frames[max(len(frames)-40, 0):], a.after)
		}
	}
}

// session.cancel cancels the upstream request at once, and no chunk of the
// session leaves after the cancel was read (a barrier — an envelope sent
// after it, answered in order — shows when that was).
func TestCancelStopsTheUpstreamAndTheChunks(t *testing.T) {
	e := startEnv(t)
	c := e.dial(t, nil)
	c.open("c1", "m1", chatBody("m1", true, map[string]any{"tag": "c1", "tokens": 400, "tps": 40}))
	chunks := 0
	for chunks < 3 {
		env := c.next()
		if env.Type == protocol.TypeChatChunk {
			chunks++
		}
	}
	c.send(protocol.TypeSessionCancel, "c1", protocol.SessionCancel{Reason: "stop_requested"})
	barrier := func(id string) {
		c.raw(websocket.MessageText, []byte(`{"v":1,"id":"`+id+`","type":"no.such.type"}`))
		for {
			env := c.next()
			if env.Type == protocol.TypeError && must(protocol.Payload[protocol.Error](env)).Ref == id {
				return
			}
			if env.Session != "c1" || env.Type != protocol.TypeChatChunk {
				t.Fatalf("before barrier %s: unexpected %s for %q", id, env.Type, env.Session)
			}
		}
	}
	barrier("barrier-1")
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	rec, err := e.mock.WaitFor(ctx, "c1", func(r mockllm.Record) bool { return r.Cancelled })
	if err != nil {
		t.Fatal(err)
	}
	if rec.ChunksSent >= 400 {
		t.Fatalf("the upstream sent all %d chunks", rec.ChunksSent)
	}
	// Whatever the upstream wrote before it noticed, nothing more came.
	c.raw(websocket.MessageText, []byte(`{"v":1,"id":"barrier-2","type":"no.such.type"}`))
	env := c.next()
	if p := must(protocol.Payload[protocol.Error](env)); env.Type != protocol.TypeError || p.Ref != "barrier-2" {
		t.Fatalf("after the cancel: %s for %q", env.Type, env.Session)
	}
}

// Invalid envelopes are answered with `error` naming them, and the
// connection goes on serving the session running meanwhile.
func TestInvalidEnvelopesDoNotDisturbOtherSessions(t *testing.T) {
	e := startEnv(t)
	c := e.dial(t, nil)
	c.open("ok", "m1", chatBody("m1", true, map[string]any{"tokens": 30, "tps": 60}))
	type refusal struct{ ref, code string }
	var want []refusal
	bad := func(data string, ref, code string) {
		c.raw(websocket.MessageText, []byte(data))
		want = append(want, refusal{ref, code})
	}
	bad(`{"v":1,`, "", protocol.CodeInvalid)
	bad(`{"v":2,"id":"x2","type":"session.close","session":"ok"}`, "x2", protocol.CodeVersion)
	bad(`{"v":1,"id":"x3","type":"chat.tool","session":"ok"}`, "x3", protocol.CodeInvalid)
	bad(`{"v":1,"id":"x4","type":"chat.request","session":"ghost","payload":{"body":"{}"}}`, "x4", protocol.CodeUnknownSession)
	bad(`{"v":1,"id":"x5","type":"session.open","session":"ok","payload":{"model":"m1"}}`, "x5", protocol.CodeInvalid)
	bad(`{"v":1,"id":"x6","type":"chat.chunk","session":"ok","payload":{"seq":1,"frame":"data: x\n\n"}}`, "x6", protocol.CodeInvalid)
	bad(`{"v":1,"id":"x7","type":"chat.request","session":"ok","payload":{"body":"{}"}}`, "x7", protocol.CodeInvalid)
	bad(`{"v":1,"id":"x8","type":"session.cancel","session":"ghost"}`, "x8", protocol.CodeUnknownSession)
	c.raw(websocket.MessageBinary, []byte("\x00\x01"))
	want = append(want, refusal{"", protocol.CodeInvalid})
	var got []refusal
	a := c.collect([]string{"ok"}, func(env protocol.Envelope) {
		if env.Type != protocol.TypeError {
			t.Fatalf("unexpected %s", env.Type)
		}
		p := must(protocol.Payload[protocol.Error](env))
		got = append(got, refusal{p.Ref, p.Code})
	})["ok"]
	for len(got) < len(want) {
		env := c.next()
		p := must(protocol.Payload[protocol.Error](env))
		got = append(got, refusal{p.Ref, p.Code})
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("refusals %v, want %v", got, want)
	}
	if a.done == nil || len(a.chunks) != 30+4 || a.after != 0 {
		t.Fatalf("the running session: %d chunks, done %+v, err %+v", len(a.chunks), a.done, a.err)
	}
	a.frames(t) // seq unbroken
	// And a new session still works.
	c.open("later", "m1", chatBody("m1", true, map[string]any{"tokens": 2}))
	if a := c.collect([]string{"later"}, nil)["later"]; a.done == nil {
		t.Fatalf("a later session: %+v", a.err)
	}
}

// An unknown model is chat.error 404 in OpenAI's words, and no session.
func TestUnknownModel(t *testing.T) {
	e := startEnv(t)
	c := e.dial(t, nil)
	c.open("u1", "nope", chatBody("nope", false, nil))
	env := c.next()
	p := must(protocol.Payload[protocol.ChatError](env))
	if env.Type != protocol.TypeChatError || env.Session != "u1" || p.Status != 404 || p.Message != "The model `nope` does not exist." {
		t.Fatalf("got %s %+v", env.Type, p)
	}
	env = c.next() // the chat.request that followed
	if q := must(protocol.Payload[protocol.Error](env)); env.Type != protocol.TypeError || q.Code != protocol.CodeUnknownSession {
		t.Fatalf("the request of a refused session: %s %+v", env.Type, q)
	}
}

// No upstream answers: 502; an upstream slower than the model's timeout:
// 504 (and the upstream request is cancelled).
func TestUpstreamFailures(t *testing.T) {
	e := startEnv(t)
	c := e.dial(t, nil)
	c.open("d1", "down", chatBody("down", true, nil))
	c.open("t1", "slow", chatBody("slow", true, map[string]any{"tag": "t1", "hang": true}))
	got := c.collect([]string{"d1", "t1"}, nil)
	if a := got["d1"]; a.err == nil || a.err.Status != 502 || a.response != nil {
		t.Fatalf("unreachable upstream: %+v %+v", a.err, a.response)
	}
	if a := got["t1"]; a.err == nil || a.err.Status != 504 || a.response != nil {
		t.Fatalf("timed-out upstream: %+v %+v", a.err, a.response)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if _, err := e.mock.WaitFor(ctx, "t1", func(r mockllm.Record) bool { return r.Cancelled }); err != nil {
		t.Fatal(err)
	}
}

// The upgrade needs the token when one is set (401 otherwise) and the
// protocol's version (426 otherwise, naming the versions spoken).
func TestHandshakeRefusals(t *testing.T) {
	e := startEnv(t, func(o *engine.Options) { o.Token = "s3cret" })
	dial := func(protos []string, token string) (int, string) {
		t.Helper()
		h := http.Header{}
		if token != "" {
			h.Set("Authorization", "Bearer "+token)
		}
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		defer cancel()
		ws, resp, err := websocket.Dial(ctx, e.url, &websocket.DialOptions{Subprotocols: protos, HTTPHeader: h,
			HTTPClient: &http.Client{Transport: &http.Transport{}}})
		if err == nil {
			ws.CloseNow()
			return 101, ""
		}
		if resp == nil {
			t.Fatalf("dial: %v", err)
		}
		var body bytes.Buffer
		if resp.Body != nil {
			body.ReadFrom(resp.Body)
		}
		return resp.StatusCode, body.String()
	}
	v1 := []string{protocol.Subprotocol(1)}
	for _, tc := range []struct {
		protos []string
		token  string
		status int
		says   string
	}{
		{v1, "", 401, "Authorization: Bearer"},
		{v1, "wrong", 401, "right token"},
		{nil, "s3cret", 426, `"moonji-engine.v1"`},
		{[]string{"moonji-engine.v2"}, "s3cret", 426, `offered "moonji-engine.v2"`},
		{v1, "s3cret", 101, ""},
		{[]string{"moonji-engine.v2", "moonji-engine.v1"}, "s3cret", 101, ""},
	} {
		status, body := dial(tc.protos, tc.token)
		if status != tc.status || !strings.Contains(body, tc.says) {
			t.Errorf("%v token %q: %d %q, want %d saying %q", tc.protos, tc.token, status, body, tc.status, tc.says)
		}
		if status == 426 && !strings.Contains(body, "version 1") {
			t.Errorf("the 426 sentence does not name version 1: %q", body)
		}
	}
	if c := e.dial(t, http.Header{"Authorization": {"Bearer s3cret"}}); c == nil {
		t.Fatal("no client")
	}
}
