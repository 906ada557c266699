package proxy

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

// readAll parses one answer from in with a buffer as small as the
// transport's, and reads its body.
func readAll(t *testing.T, br *bufio.Reader, method string) (*http.Response, string, error) {
	t.Helper()
	resp, err := readResponse(br, method)
	if err != nil {
		return nil, "", err
	}
	body, err := io.ReadAll(resp.Body)
	return resp, string(body), err
}

func TestReadResponse(t *testing.T) {
	long := strings.Repeat("x", 3000) // longer than the reader's buffer
	for _, tc := range []struct {
		name, in, method string
		status           int
		ct, body         string
		length           int64
		chunked, close   bool
	}{
		{name: "content-length", in: "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"a\":1}",
			status: 200, ct: "application/json", body: `{"a":1}`, length: 7},
		{name: "chunked stream with a trailer", in: "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: Chunked\r\n\r\n" +
			"f;ext=1\r\ndata: {\"a\":1}\n\n\r\n0\r\nX-Trailer: 1\r\n\r\n",
			status: 200, ct: "text/event-stream", body: "data: {\"a\":1}\n\n", length: -1, chunked: true},
		{name: "trailer lines longer than the buffer", in: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n" +
			"X-A: " + long[:1000] + "\r\nX-B: " + long[:1000] + "\r\n\r\n",
			status: 200, body: "hi", length: -1, chunked: true},
		{name: "chunked wins over a length", in: "HTTP/1.1 200 OK\r\nContent-Length: 99\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
			status: 200, body: "hi", length: -1, chunked: true},
		{name: "LF line endings", in: "HTTP/1.1 201 Created\nContent-Length: 2\n\nok", status: 201, body: "ok", length: 2},
		{name: "HTTP/1.0 to the end", in: "HTTP/1.0 200 OK\r\n\r\nall of it", status: 200, body: "all of it", length: -1, close: true},
		{name: "HTTP/1.0 kept alive", in: "HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 1\r\n\r\na", status: 200, body: "a", length: 1},
		{name: "close among tokens", in: "HTTP/1.1 500 Internal Server Error\r\nConnection: upgrade, Close\r\nContent-Length: 0\r\n\r\n", status: 500, length: 0, close: true},
		{name: "no length", in: "HTTP/1.1 502 Bad Gateway\r\n\r\nbye", status: 502, body: "bye", length: -1, close: true},
		{name: "no content", in: "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n", status: 204, length: 0},
		{name: "head", method: http.MethodHead, in: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", status: 200, length: 0},
		{name: "a code net/http has no words for", in: "HTTP/1.1 799 Odd\r\nContent-Length: 0\r\n\r\n", status: 799, length: 0},
		{name: "no reason", in: "HTTP/1.1 404\r\nContent-Length: 0\r\n\r\n", status: 404, length: 0},
		{name: "first content type, long headers", in: "HTTP/1.1 200 OK\r\nX-Long: " + long + "\r\nContent-Type: " + "text/plain; " + long +
			"\r\nContent-Type: a/b\r\nContent-Length: 1\r\n\r\nz", status: 200, ct: "text/plain; " + long, body: "z", length: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = http.MethodPost
			}
			toTheEnd := tc.close || tc.length < 0 && !tc.chunked
			in := tc.in
			if !toTheEnd {
				in += "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext"
			}
			br := bufio.NewReaderSize(strings.NewReader(in), connReadBuffer)
			resp, body, err := readAll(t, br, method)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status || resp.Header.Get("Content-Type") != tc.ct || body != tc.body ||
				resp.ContentLength != tc.length || isChunked(resp) != tc.chunked || resp.Close != tc.close {
				t.Errorf("got status %d, type %q, body %q, length %d, chunked %v, close %v",
					resp.StatusCode, resp.Header.Get("Content-Type"), body, resp.ContentLength, isChunked(resp), resp.Close)
			}
			if toTheEnd {
				return
			}
			// Nothing of the answer is left: the next one on the
			// connection reads whole.
			if resp, body, err := readAll(t, br, http.MethodPost); err != nil || resp.StatusCode != 200 || body != "next" {
				t.Errorf("the next answer: %v, %q, %v", resp, body, err)
			}
		})
	}
}

