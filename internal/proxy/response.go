package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
)

// readResponse reads an engine's status line and headers from br, and sets
// up the body's reader. It is http.ReadResponse cut to what the gateway
// uses: the status, Content-Type, and what frames the body
// (Content-Length, Transfer-Encoding, Connection). Every other header is
// read past, not kept: net/http's copy of them into a map of canonical
// names was a fifth of the bytes a proxied request allocated, and the
// gateway sends the client none of them.
//
// It refuses what it does not understand rather than guess, as net/http
// does: a malformed status line or header, a Transfer-Encoding other than
// chunked, Content-Lengths that disagree, and also a header folded over
// lines (obsolete since RFC 7230), which net/http would join.
func readResponse(br *bufio.Reader, method string) (*http.Response, error) {
	line, err := readLine(br)
	if err != nil {
		return nil, err
	}
	resp := &http.Response{ContentLength: -1}
	if err := parseStatusLine(resp, line); err != nil {
		return nil, err
	}
	var (
		chunked, closing, keepAlive bool
		contentType                 string
		haveCT                      bool
	)
	for {
		line, err := readLine(br)
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		if len(line) == 0 {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			return nil, errors.New("malformed engine response: a header folded over lines")
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || !validHeaderName(line[:colon]) {
			return nil, fmt.Errorf("malformed engine response header %q", clip(line))
		}
		name, value := line[:colon], bytes.Trim(line[colon+1:], " \t")
		if !validHeaderValue(value) {
			return nil, fmt.Errorf("malformed engine response header %q", clip(line))
		}
		switch {
		case asciiEqualFold(name, "Content-Type"):
			if !haveCT { // the first one counts, as with Header.Get
				contentType, haveCT = internedType(value), true
			}
		case asciiEqualFold(name, "Content-Length"):
			n, ok := parseLength(value)
			if !ok {
				return nil, fmt.Errorf("bad Content-Length %q from the engine", clip(value))
			}
			if resp.ContentLength >= 0 && resp.ContentLength != n {
				return nil, errors.New("engine sent Content-Lengths that disagree")
			}
			resp.ContentLength = n
		case asciiEqualFold(name, "Transfer-Encoding"):
			if !asciiEqualFold(value, "chunked") || chunked {
				return nil, fmt.Errorf("unsupported Transfer-Encoding %q from the engine", clip(value))
			}
			chunked = true
		case asciiEqualFold(name, "Connection"):
			closing = closing || hasToken(value, "close")
			keepAlive = keepAlive || hasToken(value, "keep-alive")
		}
	}
	if haveCT {
		resp.Header = http.Header{"Content-Type": {contentType}}
	} else {
		resp.Header = http.Header{}
	}
	// HTTP/1.0 closes unless asked not to; HTTP/1.1 keeps the connection
	// unless told to close it.
	resp.Close = closing || (resp.ProtoMinor == 0 && !keepAlive)
	switch {
	case method == http.MethodHead || resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified ||
		(resp.StatusCode >= 100 && resp.StatusCode < 200):
		resp.ContentLength = 0
		resp.Body = http.NoBody
	case chunked:
		if resp.ProtoMinor == 0 {
			return nil, errors.New("engine sent a chunked HTTP/1.0 response")
		}
		// A chunked body's length is its chunks', whatever Content-Length says.
		resp.ContentLength = -1
		resp.TransferEncoding = chunkedEncoding
		resp.Body = &chunkedBody{br: br, r: httputil.NewChunkedReader(br)}
	case resp.ContentLength == 0:
		resp.Body = http.NoBody
	case resp.ContentLength > 0:
		resp.Body = &lengthBody{r: br, n: resp.ContentLength}
	default:
		// No length: the body runs to the end of the connection.
		resp.Close = true
		resp.Body = io.NopCloser(br)
	}
	return resp, nil
}

var chunkedEncoding = []string{"chunked"}

// parseStatusLine reads "HTTP/1.1 200 OK" into resp.
func parseStatusLine(resp *http.Response, line []byte) error {
	// "HTTP/1.x NNN" and an optional " reason".
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || (line[7] != '0' && line[7] != '1') ||
		line[8] != ' ' || (len(line) > 12 && line[12] != ' ') {
		return fmt.Errorf("malformed engine response status line %q", clip(line))
	}
	code := 0
	for _, c := range line[9:12] {
		if c < '0' || c > '9' {
			return fmt.Errorf("malformed engine response status line %q", clip(line))
		}
		code = code*10 + int(c-'0')
	}
	if code < 100 {
		return fmt.Errorf("engine answered status %d", code)
	}
	resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.1", 1, 1
	if line[7] == '0' {
		resp.Proto, resp.ProtoMinor = "HTTP/1.0", 0
	}
	resp.StatusCode = code
	if code < len(statusLines) && statusLines[code] != "" && string(line[9:]) == statusLines[code] {
		resp.Status = statusLines[code]
	} else {
		resp.Status = string(line[9:])
	}
	return nil
}

// statusLines holds "200 OK" and the like, so that a status line in its
// usual words costs no allocation.
var statusLines = func() (s [600]string) {
	for code := range s {
		if text := http.StatusText(code); text != "" {
			s[code] = strconv.Itoa(code) + " " + text
		}
	}
	return s
}()

// internedType returns v as a string, without allocating for the content
// types engines send.
func internedType(v []byte) string {
	for _, t := range commonTypes {
		if string(v) == t {
			return t
		}
	}
	return string(v)
}

var commonTypes = [...]string{"application/json", "text/event-stream", "text/event-stream; charset=utf-8",
	"application/json; charset=utf-8", "text/plain; charset=utf-8"}

// parseLength reads a Content-Length: decimal digits only, below 2^62.
func parseLength(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// readLine returns the next line of br without its line ending (LF or CR
// LF). The slice is valid until the next read. A line longer than br's
// buffer is read in pieces into a larger buffer; the caller's limitedReader
// bounds how much in all.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := readRawLine(br, -1)
	if err != nil {
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// errLineTooLong is readRawLine's answer to a line past its limit.
var errLineTooLong = errors.New("line too long")

// readRawLine returns the next line of br with its LF. The slice is valid
// until the next read. A line longer than br's buffer is read in pieces
// into a larger buffer, up to limit bytes (no bound when limit is negative).
func readRawLine(br *bufio.Reader, limit int) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		long := append([]byte(nil), line...)
		for err == bufio.ErrBufferFull {
			if limit >= 0 && len(long) > limit {
				return nil, errLineTooLong
			}
			line, err = br.ReadSlice('\n')
			long = append(long, line...)
		}
		line = long
	}
	if err != nil {
		if err == io.EOF && len(line) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	if limit >= 0 && len(line) > limit {
		return nil, errLineTooLong
	}
	return line, nil
}

// validHeaderName tells that b is an HTTP token (RFC 9110, section 5.1).
func validHeaderName(b []byte) bool {
	for _, c := range b {
		if !tokenChar[c] {
			return false
		}
	}
	return true
}

var tokenChar = func() (t [256]bool) {
	for c := '!'; c < 0x7f; c++ {
		t[c] = !strings.ContainsRune(`"(),/:;<=>?@[\]{}`, c)
	}
	return t
}()

// validHeaderValue tells that b holds no control character but tab.
func validHeaderValue(b []byte) bool {
	for _, c := range b {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// asciiEqualFold compares b and s ignoring ASCII case. bytes.EqualFold
// folds Unicode too (the Kelvin sign is a k there), as HTTP does not.
func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		x, y := b[i], s[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// hasToken tells whether the comma-separated list v holds token.
func hasToken(v []byte, token string) bool {
	for len(v) > 0 {
		item := v
		if i := bytes.IndexByte(v, ','); i >= 0 {
			item, v = v[:i], v[i+1:]
		} else {
			v = nil
		}
		if asciiEqualFold(bytes.Trim(item, " \t"), token) {
			return true
		}
	}
	return false
}

// clip shortens what goes into an error message.
func clip(b []byte) string {
	if len(b) > 64 {
		return string(b[:64]) + "…"
	}
	return string(b)
}

// lengthBody is a body of a known length.
type lengthBody struct {
	r io.Reader
	n int64
}

func (b *lengthBody) Read(p []byte) (int, error) {
	if b.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.r.Read(p)
	b.n -= int64(n)
	if err == io.EOF {
		if b.n > 0 {
			err = io.ErrUnexpectedEOF
		} else {
			err = nil
		}
	}
	if b.n == 0 && err == nil {
		return n, io.EOF
	}
	return n, err
}

func (b *lengthBody) Close() error { return nil }

// chunkedBody is a chunked body. After the last chunk it reads the
// trailer section too, up to its blank line, so that a connection goes back
// to the pool with nothing of this answer left in its buffer.
type chunkedBody struct {
	br   *bufio.Reader
	r    io.Reader
	done bool
}

// maxTrailer bounds the trailer section the engine may send after its last
// chunk; net/http allows what fits in its 4 KiB buffer.
const maxTrailer = 3 << 10

func (b *chunkedBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	n, err := b.r.Read(p)
	if err == io.EOF {
		if terr := b.readTrailer(); terr != nil {
			return n, terr
		}
		b.done = true
	}
	return n, err
}

func (b *chunkedBody) readTrailer() error {
	read := 0
	for {
		line, err := readRawLine(b.br, maxTrailer-read+len(crlf))
		if err == errLineTooLong {
			return errors.New("engine's chunked body trailer too large")
		}
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("engine's chunked body trailer: %w", err)
		}
		// Each line ends in CR LF here, as net/http requires of trailers.
		if !bytes.HasSuffix(line, crlf) {
			return errors.New("malformed trailer after the engine's chunked body")
		}
		line = line[:len(line)-2]
		if len(line) == 0 {
			return nil
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || !validHeaderName(line[:colon]) || !validHeaderValue(line[colon+1:]) {
			return errors.New("malformed trailer after the engine's chunked body")
		}
		if read += len(line); read > maxTrailer {
			return errors.New("engine's chunked body trailer too large")
		}
	}
}

var crlf = []byte("\r\n")

func (b *chunkedBody) Close() error { return nil }
