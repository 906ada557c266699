package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// transport is the engine client's HTTP/1.1 connection pool (its limits
// are in doc.go). net/http's Transport keeps two goroutines and a write
// buffer per connection for its life, and hands every response over
// between goroutines; a gateway holds one connection per running stream,
// so those two goroutines were half of the goroutines, and much of the
// memory, that an open stream cost. Here a request is written and its
// answer read on the caller's goroutine, and cancelling the context closes
// the connection through context.AfterFunc, which costs no goroutine while
// it waits. The answer's status and the few headers the gateway uses are
// read by readResponse (response.go).
type transport struct {
	dialer  net.Dialer
	mu      sync.Mutex
	idle    map[string][]*engineConn // per target, oldest first
	nIdle   int
	sweeper *time.Timer
	targets sync.Map // targetKey → *target
}

// Pool limits, as the net/http Transport had them.
const (
	maxIdlePerHost = 256
	maxIdle        = 1024
	idleTimeout    = 90 * time.Second
	// connReadBuffer serves status lines, headers and chunk sizes; the
	// relay reads bodies through a buffer of its own (bufio.Reader reads
	// past a smaller one straight into the caller's).
	connReadBuffer = 512
	// maxResponseHeader bounds an engine's status line and headers.
	maxResponseHeader = 1 << 20
)

func newTransport() *transport {
	return &transport{
		dialer: net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second},
		idle:   map[string][]*engineConn{},
	}
}

// target is an engine base URL, parsed once.
type target struct {
	key      string      // scheme://host:port (and the roots, if its own), the pool's key
	tls      *tls.Config // nil: plain HTTP
	hostPort string
	host     string // Host header
	path     string // base path, without a trailing slash
}

// targetKey is what a target is parsed from.
type targetKey struct {
	base  string
	roots *x509.CertPool // nil: the system's
}

func (t *transport) target(base string, roots *x509.CertPool) (*target, error) {
	k := targetKey{base, roots}
	if v, ok := t.targets.Load(k); ok {
		return v.(*target), nil
	}
	u, err := url.Parse(strings.TrimRight(base, "/"))
	if err != nil {
		return nil, err
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("unsupported scheme %q", u.Scheme)
	}
	if u.Host == "" {
		return nil, errors.New("no host")
	}
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
	}
	tg := &target{hostPort: net.JoinHostPort(u.Hostname(), port), host: u.Host, path: u.EscapedPath()}
	tg.key = u.Scheme + "://" + tg.hostPort
	if u.Scheme == "https" {
		// ALPN offers HTTP/1.1 alone, so that an engine that also speaks
		// HTTP/2 answers in HTTP/1.1.
		tg.tls = &tls.Config{ServerName: u.Hostname(), NextProtos: []string{"http/1.1"}, RootCAs: roots}
		if roots != nil {
			// A connection checked against one backend's CAs is not
			// another's to take, even to the same host.
			tg.key += fmt.Sprintf(" roots=%p", roots)
		}
	}
	t.targets.Store(k, tg)
	return tg, nil
}

// engineConn is one connection to an engine.
type engineConn struct {
	net.Conn
	br     *bufio.Reader
	lim    limitedReader
	key    string
	reused bool
	idleAt time.Time
	// out and outBufs hold a request while it is written: fields, so that
	// writing one allocates nothing.
	out     net.Buffers
	outBufs [2][]byte
	// rest is the last answer's body when the answer was over but the
	// body's end had not arrived when it was closed (engineBody.close): it
	// is read when the connection is next taken (finishAnswer).
	rest io.Reader
}

// limitedReader bounds what may be read while headers are parsed.
type limitedReader struct {
	r io.Reader
	n int64 // < 0: no limit
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n < 0 {
		return l.r.Read(p)
	}
	if l.n == 0 {
		return 0, errors.New("engine's response header too large")
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}

// roundTrip sends one request and reads its answer's header. The body is
// read on the caller's goroutine; the connection goes back to the pool
// once the body was read to its end and closed.
func (t *transport) roundTrip(ctx context.Context, tg *target, method string, header, body []byte, sent func()) (*http.Response, error) {
	for attempt := 0; ; attempt++ {
		get := t.get
		if attempt > 0 {
			get = t.dial // the retry: not another idle connection, that may be stale too
		}
		ec, err := get(ctx, tg)
		if err != nil {
			return nil, err
		}
		// Cancelling ctx closes the connection: a write or read in progress
		// fails at once, and the engine sees its client leave.
		stop := context.AfterFunc(ctx, func() { ec.Conn.Close() })
		resp, err := ec.exchange(method, header, body, sent)
		if err != nil {
			stop()
			ec.Conn.Close()
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			// A kept-alive connection the engine closed while it sat idle
			// fails before any answer: send again, once, on a new one. The
			// engine never saw the request (it had closed the connection).
			if ec.reused && attempt == 0 && isStale(err) {
				continue
			}
			return nil, err
		}
		resp.Body = &engineBody{rc: resp.Body, ctx: ctx, ec: ec, t: t, stop: stop,
			reusable: !resp.Close && (resp.ContentLength >= 0 || isChunked(resp)) && method != http.MethodHead &&
				resp.StatusCode != http.StatusSwitchingProtocols}
		return resp, nil
	}
}

// exchange writes the request and reads the answer's status and headers.
func (ec *engineConn) exchange(method string, header, body []byte, sent func()) (*http.Response, error) {
	if err := ec.write(header, body); err != nil {
		return nil, err
	}
	if sent != nil {
		sent()
	}
	ec.lim.n = maxResponseHeader
	defer func() { ec.lim.n = -1 }()
	for {
		resp, err := readResponse(ec.br, method)
		if err != nil {
			return nil, err
		}
		// An interim answer (103 Early Hints, a 100 never asked for) comes
		// before the real one, as net/http's Transport skips them.
		if resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
			continue
		}
		return resp, nil
	}
}

