package proxy

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
)

// Upstream is one engine's OpenAI-compatible base URL (ending in /v1).
type Upstream struct {
	Name    string
	BaseURL string
	APIKey  string
	// RootCAs, when set, are the only certificates an https engine's
	// chain may end in, instead of the system's roots: a backend's ca_file
	// (LoadCAFile), for an engine whose certificate a private CA signed.
	RootCAs *x509.CertPool
}

// LoadCAFile reads the PEM certificates of a file (a backend's ca_file)
// into a pool for Upstream.RootCAs. A file that holds none is an error.
func LoadCAFile(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA file %s: no PEM certificate in it", path)
	}
	return pool, nil
}

// Client calls engines. One is shared by all backends: it keeps
// connections warm per engine (transport.go).
type Client struct {
	t *transport
}

// NewClient returns a client whose connections fail fast when an engine is
// down (5 s to connect) and stay open for reuse under load. Engines are
// reached directly, never through HTTP_PROXY, over HTTP/1.1, without
// compression (frames must pass through as they come).
func NewClient() *Client {
	return &Client{t: newTransport()}
}

// CloseIdleConnections closes the connections kept for reuse.
func (c *Client) CloseIdleConnections() { c.t.closeIdle() }

// ErrEngineDisconnected is wrapped by the errors of an engine backend whose
// link lost the connection that carried the request while it ran.
var ErrEngineDisconnected = errors.New("engine_disconnected")

// ErrEngineUnavailable is wrapped by the errors of an engine backend that
// never sent the request: the engine was not connected and the link's queue
// was full, or the request waited for a connection longer than its TTL.
var ErrEngineUnavailable = errors.New("engine_unavailable")

// UpstreamError is a failure to get an answer from an engine.
type UpstreamError struct {
	Status  int // 502 or 504
	Backend string
	Err     error
}

func (e *UpstreamError) Error() string {
	return fmt.Sprintf("backend %s: %v", e.Backend, e.Err)
}

func (e *UpstreamError) Unwrap() error { return e.Err }

// ChatCompletions posts body to the engine's /chat/completions. The caller
// closes the response body; cancelling ctx aborts the engine's request.
func (c *Client) ChatCompletions(ctx context.Context, up Upstream, body []byte) (*http.Response, error) {
	return c.do(ctx, up, http.MethodPost, "/chat/completions", body, "", nil)
}

// Do sends a request without a body (GET, DELETE) to path under the
// engine's base URL.
func (c *Client) Do(ctx context.Context, up Upstream, method, path string) (*http.Response, error) {
	return c.do(ctx, up, method, path, nil, "", nil)
}

// Post posts body to the engine's endpoint of api.
func (c *Client) Post(ctx context.Context, up Upstream, api API, body []byte) (*http.Response, error) {
	return c.do(ctx, up, http.MethodPost, api.Path(), body, "", nil)
}

// PostSent is Post, calling sent once the whole request is written and
// before the engine's answer is waited for: work that needs not come before
// the engine has the request runs while the engine works on it. sent is
// not called when the request could not be written, and is called again
// when it is written a second time (once more, on a new connection, after
// a kept-alive one turned out closed): it must bear that.
func (c *Client) PostSent(ctx context.Context, up Upstream, api API, body []byte, sent func()) (*http.Response, error) {
	return c.do(ctx, up, http.MethodPost, api.Path(), body, "", sent)
}

// PostSentTraced is PostSent with a W3C traceparent header (when not
// empty): the engine's own spans, if it traces, join the gateway's trace.
func (c *Client) PostSentTraced(ctx context.Context, up Upstream, api API, body []byte, traceparent string, sent func()) (*http.Response, error) {
	return c.do(ctx, up, http.MethodPost, api.Path(), body, traceparent, sent)
}

func (c *Client) do(ctx context.Context, up Upstream, method, path string, body []byte, traceparent string, sent func()) (*http.Response, error) {
	tg, err := c.t.target(up.BaseURL, up.RootCAs)
	if err != nil {
		return nil, &UpstreamError{Status: http.StatusBadGateway, Backend: up.Name, Err: fmt.Errorf("base URL %q: %w", up.BaseURL, err)}
	}
	if !validToken(path) || !validToken(up.APIKey) || !validToken(traceparent) {
		return nil, fmt.Errorf("build request for backend %s: a control character or space in the path, key or traceparent", up.Name)
	}
	hb := headerBufs.Get().(*[]byte)
	header := requestHeader((*hb)[:0], method, tg, path, up.APIKey, traceparent, len(body))
	resp, err := c.t.roundTrip(ctx, tg, method, header, body, sent)
	*hb = header
	headerBufs.Put(hb)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		status := http.StatusBadGateway
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			status = http.StatusGatewayTimeout
		}
		return nil, &UpstreamError{Status: status, Backend: up.Name, Err: err}
	}
	return resp, nil
}

// headerBufs holds the buffers requests' headers are built in.
var headerBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// validToken tells that s can go into a request line or header as is: no
// space or control character that would end or split it.
func validToken(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] == 0x7f {
			return false
		}
	}
	return true
}
