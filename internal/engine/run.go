package engine

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/tidwall/gjson"

	"moonji/internal/enginelink/protocol"
	"moonji/internal/proxy"
)

// maxAnswer bounds a non-streamed answer: its envelope, with the body
// escaped as a JSON string, must stay under protocol.MaxEnvelope.
const maxAnswer = 16 << 20

// run sends the session's chat body to its model's upstream and relays the
// answer. After the session is cancelled nothing more is sent for it: the
// gateway asked, or is gone.
func (c *conn) run(s *session, body []byte, traceparent string) {
	m := s.model
	if m.UpstreamModel != "" {
		req, err := proxy.ParseRequest(body)
		if err != nil {
			c.chatError(s.ctx, s.id, http.StatusBadRequest, "invalid_request_error", err.Error())
			return
		}
		// Stream is left false so that only the model is renamed: the
		// gateway has already set stream_options as it wants them.
		if body, err = proxy.RewriteBody(body, proxy.Request{Model: req.Model}, m.UpstreamModel); err != nil {
			c.chatError(s.ctx, s.id, http.StatusBadRequest, "invalid_request_error", err.Error())
			return
		}
	}
	ctx := s.ctx
	if m.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.Timeout)
		defer cancel()
	}
	resp, err := c.srv.client.PostSentTraced(ctx, m.Upstream, proxy.APIChat, body, traceparent, nil)
	if err != nil {
		c.failed(s, ctx, err)
		return
	}
	defer resp.Body.Close()
	ct := resp.Header.Get("Content-Type")
	if resp.StatusCode == http.StatusOK && isEventStream(ct) {
		c.relay(s, ctx, resp.Body, ct)
		return
	}
	c.whole(s, ctx, resp, ct)
}

// failed ends the session's answer when the upstream gave none, or broke
// off: 504 past the model's timeout, 502 otherwise.
func (c *conn) failed(s *session, ctx context.Context, err error) {
	if s.ctx.Err() != nil {
		return
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		c.chatError(s.ctx, s.id, http.StatusGatewayTimeout, "upstream_timeout",
			fmt.Sprintf("backend %s did not answer within %s", s.model.Upstream.Name, s.model.Timeout))
		return
	}
	status := http.StatusBadGateway
	var ue *proxy.UpstreamError
	if errors.As(err, &ue) {
		status = ue.Status
	}
	code := "upstream_unreachable"
	if status == http.StatusGatewayTimeout {
		code = "upstream_timeout"
	}
	c.chatError(s.ctx, s.id, status, code, err.Error())
}

// whole relays an answer that is not an event stream (a completion, or an
// error answer) with its status and body as they were.
func (c *conn) whole(s *session, ctx context.Context, resp *http.Response, ct string) {
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	switch {
	case err != nil:
		c.failed(s, ctx, fmt.Errorf("backend %s: reading its answer: %w", s.model.Upstream.Name, err))
		return
	case len(data) > maxAnswer:
		c.chatError(s.ctx, s.id, http.StatusBadGateway, "upstream_answer_too_large",
			fmt.Sprintf("backend %s answered more than %d bytes", s.model.Upstream.Name, maxAnswer))
		return
	case resp.StatusCode < 200 || resp.StatusCode > 599:
		c.chatError(s.ctx, s.id, http.StatusBadGateway, "upstream_bad_status",
			fmt.Sprintf("backend %s answered status %d", s.model.Upstream.Name, resp.StatusCode))
		return
	}
	err = c.sendSession(s, protocol.TypeChatResponse, protocol.ChatResponse{Status: resp.StatusCode, ContentType: ct, Body: string(data)})
	if err != nil && s.ctx.Err() == nil {
		// Too large once escaped for one envelope.
		c.chatError(s.ctx, s.id, http.StatusBadGateway, "upstream_answer_too_large", err.Error())
	}
}

