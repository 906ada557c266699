package proxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// The engine client (transport.go) against net/http's and fasthttp's, for this workload: one
// chat body out, a small JSON answer or 20 SSE frames back, over loopback
// keep-alive connections (issue 12 asked for the comparison).
//
//	go test ./internal/proxy -run '^$' -bench EngineClient -benchmem -count 5
//
// Both read the whole answer; the stream is read frame by frame as the
// relay does. Moonji has a client of its own rather than fasthttp's, close
// to it in cost, because fasthttp's takes no context: an engine's request
// could not be aborted the moment its client leaves or is stopped.

const benchAnswer = `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hello from the engine."},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":5,"total_tokens":14}}`

var benchBody = []byte(`{"model":"m","messages":[{"role":"user","content":"Say hello"}],"stream":false}`)

func benchEngine(b *testing.B) *httptest.Server {
	frame := `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"tok"},"finish_reason":null}]}` + "\n\n"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Query().Get("stream") == "" {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, benchAnswer)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for range 20 {
			io.WriteString(w, frame)
			f.Flush()
		}
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	b.Cleanup(srv.Close)
	return srv
}

func BenchmarkEngineClient(b *testing.B) {
	srv := benchEngine(b)
	for _, stream := range []bool{false, true} {
		path := "/chat/completions"
		name := "whole"
		if stream {
			path += "?stream=1"
			name = "stream"
		}
		b.Run("net-http/"+name, func(b *testing.B) {
			hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true,
				ReadBufferSize: 1 << 10, WriteBufferSize: 2 << 10}}
			b.ReportAllocs()
			for b.Loop() {
				req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL+path, bytes.NewReader(benchBody))
				if err != nil {
					b.Fatal(err)
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Accept", "application/json, text/event-stream")
				resp, err := hc.Do(req)
				if err != nil {
					b.Fatal(err)
				}
				readAnswer(b, resp.Body, stream)
				resp.Body.Close()
			}
		})
		b.Run("moonji/"+name, func(b *testing.B) {
			c := NewClient()
			up := Upstream{Name: "bench", BaseURL: srv.URL}
			b.ReportAllocs()
			for b.Loop() {
				resp, err := c.do(context.Background(), up, http.MethodPost, path, benchBody, "", nil)
				if err != nil {
					b.Fatal(err)
				}
				readAnswer(b, resp.Body, stream)
				resp.Body.Close()
			}
		})
		b.Run("fasthttp/"+name, func(b *testing.B) {
			c := &fasthttp.Client{StreamResponseBody: true, MaxConnsPerHost: 1024, ReadTimeout: 10 * time.Second}
			url := srv.URL + path
			b.ReportAllocs()
			for b.Loop() {
				req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
				req.SetRequestURI(url)
				req.Header.SetMethod(http.MethodPost)
				req.Header.SetContentType("application/json")
				req.Header.Set("Accept", "application/json, text/event-stream")
				req.SetBodyRaw(benchBody)
				if err := c.Do(req, resp); err != nil {
					b.Fatal(err)
				}
				readAnswer(b, resp.BodyStream(), stream)
				resp.CloseBodyStream()
				fasthttp.ReleaseRequest(req)
				fasthttp.ReleaseResponse(resp)
			}
		})
	}
}

// readAnswer reads an answer as the gateway does: a whole one at once, a
// stream frame by frame.
func readAnswer(b *testing.B, r io.Reader, stream bool) {
	if !stream {
		data, err := io.ReadAll(r)
		if err != nil || len(data) != len(benchAnswer) {
			b.Fatalf("answer: %d bytes, %v", len(data), err)
		}
		return
	}
	br := bufio.NewReaderSize(r, 4<<10)
	var frame []byte
	n := 0
	for {
		var err error
		frame, err = readFrame(br, frame[:0])
		if err != nil {
			b.Fatalf("frame %d: %v", n, err)
		}
		n++
		if strings.HasPrefix(string(frame), "data: [DONE]") {
			break
		}
	}
	if n != 21 {
		b.Fatal(fmt.Sprint("frames: ", n))
	}
}
