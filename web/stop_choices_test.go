package web_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"moonji/models"
)

// streamChunk is one chunk of a chat stream, as a client reads it.
type streamChunk struct {
	ID      string `json:"id"`
	Model   string `json:"model"`
	Created int64  `json:"created"`
	Choices []struct {
		Index        int            `json:"index"`
		Delta        map[string]any `json:"delta"`
		FinishReason *string        `json:"finish_reason"`
	} `json:"choices"`
	Usage map[string]any `json:"usage"`
}

// checkChoicesClosed checks a stopped stream the way SDK helpers that
// assemble the whole completion read it: every choice 0..n-1 opened with
// its role and given one finish_reason, every chunk with the stream's own
// id, model and created, then [DONE].
func checkChoicesClosed(t *testing.T, body string, n int) {
	t.Helper()
	if !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("end: %q", tail(body))
	}
	var first *streamChunk
	finished, roles := map[int]int{}, map[int]int{}
	for _, line := range strings.Split(body, "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var c streamChunk
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("frame %q: %v", data, err)
		}
		if first == nil {
			first = &c
		}
		if c.ID != first.ID || c.Model != first.Model || c.Created != first.Created {
			t.Errorf("chunk %q: not the stream's own id, model and created (%s, %s, %d)", data, first.ID, first.Model, first.Created)
		}
		for _, ch := range c.Choices {
			if ch.Index < 0 || ch.Index >= n {
				t.Errorf("chunk %q: choice %d of %d", data, ch.Index, n)
			}
			if ch.FinishReason != nil {
				finished[ch.Index]++
			}
			if ch.Delta["role"] == "assistant" {
				roles[ch.Index]++
			}
		}
	}
	for i := range n {
		if finished[i] != 1 || roles[i] != 1 {
			t.Errorf("choice %d: %d finish_reasons and %d roles, want one each; the end: %q", i, finished[i], roles[i], tail(body))
		}
	}
}

// A stream with n > 1 stopped mid-answer closes each of its n choices: the
// mock engine streams them as vLLM does, one chunk per choice and token.
func TestStoppedStreamClosesEveryChoice(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db")
	s := startStream(t, e, e.Key, `{"model":"m1","stream":true,"n":3,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}],"mock":{"tps":50,"tokens":1000}}`)
	waitContent(t, s, 6)
	if ans := cancelVia(t, e, e.Key, s.id); ans.status != http.StatusOK {
		t.Fatalf("cancel: %d %v", ans.status, ans.body)
	}
	body := s.wait(t)
	checkChoicesClosed(t, body, 3)
	if row := e.final(s.id); row.Outcome != models.OutcomeStopped || row.CompletionTokens < s.contentCount() {
		t.Errorf("row = %+v, want stopped with ≥ %d completion tokens", row, s.contentCount())
	}
}

// An engine that opens a choice only with its first token (SGLang does) may
// be stopped before some of the n have a chunk: those get one all the same,
// with the role, in the closing chunk.
func TestStoppedStreamClosesChoicesNeverStarted(t *testing.T) {
	head := `data: {"id":"chatcmpl-lazy","object":"chat.completion.chunk","created":1795979333,"model":"m1","choices":[`
	var rec strings.Builder
	rec.WriteString(head + `{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n")
	for i := range 200 {
		rec.WriteString(head + `{"index":0,"delta":{"content":"w` + strconv.Itoa(i) + ` "},"finish_reason":null}]}` + "\n\n")
	}
	rec.WriteString(head + `{"index":1,"delta":{"role":"assistant","content":"late"},"finish_reason":null}]}` + "\n\n")
	rec.WriteString("data: [DONE]\n\n")
	e := startEnvReplaying(t, "sqlite://"+t.TempDir()+"/m.db", recordings(t, map[string]string{"lazy.sse": rec.String()}))

	s := startStream(t, e, e.Key, `{"model":"m1","stream":true,"n":2,"messages":[{"role":"user","content":"x"}],"mock":{"replay":"lazy.sse","tps":50}}`)
	waitContent(t, s, 3)
	if ans := cancelVia(t, e, e.Key, s.id); ans.status != http.StatusOK {
		t.Fatalf("cancel: %d %v", ans.status, ans.body)
	}
	body := s.wait(t)
	if strings.Contains(body, "late") {
		t.Fatalf("choice 1's first chunk came before the stop; the test needs a stop before it: %q", tail(body))
	}
	checkChoicesClosed(t, body, 2)
}

// A plain (non-streamed) request with n > 1 stopped before the engine's
// first token answers an empty completion with each of its n choices.
func TestStoppedCompletionHasEveryChoice(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db")
	done := make(chan *http.Response, 1)
	go func() {
		done <- e.post(`{"model":"m1","n":3,"messages":[{"role":"user","content":"x"}],"mock":{"tag":"slow","ttft_ms":20000}}`)
	}()
	if _, err := e.Mock.WaitFor(ctxTimeout(t, 5*time.Second), "slow", nil); err != nil {
		t.Fatal(err)
	}
	var id string
	waitFor(t, "the pending row", 5*time.Second, func() bool {
		_ = e.srv.Ledger.Flush(t.Context())
		var rows []models.Usage
		e.DB.Where("outcome = ?", models.OutcomePending).Find(&rows)
		if len(rows) == 1 {
			id = rows[0].InferenceID
		}
		return id != ""
	})
	if ans := cancelVia(t, e, e.Key, id); ans.status != http.StatusOK {
		t.Fatalf("cancel: %d %v", ans.status, ans.body)
	}
	resp := <-done
	body := readAll(t, resp.Body)
	var c struct {
		Object  string `json:"object"`
		Choices []struct {
			Index        int    `json:"index"`
			FinishReason string `json:"finish_reason"`
			Message      struct {
				Role string `json:"role"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal([]byte(body), &c); err != nil || resp.StatusCode != http.StatusOK || c.Object != "chat.completion" || len(c.Choices) != 3 {
		t.Fatalf("%d %s (%v): want a completion with 3 choices", resp.StatusCode, body, err)
	}
	for i, ch := range c.Choices {
		if ch.Index != i || ch.FinishReason != "stop" || ch.Message.Role != "assistant" {
			t.Errorf("choice %d: %+v", i, ch)
		}
	}
}