// relay sends a streamed answer: chat.response, then each SSE frame as a
// chat.chunk (byte for byte, "data: " and the blank line included), then
// chat.done with the finish reason and usage the frames carried. The frames
// are read by proxy.Stream, the gateway's own reader: bounded per frame, a
// torn frame never relayed, the usage chunk recognised.
func (c *conn) relay(s *session, ctx context.Context, body io.Reader, ct string) {
	if err := c.sendSession(s, protocol.TypeChatResponse, protocol.ChatResponse{Status: http.StatusOK, ContentType: ct, Stream: true}); err != nil {
		return
	}
	// Buffers sized for the common frame (a few hundred bytes): a session
	// holds them for its whole answer, and a larger frame only takes more
	// Reads. (A larger buf, which stays on the goroutine's stack, grew
	// every session's stack to 32 KiB.)
	st := proxy.NewStream(bufio.NewReaderSize(body, 4<<10), proxy.RelayOptions{})
	defer st.Close()
	var (
		seq    int64
		finish string
		frame  []byte
		buf    = make([]byte, 2<<10)
	)
	for {
		// Each Read hands out part or the rest of one frame, never two.
		n, err := st.Read(buf)
		frame = append(frame, buf[:n]...)
		if n > 0 && frameEnds(frame) {
			seq++
			if finish == "" {
				finish = finishReason(frame)
			}
			if c.sendSession(s, protocol.TypeChatChunk, protocol.ChatChunk{Seq: seq, Frame: string(frame)}) != nil {
				return
			}
			frame = frame[:0]
		}
		if err != nil {
			break
		}
	}
	res := st.Result()
	switch {
	case s.ctx.Err() != nil:
		return
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		c.chatError(s.ctx, s.id, http.StatusGatewayTimeout, "upstream_timeout",
			fmt.Sprintf("backend %s did not finish its answer within %s", s.model.Upstream.Name, s.model.Timeout))
		return
	case res.UpstreamErr != nil:
		c.chatError(s.ctx, s.id, http.StatusBadGateway, "upstream_stream_broken",
			fmt.Sprintf("backend %s: the stream broke off: %v", s.model.Upstream.Name, res.UpstreamErr))
		return
	}
	done := protocol.ChatDone{FinishReason: finish}
	if res.HasUsage {
		done.Usage = &protocol.Usage{PromptTokens: max(res.Usage.PromptTokens, 0), CompletionTokens: max(res.Usage.CompletionTokens, 0)}
	}
	_ = c.sendSession(s, protocol.TypeChatDone, done)
}

// frameEnds reports whether the bytes end an SSE frame: proxy.Stream hands
// out whole frames, each ending at its first blank line ("\n" or "\r\n").
func frameEnds(b []byte) bool {
	return bytes.HasSuffix(b, []byte("\n\n")) || bytes.HasSuffix(b, []byte("\n\r\n"))
}

// finishReason returns the first finish_reason a frame's choices carry, or
// "". Most frames have none, or a null one, and are skipped without parsing.
func finishReason(frame []byte) string {
	if !hasFinishReason(frame) {
		return ""
	}
	var reason string
	gjson.GetBytes(proxy.DataPayload(frame), "choices.#.finish_reason").ForEach(func(_, v gjson.Result) bool {
		if v.Type == gjson.String && v.Str != "" {
			reason = v.Str
			return false
		}
		return true
	})
	if len(reason) > 1024 {
		return "" // not a reason, and the protocol would refuse it
	}
	return reason
}

// hasFinishReason reports whether a frame may carry a finish_reason other
// than null: every vLLM chunk has `"finish_reason":null`, and only the last
// one needs parsing.
func hasFinishReason(frame []byte) bool {
	key := []byte(`"finish_reason"`)
	for {
		i := bytes.Index(frame, key)
		if i < 0 {
			return false
		}
		rest := bytes.TrimLeft(frame[i+len(key):], " \t\r\n")
		if r, ok := bytes.CutPrefix(rest, []byte(":")); ok {
			rest = bytes.TrimLeft(r, " \t\r\n")
		}
		if !bytes.HasPrefix(rest, []byte("null")) {
			return true
		}
		frame = rest
	}
}

// isEventStream reports whether a Content-Type is text/event-stream.
func isEventStream(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "text/event-stream"
}

// traceparent is v when it is a W3C traceparent of version 00 (the
// gateway's span for the call), or "" — anything else from the link is
// not passed to the upstream.
func traceparent(v string) string {
	// 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>
	if len(v) != 55 || v[:3] != "00-" || v[35] != '-' || v[52] != '-' {
		return ""
	}
	for i := 3; i < 55; i++ {
		if i == 35 || i == 52 {
			continue
		}
		if c := v[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return ""
		}
	}
	if strings.Trim(v[3:35], "0") == "" || strings.Trim(v[36:52], "0") == "" {
		return "" // all-zero ids are invalid
	}
	return v
}
