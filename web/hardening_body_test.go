package web_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/models"
)

// byteFiller reads as an endless run of one byte, so a client can send a body
// of any size without holding it in memory.
type byteFiller byte

func (f byteFiller) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(f)
	}
	return len(p), nil
}

// chatBodyOf returns a reader of a valid chat request of exactly size bytes
// whose model is model; the user's message pads it.
func chatBodyOf(model string, size int64) io.Reader {
	head := `{"model":"` + model + `","max_tokens":2,"messages":[{"role":"user","content":"`
	tail := `"}]}`
	pad := size - int64(len(head)+len(tail))
	if pad < 0 {
		panic("body too small for its JSON")
	}
	return io.MultiReader(strings.NewReader(head), io.LimitReader(byteFiller('a'), pad), strings.NewReader(tail))
}

// exchangeRaw writes head (request line and headers, without the blank line
// that ends them) and then body, if any, on a fresh connection, and reads
// the answer, all within timeout. It does not wait for body to be written:
// the server may answer first.
func exchangeRaw(t *testing.T, base, head string, body io.Reader, timeout time.Duration) (*http.Response, string) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(conn, head+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if body != nil {
		go func() { _, _ = io.Copy(conn, body) }()
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	for err == nil && resp.StatusCode < 200 {
		resp, err = http.ReadResponse(br, nil) // 100 Continue
	}
	if err != nil {
		t.Fatalf("no answer within %v: %v", timeout, err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	return resp, string(b)
}

// mustOpenAIError checks that body is OpenAI's error object and returns its code.
func mustOpenAIError(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Error *struct {
			Message *string `json:"message"`
			Type    *string `json:"type"`
			Param   *string `json:"param"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error == nil || e.Error.Message == nil ||
		*e.Error.Message == "" || e.Error.Type == nil || *e.Error.Type == "" {
		t.Fatalf("not OpenAI's error shape: %q", tail(body))
	}
	var raw map[string]map[string]json.RawMessage
	_ = json.Unmarshal([]byte(body), &raw)
	for _, k := range []string{"message", "type", "param", "code"} {
		if _, ok := raw["error"][k]; !ok {
			t.Errorf("error object lacks %q: %s", k, tail(body))
		}
	}
	if e.Error.Code == nil {
		return ""
	}
	return *e.Error.Code
}

// checkRequestIDs checks that a /v1 answer carries an inference id, and the same
// value as x-request-id (what the openai SDKs read as request_id).
func checkRequestIDs(t *testing.T, resp *http.Response) string {
	t.Helper()
	id := resp.Header.Get("X-Inference-Id")
	if !strings.HasPrefix(id, "inf_") {
		t.Errorf("X-Inference-Id = %q", id)
	}
	if rid := resp.Header.Get("X-Request-Id"); rid != id {
		t.Errorf("x-request-id = %q, want the inference id %q", rid, id)
	}
	return id
}

const bigBodySize = 31 << 20

// TestKeylessLargeBodiesAreNotRead: a request without a valid key is refused
// from its headers alone. Its body is never read (the 401 arrives while the
// client has not sent a byte of it), so 16 key-less 31 MB requests cost the
// server next to no memory, and its row does not take the model name from
// the body.
func TestKeylessLargeBodiesAreNotRead(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db")
	host := "Host: x\r\nContent-Type: application/json\r\n"

	// fasthttp reads up to 8 KiB of a body with its headers before any
	// handler runs; the client sends a little more, then waits. Read
	// whole, the body would be awaited until the read timeout.
	firstPart := func() io.Reader { return io.LimitReader(chatBodyOf("any text", bigBodySize), 64<<10) }
	t.Run("first 64 KiB only", func(t *testing.T) {
		for _, c := range []struct {
			name, head string
			body       io.Reader
		}{
			{"content-length", "POST /v1/chat/completions HTTP/1.1\r\n" + host + fmt.Sprintf("Content-Length: %d", bigBodySize), firstPart()},
			{"chunked", "POST /v1/chat/completions HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked",
				strings.NewReader(fmt.Sprintf("%x\r\n", 64<<10) + readAll(t, firstPart()) + "\r\n")},
			{"bad key", "POST /v1/chat/completions HTTP/1.1\r\n" + host + "Authorization: Bearer mj-bogusbogusbogusbogus\r\n" +
				fmt.Sprintf("Content-Length: %d", bigBodySize), firstPart()},
			{"100-continue", "POST /v1/chat/completions HTTP/1.1\r\n" + host + "Expect: 100-continue\r\n" +
				fmt.Sprintf("Content-Length: %d", bigBodySize), firstPart()},
		} {
			t.Run(c.name, func(t *testing.T) {
				start := time.Now()
				resp, body := exchangeRaw(t, e.URL, c.head, c.body, 3*time.Second)
				if resp.StatusCode != http.StatusUnauthorized {
					t.Fatalf("status %d, want 401: %s", resp.StatusCode, tail(body))
				}
				if took := time.Since(start); took > time.Second {
					t.Errorf("401 took %v", took)
				}
				if code := mustOpenAIError(t, body); code != "invalid_api_key" {
					t.Errorf("code %q", code)
				}
				id := checkRequestIDs(t, resp)
				if !resp.Close {
					t.Error("the unread body is left on a connection kept open")
				}
				row := e.final(id)
				if row.Outcome != models.OutcomeRejected || row.Status != 401 || row.Model != "" {
					t.Errorf("row = %+v", row)
				}
			})
		}
	})

	t.Run("small body keeps the connection", func(t *testing.T) {
		// A refused request whose whole body came with its headers leaves
		// nothing unread: the connection serves the next request.
		conn, err := net.Dial("tcp", strings.TrimPrefix(e.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
		br := bufio.NewReader(conn)
		for i, key := range []string{"", e.Key} {
			req := "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
			if key != "" {
				req += "Authorization: Bearer " + key + "\r\n"
			}
			req += fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(chatBody), chatBody)
			if _, err := io.WriteString(conn, req); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("request %d on the same connection: %v", i, err)
			}
			body := readAll(t, resp.Body)
			if want := []int{401, 200}[i]; resp.StatusCode != want || resp.Close {
				t.Fatalf("request %d: %d (close %v), want %d: %s", i, resp.StatusCode, resp.Close, want, tail(body))
			}
		}
	})

	t.Run("16 x 31 MB", func(t *testing.T) {
		client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
		before := memAfterGC()
		var peak atomic.Uint64
		stop := make(chan struct{})
		sampled := make(chan struct{})
		go func() {
			defer close(sampled)
			for {
				select {
				case <-stop:
					return
				case <-time.After(2 * time.Millisecond):
				}
				var m runtime.MemStats
				runtime.ReadMemStats(&m)
				if m.HeapInuse > peak.Load() {
					peak.Store(m.HeapInuse)
				}
			}
		}()
		start := time.Now()
		var wg sync.WaitGroup
		ids := make([]string, 16)
		for i := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequest(http.MethodPost, e.URL+"/v1/chat/completions",
					chatBodyOf(fmt.Sprintf("any text %d", i), bigBodySize))
				if i%2 == 0 {
					req.ContentLength = bigBodySize // else chunked
				}
				req.Header.Set("Content-Type", "application/json")
				if i%4 == 1 {
					req.Header.Set("Authorization", "Bearer mj-bogusbogusbogusbogus")
				}
				resp, err := client.Do(req)
				if err != nil {
					t.Errorf("request %d: %v", i, err)
					return
				}
				body := readAll(t, resp.Body)
				if resp.StatusCode != http.StatusUnauthorized {
					t.Errorf("request %d: status %d: %s", i, resp.StatusCode, tail(body))
				}
				ids[i] = resp.Header.Get("X-Inference-Id")
			}()
		}
		wg.Wait()
		took := time.Since(start)
		close(stop)
		<-sampled
		after := memAfterGC()
		grew := int64(peak.Load()) - int64(before.HeapInuse)
		allocated := after.TotalAlloc - before.TotalAlloc
		t.Logf("16 key-less 31 MB requests: %v; heap in use %d MB before, peak +%d MB, %d MB after GC; %d MB allocated in all",
			took.Round(time.Millisecond), before.HeapInuse>>20, grew>>20, after.HeapInuse>>20, allocated>>20)
		if took > 5*time.Second {
			t.Errorf("the 401s took %v", took)
		}
		// Reading the bodies would take 16 x 31 MB at least once (twice
		// with the handler's copy); not reading them, a few MB.
		if allocated > 64<<20 {
			t.Errorf("%d MB allocated while refusing 16 key-less requests", allocated>>20)
		}
		if grew > 64<<20 {
			t.Errorf("heap in use grew by %d MB while refusing 16 key-less requests", grew>>20)
		}
		if d := int64(after.HeapInuse) - int64(before.HeapInuse); d > 16<<20 {
			t.Errorf("heap in use is %d MB above its baseline after GC", d>>20)
		}
		for i, id := range ids {
			if id == "" {
				continue
			}
			if row := e.final(id); row.Model != "" || row.Status != 401 {
				t.Errorf("request %d: row = %+v, want 401 with no model (the body was not read)", i, row)
			}
		}
	})
}

// memAfterGC collects garbage and reads the memory statistics.
func memAfterGC() runtime.MemStats {
	runtime.GC()
	runtime.GC() // a second cycle empties the sync.Pools the first one moved aside
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m
}

// TestBodyCap: a request with a valid key may send up to max_body_bytes;
// one byte more is refused with 413 in OpenAI's shape, with its inference
// id and a rejected row, whether its length is announced or chunked.
func TestBodyCap(t *testing.T) {
	const limit = 1 << 20
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", func(c *config.Config) { c.MaxBodyBytes = limit })
	send := func(t *testing.T, size int64, chunked bool) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodPost, e.URL+"/v1/chat/completions", chatBodyOf("m1", size))
		if !chunked {
			req.ContentLength = size
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+e.Key)
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp, readAll(t, resp.Body)
	}
	for _, chunked := range []bool{false, true} {
		name := "content-length"
		if chunked {
			name = "chunked"
		}
		t.Run(name+" at the cap", func(t *testing.T) {
			resp, body := send(t, limit, chunked)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, tail(body))
			}
			if row := e.final(checkRequestIDs(t, resp)); row.Outcome != models.OutcomeSuccess || row.Model != "m1" {
				t.Errorf("row = %+v", row)
			}
		})
		t.Run(name+" one byte over", func(t *testing.T) {
			resp, body := send(t, limit+1, chunked)
			if resp.StatusCode != http.StatusRequestEntityTooLarge {
				t.Fatalf("status %d: %s", resp.StatusCode, tail(body))
			}
			if code := mustOpenAIError(t, body); code != "request_too_large" {
				t.Errorf("code %q", code)
			}
			row := e.final(checkRequestIDs(t, resp))
			if row.Outcome != models.OutcomeRejected || row.Status != 413 || row.Reason != "body_too_large" || row.KeyID == nil {
				t.Errorf("row = %+v", row)
			}
		})
	}
	for _, c := range []struct {
		name   string
		size   int64
		status int
	}{{"gzip inflating to the cap", limit, 200}, {"gzip inflating to one byte over", limit + 1, 413}} {
		t.Run(c.name, func(t *testing.T) {
			plain, _ := io.ReadAll(chatBodyOf("m1", c.size))
			req, _ := http.NewRequest(http.MethodPost, e.URL+"/v1/chat/completions", bytes.NewReader(gzipped(string(plain))))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Content-Encoding", "gzip")
			req.Header.Set("Authorization", "Bearer "+e.Key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if body := readAll(t, resp.Body); resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, tail(body))
			}
			checkRequestIDs(t, resp)
		})
	}
	t.Run("announced length over the cap, 64 KiB sent", func(t *testing.T) {
		resp, body := exchangeRaw(t, e.URL, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "+e.Key+
			fmt.Sprintf("\r\nContent-Length: %d", 31<<20), io.LimitReader(byteFiller('a'), 64<<10), 3*time.Second)
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !resp.Close {
			t.Fatalf("status %d (close %v): %s", resp.StatusCode, resp.Close, tail(body))
		}
		mustOpenAIError(t, body)
		checkRequestIDs(t, resp)
	})
}

// TestSmallBodiesElsewhere: the forms and the stop endpoint still read their
// bodies (announced or chunked), but theirs are small, and a large one is
// refused from its headers whoever sends it.
func TestSmallBodiesElsewhere(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db")
	c := e.signedIn("person@example.com", false)
	token := mustMe(e, c).CSRFToken

	// A chunked form creates a key.
	form := url.Values{"name": {"chunked-form"}, "_csrf": {token}}.Encode()
	req, _ := http.NewRequest(http.MethodPost, e.URL+"/keys", io.MultiReader(strings.NewReader(form)))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp.Body)
	if req.ContentLength != 0 || resp.StatusCode != 200 || !reSecret.MatchString(body) {
		t.Fatalf("chunked form: %d (sent length %d)\n%s", resp.StatusCode, req.ContentLength, tail(body))
	}

	// A chunked JSON body reaches the stop endpoint.
	req, _ = http.NewRequest(http.MethodPost, e.URL+"/api/v1/inference/stop", io.MultiReader(strings.NewReader(`{"inference_id":"inf_nosuch"}`)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-CSRF-Token", token)
	resp, err = c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp.Body); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("chunked stop: %d %s", resp.StatusCode, tail(body))
	}

	// Large bodies anywhere else are refused at once, key or not.
	for _, path := range []string{"/keys", "/logout", "/idp/login", "/idp/oauth/token", "/api/v1/inference/stop",
		"/v1/inferences/inf_x/cancel", "/v1/models"} {
		for _, chunked := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s chunked=%v", path, chunked), func(t *testing.T) {
				head := "POST " + path + " HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\nCookie: moonji_session=" + e.sessionCookie(c)
				if chunked {
					head += "\r\nTransfer-Encoding: chunked"
				} else {
					head += fmt.Sprintf("\r\nContent-Length: %d", bigBodySize)
				}
				body := io.LimitReader(byteFiller('a'), 64<<10)
				if chunked {
					// 1 MB in chunks of 64 KiB, and no end: the server
					// must give up on its own.
					chunk := fmt.Sprintf("%x\r\n%s\r\n", 64<<10, strings.Repeat("a", 64<<10))
					body = strings.NewReader(strings.Repeat(chunk, 16))
				}
				resp, got := exchangeRaw(t, e.URL, head, body, 3*time.Second)
				if resp.StatusCode != http.StatusRequestEntityTooLarge || !resp.Close {
					t.Fatalf("status %d (close %v): %s", resp.StatusCode, resp.Close, tail(got))
				}
				if strings.HasPrefix(path, "/v1/") {
					mustOpenAIError(t, got)
					checkRequestIDs(t, resp)
				}
			})
		}
	}
	// Compressed bodies are inflated within the same limit.
	stop := func(body []byte) (*http.Response, string) {
		return exchangeRaw(t, e.URL, "POST /api/v1/inference/stop HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"+
			fmt.Sprintf("Content-Encoding: gzip\r\nContent-Length: %d\r\n", len(body))+
			"Cookie: moonji_session="+e.sessionCookie(c)+"\r\nX-CSRF-Token: "+token, bytes.NewReader(body), 3*time.Second)
	}
	if resp, got := stop(gzipped(`{"inference_id":"inf_nosuch"}`)); resp.StatusCode != http.StatusNotFound {
		t.Errorf("gzip body to the stop endpoint: %d %s", resp.StatusCode, tail(got))
	}
	bomb := gzipped(`{"inference_id":"` + strings.Repeat("a", 1<<20) + `"}`)
	if resp, got := stop(bomb); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("%d bytes of gzip inflating to 1 MB: %d %s", len(bomb), resp.StatusCode, tail(got))
	}
}

func gzipped(s string) []byte {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, _ = zw.Write([]byte(s))
	_ = zw.Close()
	return b.Bytes()
}

// TestServerRefusalsOnV1: answers the server gives before (or instead of)
// a handler — wrong method, unknown path, headers too large — are in
// OpenAI's shape with an inference id under /v1.
func TestServerRefusalsOnV1(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db")
	cases := []struct {
		name, head string
		status     int
	}{
		{"wrong method", "GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + e.Key, http.StatusMethodNotAllowed},
		{"wrong method on models", "DELETE /v1/models HTTP/1.1\r\nHost: x", http.StatusMethodNotAllowed},
		{"unknown path", "POST /v1/images/generations HTTP/1.1\r\nHost: x\r\nContent-Length: 2", http.StatusNotFound},
		{"headers too large", "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("b", 64<<10), http.StatusRequestHeaderFieldsTooLarge},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var body io.Reader
			if strings.Contains(c.head, "Content-Length: 2") {
				body = strings.NewReader("{}")
			}
			resp, got := exchangeRaw(t, e.URL, c.head, body, 3*time.Second)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, tail(got))
			}
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
				t.Errorf("Content-Type %q", ct)
			}
			mustOpenAIError(t, got)
			checkRequestIDs(t, resp)
		})
	}
}

// TestRequestIDOnV1: every /v1 answer carries x-request-id equal to its
// X-Inference-Id, so the openai SDKs' request_id names the ledger row.
func TestRequestIDOnV1(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db")
	do := func(method, path, key, body string) *http.Response {
		req, _ := http.NewRequest(method, e.URL+path, strings.NewReader(body))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp.Body)
		return resp
	}
	cases := []struct {
		name, method, path, key, body string
		status                        int
	}{
		{"chat", http.MethodPost, "/v1/chat/completions", e.Key, chatBody, 200},
		{"chat stream", http.MethodPost, "/v1/chat/completions", e.Key, `{"model":"m1","stream":true,"max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`, 200},
		{"chat no key", http.MethodPost, "/v1/chat/completions", "", chatBody, 401},
		{"models", http.MethodGet, "/v1/models", e.Key, "", 200},
		{"models no key", http.MethodGet, "/v1/models", "", "", 401},
		{"model", http.MethodGet, "/v1/models/m1", e.Key, "", 200},
		{"unknown model", http.MethodGet, "/v1/models/nope", e.Key, "", 404},
		{"cancel", http.MethodPost, "/v1/inferences/inf_nosuch/cancel", e.Key, "", 404},
		{"cancel no key", http.MethodPost, "/v1/inferences/inf_nosuch/cancel", "", "", 401},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp := do(c.method, c.path, c.key, c.body)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, c.status)
			}
			checkRequestIDs(t, resp)
		})
	}
}
