package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"
)

// Upstream is one engine's OpenAI-compatible base URL (ending in /v1).
type Upstream struct {
	Name    string
	BaseURL string
	APIKey  string
}

// Client calls engines. One is shared by all backends: its transport keeps
// connections warm per host.
type Client struct {
	hc *http.Client
}

// NewClient returns a client whose connections fail fast when an engine is
// down and stay open for reuse under load.
func NewClient() *Client {
	tr := &http.Transport{
		Proxy:                 nil, // engines are reached directly, never through HTTP_PROXY
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		// Compression would make the transport buffer and decode the SSE
		// stream; frames must pass through as they come.
		DisableCompression: true,
		ForceAttemptHTTP2:  false,
		// A connection keeps both buffers for its life, and there is one
		// connection per running stream. The relay reads through a buffer
		// of its own (bufio.Reader reads past a smaller one straight into
		// the caller's), so this one serves only status line, headers and
		// chunk sizes; the write buffer holds a request's headers, and a
		// larger body goes out in a few writes. 4 KiB each by default.
		ReadBufferSize:  1 << 10,
		WriteBufferSize: 2 << 10,
	}
	return &Client{hc: &http.Client{Transport: tr}}
}

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
	return c.do(ctx, up, http.MethodPost, "/chat/completions", body)
}

// Do sends a request without a body (GET, DELETE) to path under the
// engine's base URL.
func (c *Client) Do(ctx context.Context, up Upstream, method, path string) (*http.Response, error) {
	return c.do(ctx, up, method, path, nil)
}

// Post posts body to the engine's endpoint of api.
func (c *Client) Post(ctx context.Context, up Upstream, api API, body []byte) (*http.Response, error) {
	return c.do(ctx, up, http.MethodPost, api.Path(), body)
}

func (c *Client) do(ctx context.Context, up Upstream, method, path string, body []byte) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(up.BaseURL, "/")+path, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("build request for backend %s: %w", up.Name, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if up.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+up.APIKey)
	}
	resp, err := c.hc.Do(req)
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
