package enginelink

import (
	"errors"
	"fmt"
	"net/http"

	"moonji/internal/proxy"
)

// Why a session ends without its answer. The texts start with the reason
// code a ledger row or a log would carry; those the gateway records by
// reason wrap proxy.ErrEngineDisconnected (the request was sent and lost)
// or proxy.ErrEngineUnavailable (it was never sent).
var (
	// ErrDisconnected: the connection that carried the session's request
	// closed before the answer ended.
	ErrDisconnected = fmt.Errorf("%w: the connection to the engine closed", proxy.ErrEngineDisconnected)
	// ErrExpired: the engine was not connected while the request waited in
	// the queue, for longer than the message TTL.
	ErrExpired = fmt.Errorf("%w: the request expired in the queue before the engine was reachable", proxy.ErrEngineUnavailable)
	// ErrQueueFull: the engine is not connected and the queue holds as many
	// requests as it may.
	ErrQueueFull = fmt.Errorf("%w: the engine is not connected and the queue of waiting requests is full", proxy.ErrEngineUnavailable)
	// ErrClosed: the link was closed (shutdown).
	ErrClosed = errors.New("engine_link_closed: the link to the engine was closed")
	// ErrSlowReader: the session's reader fell behind the engine by more
	// than the per-session buffer.
	ErrSlowReader = errors.New("slow_reader: the session's buffer of engine replies is full")
	// ErrBodyClosed: the caller closed the response body before its end.
	ErrBodyClosed = errors.New("client_closed: the response body was closed before its end")
)

// EngineError is a session the engine ended with chat.error, or one it broke
// the protocol in (Code "protocol_error").
type EngineError struct {
	Status  int
	Code    string
	Message string
}

func (e *EngineError) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("engine error %d: %s", e.Status, e.Message)
	}
	return fmt.Sprintf("engine error %d %s: %s", e.Status, e.Code, e.Message)
}

// protocolError is an engine's breach of the protocol inside one session: it
// fails that session only.
func protocolError(format string, args ...any) error {
	return &EngineError{Status: http.StatusBadGateway, Code: "protocol_error", Message: fmt.Sprintf(format, args...)}
}

// upstream wraps an error that ends a call before any answer as the
// proxy.Client's callers expect it: a *proxy.UpstreamError whose status is
// the engine's own for a chat.error, 503 when the engine could not be
// reached in time, 502 otherwise.
func (l *Link) upstream(err error) error {
	status := http.StatusBadGateway
	var ee *EngineError
	switch {
	case errors.As(err, &ee):
		status = ee.Status
	case errors.Is(err, ErrQueueFull), errors.Is(err, ErrExpired):
		status = http.StatusServiceUnavailable
	}
	return &proxy.UpstreamError{Status: status, Backend: l.opts.Name, Err: err}
}
