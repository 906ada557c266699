package handlers

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"
)

// BodyError says why a request body was refused, and how to answer.
type BodyError struct {
	Status  int
	Reason  string // the ledger's reason
	Code    string // OpenAI's error code
	Message string
}

func (e *BodyError) Error() string { return e.Message }

func asBodyError(err error) *BodyError {
	if be, ok := err.(*BodyError); ok {
		return be
	}
	return &BodyError{Status: http.StatusBadRequest, Reason: "invalid_request", Code: "invalid_request", Message: err.Error()}
}

func bodyTooLarge(limit int64) *BodyError {
	return &BodyError{Status: http.StatusRequestEntityTooLarge, Reason: "body_too_large", Code: "request_too_large",
		Message: fmt.Sprintf("The request body is larger than this gateway's limit of %d bytes.", limit)}
}

// readAhead is how much of a body fasthttp reads with the headers, before
// any handler runs, when it streams request bodies (8 KiB in
// readBodyWithStreaming).
const readAhead = 8 << 10

// ReadBody reads the request body, at most limit bytes, into a buffer of
// its own; a gzip or deflate Content-Encoding is inflated (the limit
// applies to what it inflates to) and removed from the request, so nothing
// downstream inflates it again. The server streams request bodies, so
// nothing but fasthttp's read-ahead has been read before: a body announced
// larger than limit is refused without reading a byte of it, a chunked or
// compressed one as soon as it passes limit. A refused or unreadable body is
// left on the connection, which is then closed after the answer (see
// SkipBody). Errors are *BodyError.
func ReadBody(c *fiber.Ctx, limit int64) ([]byte, error) {
	req := &c.Context().Request
	length := int64(req.Header.ContentLength()) // -1: chunked
	if length > limit {
		SkipBody(c)
		return nil, bodyTooLarge(limit)
	}
	encoding := strings.ToLower(strings.TrimSpace(c.Get(fiber.HeaderContentEncoding)))
	if encoding == "identity" {
		encoding = ""
	}
	if encoding != "" && encoding != "gzip" && encoding != "x-gzip" && encoding != "deflate" {
		SkipBody(c)
		return nil, &BodyError{Status: http.StatusUnsupportedMediaType, Reason: "invalid_request", Code: "unsupported_content_encoding",
			Message: fmt.Sprintf("Content-Encoding %q is not supported; send gzip, deflate or an uncompressed body.", encoding)}
	}
	var raw io.Reader = c.Context().RequestBodyStream()
	if raw == nil {
		// Nothing is streamed: there is no body, or the server reads
		// bodies whole (bounded by its own limit).
		whole := req.Body()
		if int64(len(whole)) > limit {
			return nil, bodyTooLarge(limit)
		}
		raw, length = bytes.NewReader(whole), int64(len(whole))
	}
	if encoding == "" && length >= 0 {
		// One allocation of the announced size; the client cannot send
		// more than it announced.
		body := make([]byte, length)
		if _, err := io.ReadFull(raw, body); err != nil {
			SkipBody(c)
			return nil, unreadable(err)
		}
		return body, nil
	}
	r := raw
	switch encoding {
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(raw)
		if err != nil {
			SkipBody(c)
			return nil, unreadable(err)
		}
		r = zr
	case "deflate": // HTTP's deflate is the zlib format
		zr, err := zlib.NewReader(raw)
		if err != nil {
			SkipBody(c)
			return nil, unreadable(err)
		}
		r = zr
	}
	body, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		SkipBody(c)
		return nil, unreadable(err)
	}
	if int64(len(body)) > limit {
		SkipBody(c)
		return nil, bodyTooLarge(limit)
	}
	if encoding != "" {
		req.Header.Del(fiber.HeaderContentEncoding)
		// Bytes after the compressed data would be taken for the next
		// request on the connection.
		var b [1]byte
		if n, _ := raw.Read(b[:]); n > 0 {
			SkipBody(c)
		}
	}
	return body, nil
}

func unreadable(err error) *BodyError {
	return &BodyError{Status: http.StatusBadRequest, Reason: "invalid_request", Code: "invalid_request",
		Message: "The request body could not be read: " + err.Error()}
}

// SkipBody leaves the rest of the request body unread. What fasthttp read
// ahead with the headers (a body of at most readAhead bytes) is dropped,
// so the connection can carry the next request. If more may follow, the
// next request would start inside this body: the connection is closed
// after the answer, the way net/http does it (see lingerClose).
func SkipBody(c *fiber.Ctx) {
	ctx := c.Context()
	stream := ctx.RequestBodyStream()
	if stream == nil {
		return
	}
	if n := ctx.Request.Header.ContentLength(); n >= 0 && n <= readAhead {
		if _, err := io.Copy(io.Discard, stream); err == nil {
			return
		}
	}
	conn := ctx.Conn()
	ctx.Response.SetConnectionClose()
	// fasthttp would close the connection right after the answer, with the
	// client's body still arriving: the kernel then resets it, and a client
	// still writing its body often sees that reset, not the answer (Go's
	// client did, every time). So the server writes no answer itself, and
	// the connection is handed over once the handler (or errorHandler) has
	// set the answer.
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(net.Conn) { lingerClose(ctx, conn) })
}

// lingerDelay is how long a connection whose request body was left unread
// stays open after its answer (net/http's rstAvoidanceDelay).
const lingerDelay = 500 * time.Millisecond

// lingerClose writes ctx's answer to conn, ends the server's side of the
// connection (FIN), and waits lingerDelay before fasthttp closes it, so the
// client reads the answer before the reset that the unread bytes cause. The
// rest of the body is never read: what the client sends meanwhile waits in
// the kernel's buffers until the close. ctx is valid until this returns.
func lingerClose(ctx *fasthttp.RequestCtx, conn net.Conn) {
	_ = conn.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := ctx.Response.WriteTo(conn); err != nil {
		return
	}
	if tc, ok := conn.(interface{ CloseWrite() error }); ok {
		_ = tc.CloseWrite()
	}
	time.Sleep(lingerDelay)
}
