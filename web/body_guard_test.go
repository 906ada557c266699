package web_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"moonji/models"
)

// guardError is an answer in OpenAI's error shape, param kept apart from a
// missing one.
type guardError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

func guardErrorOf(t *testing.T, resp *http.Response, body []byte) guardError {
	t.Helper()
	var e struct {
		Error *guardError `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error == nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("status %d, not OpenAI's error shape: %.300q", resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type %q", ct)
	}
	return *e.Error
}

// guardPost posts body to path with the given headers and returns the
// answer and its body. Large bodies go with their length announced.
func guardPost(t *testing.T, c *http.Client, url string, body []byte, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := c.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatalf("POST %s: %v (did the server die?)", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read the answer: %v", err)
	}
	return resp, b
}

// TestDeepNestingDoesNotKillTheServer: megabytes of nesting used to end the
// gateway's process in gjson.ValidBytes (a stack overflow is fatal, not a
// panic: 6 MB of "[" exceed Go's 1 GB stack). Now they are refused with 400
// at the 129th level, and the next request is served.
func TestDeepNestingDoesNotKillTheServer(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db")
	auth := map[string]string{"Authorization": "Bearer " + e.Key}
	ok := func(t *testing.T) {
		t.Helper()
		resp, body := guardPost(t, http.DefaultClient, e.URL+"/v1/chat/completions",
			[]byte(`{"model":"m1","messages":[{"role":"user","content":"still there?"}]}`), auth)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("a normal request after the attack: %d %s", resp.StatusCode, body)
		}
	}
	for name, body := range map[string][]byte{
		"8 MB of [":       bytes.Repeat([]byte("["), 8<<20),
		"3 MB of [":       bytes.Repeat([]byte("["), 3<<20),
		`3 MB of {"a":`:   bytes.Repeat([]byte(`{"a":`), 3<<20/5),
		"3 MB in a model": append([]byte(`{"model":"m1","messages":`), bytes.Repeat([]byte(`[{"content":`), 3<<20/12)...),
	} {
		t.Run(name, func(t *testing.T) {
			resp, got := guardPost(t, http.DefaultClient, e.URL+"/v1/chat/completions", body, auth)
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d: %.300s", resp.StatusCode, got)
			}
			if ge := guardErrorOf(t, resp, got); ge.Message != "request body nests deeper than 128 levels" || ge.Type != "invalid_request_error" {
				t.Errorf("error %+v", ge)
			}
			id := resp.Header.Get("X-Inference-Id")
			if row := e.final(id); row.Outcome != models.OutcomeRejected || row.Status != http.StatusBadRequest {
				t.Errorf("row = %+v", row)
			}
			ok(t)
		})
	}
	// The mock engine, which also serves the built-in demo model inside
	// the gateway's process, used gjson.ValidBytes too.
	t.Run("the mock engine", func(t *testing.T) {
		resp, got := guardPost(t, http.DefaultClient, e.MockURL+"/v1/chat/completions", bytes.Repeat([]byte("["), 8<<20), nil)
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("status %d: %.300s", resp.StatusCode, got)
		}
		ok(t)
	})
}

// TestRepeatedFieldsAreRefused: the gateway reads the first of repeated
// keys, the engines the last. A body repeating a field the gateway reads or
// writes is refused with 400 naming it, before any engine sees it, and
// leaves one rejected row; repeats elsewhere pass.
func TestRepeatedFieldsAreRefused(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db")
	auth := map[string]string{"Authorization": "Bearer " + e.Key}
	cases := []struct{ name, body, param string }{
		// upstream-name is a model of the engine that the gateway exposes
		// only as "renamed": the repeat would reach it unrenamed.
		{"model", `{"model":"m1","model":"upstream-name","messages":[{"role":"user","content":"x"}]}`, "model"},
		{"escaped model", `{"model":"m1","mod\u0065l":"upstream-name","messages":[{"role":"user","content":"x"}]}`, "model"},
		{"model in another case", `{"model":"m1","Model":"upstream-name","messages":[{"role":"user","content":"x"}]}`, "model"},
		{"stream", `{"model":"m1","stream":false,"messages":[{"role":"user","content":"x"}],"stream":true}`, "stream"},
		{"include_usage", `{"model":"m1","stream":true,"stream_options":{"include_usage":true,"include_usage":false},"messages":[{"role":"user","content":"x"}]}`, "stream_options.include_usage"},
		{"max_tokens", `{"model":"m1","max_tokens":1,"messages":[{"role":"user","content":"x"}],"max_tokens":100000}`, "max_tokens"},
		// n closes every choice of a stopped stream; tools and each
		// message's role, content and tool_calls estimate a cut prompt.
		{"n", `{"model":"m1","n":1,"messages":[{"role":"user","content":"x"}],"n":4}`, "n"},
		{"tools", `{"model":"m1","tools":[],"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}]}`, "tools"},
		{"content", `{"model":"m1","messages":[{"role":"user","content":"a","content":"b"}]}`, "messages[0].content"},
		{"role", `{"model":"m1","messages":[{"role":"user","content":"a"},{"role":"user","content":"b","Role":"system"}]}`, "messages[1].role"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := len(e.Mock.Requests())
			resp, got := guardPost(t, http.DefaultClient, e.URL+"/v1/chat/completions", []byte(c.body), auth)
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d: %s", resp.StatusCode, got)
			}
			ge := guardErrorOf(t, resp, got)
			if ge.Param == nil || *ge.Param != c.param || ge.Type != "invalid_request_error" || !strings.Contains(ge.Message, c.param) {
				t.Errorf("error %+v, param %v; want param %q", ge, ge.Param, c.param)
			}
			id := resp.Header.Get("X-Inference-Id")
			row := e.final(id)
			if row.Outcome != models.OutcomeRejected || row.Status != http.StatusBadRequest || row.Reason != "invalid_request" {
				t.Errorf("row = %+v", row)
			}
			var n int64
			if err := e.DB.Model(&models.Usage{}).Where("inference_id = ?", id).Count(&n).Error; err != nil || n != 1 {
				t.Errorf("%d rows for %s (%v), want 1", n, id, err)
			}
			if after := len(e.Mock.Requests()); after != before {
				t.Errorf("the engine saw %d requests", after-before)
			}
		})
	}
	// Repeats the gateway does not read pass through untouched. (A
	// message's repeated content passed too until the prompt estimate
	// began to read it.)
	resp, got := guardPost(t, http.DefaultClient, e.URL+"/v1/chat/completions",
		[]byte(`{"model":"m1","temperature":1,"temperature":0,"messages":[{"role":"user","content":"a","name":"x","name":"y"}]}`), auth)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("repeats of other keys: %d %s", resp.StatusCode, got)
	}
}

// TestStopEndpointBody: the stop endpoint's body goes through the same
// guard, and is capped at 64 KiB.
func TestStopEndpointBody(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db")
	c := e.signedIn("person@example.com", false)
	csrf := map[string]string{"X-CSRF-Token": mustMe(e, c).CSRFToken}
	stop := func(t *testing.T, body []byte) (*http.Response, []byte) {
		t.Helper()
		return guardPost(t, c, e.URL+"/api/v1/inference/stop", body, csrf)
	}
	alive := func(t *testing.T) {
		t.Helper()
		if resp, got := stop(t, []byte(`{"inference_id":"inf_nosuch","seen":1}`)); resp.StatusCode != http.StatusNotFound {
			t.Fatalf("a normal stop afterwards: %d %s", resp.StatusCode, got)
		}
	}
	t.Run("8 MB of [", func(t *testing.T) {
		// Past the cap: refused on its size (it used to kill the process).
		if resp, got := stop(t, bytes.Repeat([]byte("["), 8<<20)); resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("status %d: %.300s", resp.StatusCode, got)
		}
		alive(t)
	})
	t.Run("deep nesting under the cap", func(t *testing.T) {
		resp, got := stop(t, append([]byte(`{"inference_id":"inf_nosuch","seen":`), bytes.Repeat([]byte("["), 8<<10)...))
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("status %d: %.300s", resp.StatusCode, got)
		}
		if ge := guardErrorOf(t, resp, got); ge.Message != "request body nests deeper than 128 levels" || ge.Type != "invalid_request_error" {
			t.Errorf("error %+v", ge)
		}
		alive(t)
	})
	t.Run("repeated fields", func(t *testing.T) {
		for body, param := range map[string]string{
			`{"inference_id":"inf_nosuch","inference_id":"inf_other"}`:      "inference_id",
			`{"inference_id":"inf_nosuch","seen":1,"s\u0065en":2}`:          "seen",
			`{"inference_id":"inf_nosuch","seen":1,"extra":1,"extra":2}`:    "",
			`{"inference_id":"inf_nosuch","nested":{"seen":1,"seen":2}}`:    "",
			`{"inference_id":"inf_nosuch","Inference_ID":"inf_other"}`:      "inference_id",
			`{"inference_id":"inf_nosuch","seen":1} {"inference_id":"inf"}`: "-",
		} {
			resp, got := stop(t, []byte(body))
			switch param {
			case "":
				if resp.StatusCode != http.StatusNotFound {
					t.Errorf("%s: %d %s", body, resp.StatusCode, got)
				}
				continue
			case "-":
				if resp.StatusCode != http.StatusBadRequest || !strings.Contains(guardErrorOf(t, resp, got).Message, "not valid JSON") {
					t.Errorf("%s: %d %s", body, resp.StatusCode, got)
				}
				continue
			}
			if resp.StatusCode != http.StatusBadRequest {
				t.Errorf("%s: %d %s", body, resp.StatusCode, got)
				continue
			}
			if ge := guardErrorOf(t, resp, got); ge.Param == nil || *ge.Param != param {
				t.Errorf("%s: %+v; want param %q", body, ge, param)
			}
		}
	})
	t.Run("64 KiB cap", func(t *testing.T) {
		// The handler refuses a larger body in OpenAI's shape; the
		// server's own cap on small bodies may answer first.
		const limit = 64 << 10
		padded := func(size int) []byte {
			head, tail := `{"inference_id":"inf_nosuch","pad":"`, `"}`
			return []byte(head + strings.Repeat("a", size-len(head)-len(tail)) + tail)
		}
		if resp, got := stop(t, padded(limit)); resp.StatusCode != http.StatusNotFound {
			t.Errorf("a body of exactly 64 KiB: %d %.300s", resp.StatusCode, got)
		}
		if resp, got := stop(t, padded(limit+1)); resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("a body of 64 KiB + 1: %d %.300s", resp.StatusCode, got)
		}
		alive(t)
	})
}