// write writes a request's header and body, in one writev(2) on a plain
// connection (net.Buffers), in two writes over TLS.
func (ec *engineConn) write(header, body []byte) error {
	ec.outBufs = [2][]byte{header, body}
	ec.out = ec.outBufs[:1]
	if len(body) > 0 {
		ec.out = ec.outBufs[:2]
	}
	_, err := ec.out.WriteTo(ec.Conn)
	ec.out, ec.outBufs = nil, [2][]byte{} // a kept connection holds no request
	return err
}

func isStale(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func isChunked(resp *http.Response) bool {
	return len(resp.TransferEncoding) > 0 && resp.TransferEncoding[0] == "chunked"
}

// get takes an idle connection to tg, the newest first, or dials one.
func (t *transport) get(ctx context.Context, tg *target) (*engineConn, error) {
	now := time.Now()
	wait := endWait
	for {
		t.mu.Lock()
		l := t.idle[tg.key]
		if len(l) == 0 {
			t.mu.Unlock()
			return t.dial(ctx, tg)
		}
		ec := l[len(l)-1]
		t.idle[tg.key] = l[:len(l)-1]
		t.nIdle--
		t.mu.Unlock()
		ok := now.Sub(ec.idleAt) < idleTimeout
		if ok && ec.rest != nil {
			ok = ec.finishAnswer(wait)
			// One wait per request: an engine that did not end one answer
			// is unlikely to have ended the others, and a pool of such
			// connections must not cost a request a wait for each.
			wait = 0
		}
		if ok {
			ec.reused = true
			return ec, nil
		}
		ec.Conn.Close()
	}
}

// finishAnswer reads the end of the connection's last answer, which had
// not come when that answer was over (engineBody.close), and reports
// whether the connection can carry another request. By the time it is
// taken again the end has almost always arrived (one read(2) finds it);
// an engine that has not sent it within wait more is not one to keep a
// connection with. With wait 0 only what is already buffered counts.
func (ec *engineConn) finishAnswer(wait time.Duration) bool {
	rest := ec.rest
	ec.rest = nil
	return drainArrived(ec, rest, wait) && ec.br.Buffered() == 0
}

// endWait bounds how long a request may wait for the end of the last
// answer of a connection it takes from the pool (finishAnswer): the end
// comes microseconds after the answer's last frame, and the next request
// rarely comes that soon. A variable for tests.
var endWait = time.Millisecond

func (t *transport) dial(ctx context.Context, tg *target) (*engineConn, error) {
	c, err := t.dialer.DialContext(ctx, "tcp", tg.hostPort)
	if err != nil {
		return nil, err
	}
	if tg.tls != nil {
		tc := tls.Client(c, tg.tls)
		if err := tc.HandshakeContext(ctx); err != nil {
			c.Close()
			return nil, err
		}
		c = tc
	}
	ec := &engineConn{Conn: c, key: tg.key}
	ec.lim = limitedReader{r: c, n: -1}
	ec.br = bufio.NewReaderSize(&ec.lim, connReadBuffer)
	return ec, nil
}

// put keeps a connection for the next request to its engine, or closes it
// when the pool is full.
func (t *transport) put(ec *engineConn) {
	if ec.br.Buffered() > 0 {
		ec.Conn.Close() // bytes past the answer: not a connection to trust
		return
	}
	ec.idleAt = time.Now()
	t.mu.Lock()
	l := t.idle[ec.key]
	if len(l) >= maxIdlePerHost || t.nIdle >= maxIdle {
		t.mu.Unlock()
		ec.Conn.Close()
		return
	}
	t.idle[ec.key] = append(l, ec)
	t.nIdle++
	if t.sweeper == nil {
		t.sweeper = time.AfterFunc(idleTimeout, t.sweep)
	}
	t.mu.Unlock()
}

// sweep closes the connections idle for longer than idleTimeout; it runs
// while any connection is idle.
func (t *transport) sweep() {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	for key, l := range t.idle {
		n := 0
		for n < len(l) && now.Sub(l[n].idleAt) >= idleTimeout {
			l[n].Conn.Close()
			n++
		}
		t.nIdle -= n
		if n == len(l) {
			delete(t.idle, key)
		} else {
			t.idle[key] = append(l[:0], l[n:]...)
		}
	}
	if t.nIdle > 0 {
		t.sweeper.Reset(idleTimeout / 3)
	} else {
		t.sweeper = nil
	}
}

// closeIdle closes every idle connection.
func (t *transport) closeIdle() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for key, l := range t.idle {
		for _, ec := range l {
			ec.Conn.Close()
		}
		delete(t.idle, key)
	}
	t.nIdle = 0
}

