package mockllm

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A chat-only engine: the other inference routes do not exist (404 as for
// any unknown route, whatever the method), chat and the model list still
// work, and the refused requests are recorded.
func TestAPIsRestriction(t *testing.T) {
	s, ts := start(t, Options{APIs: []string{APIChat}})
	for _, path := range []string{"/v1/completions", "/v1/embeddings", "/v1/responses"} {
		status, ctype, got := doAt(t, ts.URL, path, `{"model":"mock","input":"x","prompt":"x","mock":{"tag":"off"}}`)
		if status != http.StatusNotFound || ctype != "application/json" || got != `{"detail":"Not Found"}` {
			t.Errorf("POST %s: %d %q %s", path, status, ctype, got)
		}
		resp, err := http.Get(ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || string(b) != `{"detail":"Not Found"}` {
			t.Errorf("GET %s: %d %s", path, resp.StatusCode, b)
		}
	}
	if status, _, got := doAt(t, ts.URL, "/v1/chat/completions", `{"model":"mock","max_tokens":2,"messages":[{"role":"user","content":"x"}]}`); status != 200 {
		t.Errorf("chat: %d %s", status, got)
	}
	resp, err := http.Get(ts.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("/v1/models: %d", resp.StatusCode)
	}

	var endpoints []string
	for _, r := range s.Requests() {
		endpoints = append(endpoints, r.Endpoint)
		if r.Endpoint == APIChat {
			continue
		}
		wantTag := "off" // The GETs have no body, so no tag.
		if len(r.Body) == 0 {
			wantTag = ""
		}
		if r.Status != 404 || !r.Completed || r.Tag != wantTag {
			t.Errorf("refused request recorded as %+v", r)
		}
	}
	// The POSTs and the bodyless GETs of the three, then chat.
	if strings.Join(endpoints, ",") != "completions,completions,embeddings,embeddings,responses,responses,chat" {
		t.Errorf("recorded endpoints %q", endpoints)
	}

	// And the other way round: no chat.
	_, ts2 := start(t, Options{APIs: []string{APIResponses, APIEmbeddings}})
	if status, _, got := doAt(t, ts2.URL, "/v1/chat/completions", `{"model":"mock","messages":[{"role":"user","content":"x"}]}`); status != 404 || got != `{"detail":"Not Found"}` {
		t.Errorf("chat when off: %d %s", status, got)
	}
	if status, _, got := doAt(t, ts2.URL, "/v1/responses", `{"model":"mock","input":"x"}`); status != 200 {
		t.Errorf("responses when on: %d %s", status, got)
	}
}

func TestAPIsValidation(t *testing.T) {
	if apis, err := ParseAPIs(" chat, responses ,,"); err != nil || strings.Join(apis, "|") != "chat|responses" {
		t.Errorf("ParseAPIs = %q, %v", apis, err)
	}
	if apis, err := ParseAPIs(""); err != nil || apis != nil {
		t.Errorf("ParseAPIs(\"\") = %q, %v", apis, err)
	}
	if _, err := ParseAPIs("chat,embedding"); err == nil || !strings.Contains(err.Error(), `"embedding"`) {
		t.Errorf("typo accepted: %v", err)
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(error).Error(), `unknown API "completion"`) {
			t.Errorf("New with a bad API name: panic %v", r)
		}
	}()
	New(Options{APIs: []string{"completion"}})
}

// Every endpoint records itself, so that tests can tell requests apart.
func TestRecordEndpoint(t *testing.T) {
	s, ts := start(t, Options{})
	bodies := map[string]string{
		"/v1/chat/completions": `{"messages":[{"role":"user","content":"x"}],"max_tokens":1,"mock":{"tag":"chat"}}`,
		"/v1/completions":      `{"prompt":"x","max_tokens":1,"mock":{"tag":"completions"}}`,
		"/v1/embeddings":       `{"input":"x","mock":{"tag":"embeddings"}}`,
		"/v1/responses":        `{"input":"x","max_output_tokens":1,"mock":{"tag":"responses"}}`,
	}
	for path, body := range bodies {
		if status, _, got := doAt(t, ts.URL, path, body); status != 200 {
			t.Errorf("%s: %d %s", path, status, got)
		}
	}
	for _, api := range allAPIs {
		rec, err := s.WaitFor(waitCtx(t), api, func(r Record) bool { return r.Completed })
		if err != nil || rec.Endpoint != api || rec.Model != "" || rec.Status != 200 {
			t.Errorf("%s: record %+v, err %v", api, rec, err)
		}
	}
}

// The replay knob plays the new recordings back through the new endpoints
// byte for byte, a stream frame by frame.
func TestReplayNewEndpoints(t *testing.T) {
	s, ts := start(t, Options{ReplayDir: fixtures})
	cases := []struct {
		path, file, ctype string
		frames            int
	}{
		{"/v1/responses", "responses_stream.sse", "text/event-stream", 32},
		{"/v1/responses", "responses_nonstream.json", "application/json", 0},
		{"/v1/completions", "completions_stream.sse", "text/event-stream", 19},
		{"/v1/completions", "completions_nonstream.json", "application/json", 0},
		{"/v1/embeddings", "embeddings.json", "application/json", 0},
	}
	for _, c := range cases {
		t.Run(c.file, func(t *testing.T) {
			want, err := os.ReadFile(filepath.Join(fixtures, c.file))
			if err != nil {
				t.Fatal(err)
			}
			status, ctype, got := doAt(t, ts.URL, c.path, `{"model":"tiny","stream":true,"mock":{"replay":"`+c.file+`","tps":2000,"tag":"`+c.file+`"}}`)
			if status != 200 || ctype != c.ctype || got != string(want) {
				t.Errorf("status %d Content-Type %q, %d bytes; want %q, the %d-byte recording", status, ctype, len(got), c.ctype, len(want))
			}
			rec, err := s.WaitFor(waitCtx(t), c.file, func(r Record) bool { return r.Completed })
			if err != nil || rec.ChunksSent != c.frames || rec.Endpoint != strings.TrimPrefix(c.path, "/v1/") {
				t.Errorf("record %+v, err %v", rec, err)
			}
		})
	}
}