// TestStopUnavailableSaysNoMore: when the stop cannot reach the replica
// running the inference (Redis down), the 503 says so in general terms; the
// cause, which names the Redis address, goes to the log only.
func TestStopUnavailableSaysNoMore(t *testing.T) {
	c := startCluster(t, 2, false)
	a, b := c.replicas[0], c.replicas[1]
	s := startStream(t, a, a.Key, `{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tps":50,"tokens":2000}}`)
	waitContent(t, s, 1)
	addr := c.be.Mini.Addr()
	c.be.Mini.Close()

	browserB := b.signedIn("owner@example.com", false)
	csrf := map[string]string{"X-CSRF-Token": mustMe(b, browserB).CSRFToken}
	for name, send := range map[string]func() (*http.Response, []byte){
		"session": func() (*http.Response, []byte) {
			return guardPost(t, browserB, b.URL+"/api/v1/inference/stop", []byte(`{"inference_id":"`+s.id+`"}`), csrf)
		},
		"key": func() (*http.Response, []byte) {
			return guardPost(t, http.DefaultClient, b.URL+"/v1/inferences/"+s.id+"/cancel", nil, map[string]string{"Authorization": "Bearer " + b.Key})
		},
	} {
		resp, got := send()
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("%s: status %d: %s", name, resp.StatusCode, got)
		}
		ge := guardErrorOf(t, resp, got)
		_, port, _ := strings.Cut(addr, ":")
		if strings.Contains(string(got), port) || strings.Contains(string(got), "dial") || strings.Contains(string(got), "redis") {
			t.Errorf("%s: the answer names the cause: %s", name, got)
		}
		if ge.Code == nil || *ge.Code != "stop_unavailable" || ge.Type != "server_error" {
			t.Errorf("%s: error %+v", name, ge)
		}
	}
	// The owner stops it without Redis; the stream ends before cleanup.
	resp, got := guardPost(t, http.DefaultClient, a.URL+"/v1/inferences/"+s.id+"/cancel", nil, map[string]string{"Authorization": "Bearer " + a.Key})
	if resp.StatusCode != http.StatusOK {
		t.Errorf("stop on the owner: %d %s", resp.StatusCode, got)
	}
	s.wait(t)
}