// engineBody is an answer's body on its connection. Read to its end, the
// connection goes back to the pool; closed before, it is closed (what is
// left of the answer cannot be skipped cheaply, and closing is how the
// engine learns its client left).
type engineBody struct {
	rc       io.ReadCloser
	ctx      context.Context
	ec       *engineConn
	t        *transport
	stop     func() bool
	reusable bool
	eof      atomic.Bool
	closed   atomic.Bool // Close may come from another goroutine than Read
}

func (b *engineBody) Read(p []byte) (int, error) {
	if b.closed.Load() {
		return 0, errors.New("read on a closed engine body")
	}
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.eof.Store(true)
	} else if err != nil && b.ctx.Err() != nil {
		err = b.ctx.Err() // the connection was closed because ctx ended
	}
	return n, err
}

// FrameBuffered tells whether a whole server-sent event — its ending blank
// line, two line feeds — came with the answer's header and sits in the
// connection's buffer, so that reading the first frame will not wait on the
// engine. Only LF LF counts: a chunked body's framing (CR LF) never makes
// one, so it can only be the event's own end.
func (b *engineBody) FrameBuffered() bool {
	n := b.ec.br.Buffered()
	if n == 0 {
		return false
	}
	p, err := b.ec.br.Peek(n)
	return err == nil && bytes.Contains(p, lfLF)
}

var lfLF = []byte("\n\n")

func (b *engineBody) Close() error { return b.close(false) }

// CloseAnswer closes an engine's answer body. ended says that the answer
// is over as far as its API goes (RelayResult.Ended: a stream's last frame
// was read), so that nothing follows but the end of the body, a chunked
// body's last, empty chunk. Engines often write that end apart from the
// last frame (Go's net/http when the handler returns, uvicorn's h11), and
// it may not have arrived yet; then the connection is kept all the same
// and the end read when the connection is next taken, instead of closing
// a good connection and making the next request dial a new one. A body
// that is not an engine's is closed.
func CloseAnswer(body io.Closer, ended bool) error {
	if b, ok := body.(*engineBody); ok {
		return b.close(ended)
	}
	return body.Close()
}

func (b *engineBody) close(ended bool) error {
	if b.closed.Swap(true) {
		return nil
	}
	// stop reports false when ctx already ended and closed the connection.
	if !b.stop() || !b.reusable {
		return b.ec.Conn.Close()
	}
	switch {
	case b.eof.Load():
	case ended && b.ec.br.Buffered() == 0:
		b.ec.rest = b.rc // its end has not been read yet: finishAnswer
	case !drainArrived(b.ec, b.rc, 0):
		// Closed before the answer's end: what is left of it cannot be
		// skipped cheaply, and closing is how the engine learns its client
		// left.
		return b.ec.Conn.Close()
	}
	b.t.put(b.ec)
	return nil
}

// drainArrived reads what is left of an answer's body from rest, and
// reports whether it came to its end. With wait 0 it reads only what the
// connection's buffer holds (a read past its deadline fails before it
// reaches the socket); otherwise it reads the socket too, waiting at most
// wait for bytes still to come.
func drainArrived(ec *engineConn, rest io.Reader, wait time.Duration) bool {
	if ec.Conn.SetReadDeadline(time.Now().Add(wait)) != nil {
		return false
	}
	n, err := io.CopyN(io.Discard, rest, 256)
	if err != io.EOF || n >= 256 {
		return false
	}
	return ec.Conn.SetReadDeadline(time.Time{}) == nil
}

// requestHeader is the request line and headers of a call to an engine.
func requestHeader(dst []byte, method string, tg *target, path, apiKey, traceparent string, contentLength int) []byte {
	dst = append(dst, method...)
	dst = append(dst, ' ')
	dst = append(dst, tg.path...)
	dst = append(dst, path...)
	dst = append(dst, " HTTP/1.1\r\nHost: "...)
	dst = append(dst, tg.host...)
	dst = append(dst, "\r\nUser-Agent: moonji\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"...)
	if apiKey != "" {
		dst = append(dst, "Authorization: Bearer "...)
		dst = append(dst, apiKey...)
		dst = append(dst, "\r\n"...)
	}
	if traceparent != "" {
		dst = append(dst, "Traceparent: "...)
		dst = append(dst, traceparent...)
		dst = append(dst, "\r\n"...)
	}
	if contentLength > 0 || method == http.MethodPost {
		dst = append(dst, "Content-Length: "...)
		dst = strconv.AppendInt(dst, int64(contentLength), 10)
		dst = append(dst, "\r\n"...)
	}
	return append(dst, "\r\n"...)
}