// What the gateway cannot frame for sure, it refuses.
func TestReadResponseHostile(t *testing.T) {
	for _, in := range []string{
		"",
		"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n",
		"garbage\r\n\r\n",
		"HTTP/2 200 OK\r\n\r\n",
		"HTTP/1.1 20 OK\r\n\r\n",
		"HTTP/1.1 2000 OK\r\n\r\n",
		"HTTP/1.1 abc OK\r\n\r\n",
		"HTTP/1.1 099 Low\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello",
		"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
		"HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n Content-Length: 2\r\n\r\na",
		"HTTP/1.1 200 OK\r\nNo colon\r\n\r\n",
		"HTTP/1.1 200 OK\r\n: empty name\r\n\r\n",
		"HTTP/1.1 200 OK\r\nBad Name: x\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Type: text/plain\x00\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nab\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: " + strings.Repeat("t", maxTrailer) + "\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: 1\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: " + strings.Repeat("t", 2000) + "\r\nY: " + strings.Repeat("t", 2000) + "\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: " + strings.Repeat("t", 1000) + "\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: " + strings.Repeat("t", 1<<20),
	} {
		br := bufio.NewReaderSize(strings.NewReader(in), connReadBuffer)
		if resp, body, err := readAll(t, br, http.MethodPost); err == nil {
			t.Errorf("%.70q: accepted, status %d body %q", in, resp.StatusCode, body)
		}
	}
}

// FuzzReadResponse holds readResponse to net/http's reading of the same
// bytes: whatever it accepts, net/http accepts too and reads the same way.
func FuzzReadResponse(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{\"a\":1}",
		"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n6\r\ndata: \r\n0\r\nA: b\r\n\r\n",
		"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\na",
		"HTTP/1.1 204 No Content\r\n\r\n",
		"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n",
		"HTTP/1.1 500 Oops\r\nConnection: close\r\n\r\nbody",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 64<<10 {
			return
		}
		br := bufio.NewReaderSize(bytes.NewReader(in), connReadBuffer)
		resp, err := readResponse(br, http.MethodPost)
		if err != nil {
			return
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return
		}
		want, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(in)), &http.Request{Method: http.MethodPost})
		if err != nil {
			t.Fatalf("net/http refused what readResponse accepted: %v", err)
		}
		wantBody, err := io.ReadAll(want.Body)
		if err != nil {
			t.Fatalf("net/http could not read the body readResponse read (%q): %v", body, err)
		}
		// Without a body (1xx, 204, 304), how one would have been framed
		// does not matter.
		noBody := want.StatusCode < 200 || want.StatusCode == 204 || want.StatusCode == 304
		if resp.StatusCode != want.StatusCode || resp.Header.Get("Content-Type") != want.Header.Get("Content-Type") ||
			string(body) != string(wantBody) || resp.Close != want.Close || (!noBody && isChunked(resp) != isChunked(want)) ||
			(want.ContentLength >= 0 && resp.ContentLength != want.ContentLength) {
			t.Fatalf("readResponse: %d %q %q length %d close %v chunked %v; net/http: %d %q %q length %d close %v chunked %v",
				resp.StatusCode, resp.Header.Get("Content-Type"), body, resp.ContentLength, resp.Close, isChunked(resp),
				want.StatusCode, want.Header.Get("Content-Type"), wantBody, want.ContentLength, want.Close, isChunked(want))
		}
	})
}

// BenchmarkReadResponse compares readResponse with net/http's reading of
// the head of an answer as vLLM sends it.
func BenchmarkReadResponse(b *testing.B) {
	head := "HTTP/1.1 200 OK\r\ndate: Thu, 03 Dec 2026 07:00:00 GMT\r\nserver: uvicorn\r\ncontent-length: 7\r\n" +
		"content-type: application/json\r\nx-request-id: 0123456789abcdef0123456789abcdef\r\n\r\n{\"a\":1}"
	r := strings.NewReader(head)
	br := bufio.NewReaderSize(r, connReadBuffer)
	for _, bc := range []struct {
		name string
		read func() (*http.Response, error)
	}{
		{"moonji", func() (*http.Response, error) { return readResponse(br, http.MethodPost) }},
		{"net-http", func() (*http.Response, error) { return http.ReadResponse(br, &http.Request{Method: http.MethodPost}) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r.Reset(head)
				br.Reset(r)
				resp, err := bc.read()
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
			}
		})
	}
}
