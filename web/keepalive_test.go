package web_test

import (
	"bufio"
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/internal/keepalive"
	"moonji/internal/mockllm"
	"moonji/models"
)

func withKeepalive(d time.Duration) envOption {
	return func(c *config.Config) { c.StreamKeepalive = &d }
}

// sseFrames splits a stream's body into its frames, each with the blank
// line that ends it.
func sseFrames(body string) []string {
	var frames []string
	for body != "" {
		i := strings.Index(body, "\n\n")
		if i < 0 {
			return append(frames, body)
		}
		frames = append(frames, body[:i+2])
		body = body[i+2:]
	}
	return frames
}

// An engine silent before its first token and between two (a model
// thinking): the stream gets keep-alive comments meanwhile, each a frame
// of its own, and the engine's frames as they were.
func TestSilentEngineStreamGetsKeepalives(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", withKeepalive(100*time.Millisecond))
	resp := e.post(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],` +
		`"mock":{"tag":"quiet","tokens":4,"ttft_ms":700,"pause_after":2,"pause_ms":700}}`)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Accel-Buffering") != "no" {
		t.Fatalf("status %d, X-Accel-Buffering %q", resp.StatusCode, resp.Header.Get("X-Accel-Buffering"))
	}
	body := readAll(t, resp.Body)
	frames := sseFrames(body)
	var data []string
	before, between := 0, 0
	for _, f := range frames {
		switch {
		case f == string(keepalive.Comment):
			if len(data) == 0 {
				before++
			} else if len(data) >= 2 && !strings.Contains(f, "[DONE]") {
				between++
			}
		case strings.HasPrefix(f, "data: ") && !strings.Contains(f, "\n:"):
			data = append(data, f)
		default:
			t.Fatalf("a frame that is neither a keep-alive nor the engine's: %q", f)
		}
	}
	if before == 0 || between == 0 {
		t.Fatalf("keep-alives: %d before the first frame, %d in the pause; want some of each\n%s", before, between, body)
	}
	if last := data[len(data)-1]; last != "data: [DONE]\n\n" {
		t.Fatalf("the stream ends with %q", last)
	}
	row := e.final(resp.Header.Get("X-Inference-Id"))
	if row.Outcome != models.OutcomeSuccess || row.CompletionTokens != 4 {
		t.Fatalf("row = %+v", row)
	}
}

// The frames are the engine's, byte for byte: with keep-alives taken out,
// a replayed recording arrives as it was recorded.
func TestKeepalivesLeaveFramesAsTheyWere(t *testing.T) {
	recorded := "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n" +
		"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n" +
		"data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n" +
		"data: [DONE]\n\n"
	dir := recordings(t, map[string]string{"quiet.sse": recorded})
	e := startEnvReplaying(t, "sqlite://"+t.TempDir()+"/m.db", dir, withKeepalive(50*time.Millisecond))
	resp := e.post(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"replay":"quiet.sse","tps":4}}`)
	body := readAll(t, resp.Body)
	if !strings.Contains(body, string(keepalive.Comment)) {
		t.Fatalf("no keep-alive in a stream silent for 250 ms between frames with a 50 ms interval:\n%s", body)
	}
	if got := strings.ReplaceAll(body, string(keepalive.Comment), ""); got != recorded {
		t.Fatalf("frames changed:\ngot  %q\nwant %q", got, recorded)
	}
}

// A comment is a write the client reads: it moves the client's write
// deadline like a frame does, so a stream silent for longer than
// stream_write_timeout is not taken for one whose client stopped reading.
func TestKeepalivesMoveTheWriteDeadline(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", withKeepalive(100*time.Millisecond), func(c *config.Config) {
		c.StreamWriteTimeout = 500 * time.Millisecond
	})
	resp := e.post(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],` +
		`"mock":{"tokens":3,"ttft_ms":300,"pause_after":1,"pause_ms":1500}}`)
	b, _ := readAllQuiet(resp)
	if body := string(b); !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("a stream silent 1.5 s, its client reading every keep-alive, was cut by a 500 ms write timeout; ends %q", tail(body))
	}
	if row := e.final(resp.Header.Get("X-Inference-Id")); row.Outcome != models.OutcomeSuccess {
		t.Fatalf("row = %+v", row)
	}
}

// stream_keepalive: 0 turns them off.
func TestKeepaliveOff(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", withKeepalive(0))
	resp := e.post(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tokens":2,"ttft_ms":300}}`)
	if body := readAll(t, resp.Body); strings.Contains(body, ":") && strings.Contains(body, "keepalive") {
		t.Fatalf("keep-alives with stream_keepalive 0:\n%s", body)
	}
}

// A client that leaves while the engine is silent is noticed when a
// keep-alive cannot be written: the engine's request is cancelled, the
// slot freed, the row cancelled / client_disconnected.
func TestClientLeavingDuringSilenceIsNoticed(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", withKeepalive(50*time.Millisecond), func(c *config.Config) {
		c.Backends[0].MaxConcurrency = 1
	})
	conn := rawRequest(t, e, `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tag":"gone","tokens":3,"ttft_ms":60000}}`, "", nil)
	br := bufio.NewReader(conn)
	// Read until the first keep-alive: the stream is open and silent.
	var seen bytes.Buffer
	for !bytes.Contains(seen.Bytes(), keepalive.Comment) {
		b, err := br.ReadByte()
		if err != nil {
			t.Fatalf("before the first keep-alive: %v (read %q)", err, seen.String())
		}
		seen.WriteByte(b)
	}
	id := headerValue(seen.String(), "X-Inference-Id")
	conn.Close()
	if _, err := e.Mock.WaitFor(ctxTimeout(t, 30*time.Second), "gone", func(r mockllm.Record) bool { return r.Cancelled }); err != nil {
		t.Fatal("the engine's request outlived its client:", err)
	}
	row := e.final(id)
	if row.Outcome != models.OutcomeCancelled || row.Reason != "client_disconnected" {
		t.Fatalf("row = %+v, want cancelled/client_disconnected", row)
	}
	waitFor(t, "slot freed", 10*time.Second, func() bool { return inFlight(t, e) == 0 })
}

// headerValue finds a header in a raw HTTP response's head.
func headerValue(raw, name string) string {
	for _, line := range strings.Split(raw, "\r\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.EqualFold(k, name) {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
