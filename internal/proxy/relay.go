package proxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"
)

// Usage is the token count an engine reported.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
}

// RelayOptions steer one SSE relay.
type RelayOptions struct {
	// StripUsage drops the usage-only chunk (choices: []) the gateway asked
	// for on the client's behalf.
	StripUsage bool
	// Stopped is checked before every frame is written; when it reports
	// true the relay ends without writing the frame. It must be cheap: it
	// runs once per token.
	Stopped func() bool
	// OnContent is called after each content chunk has been flushed, with
	// the number delivered so far (1 for the first: time to first token).
	OnContent func(n int)
}

// RelayResult is what happened during a relay.
type RelayResult struct {
	// ContentChunks counts chunks carrying content (text, reasoning or
	// tool calls) that were flushed to the client.
	ContentChunks int
	// Usage is the engine's usage chunk, when one came.
	Usage    Usage
	HasUsage bool
	// Done is true when the engine's "data: [DONE]" was relayed.
	Done bool
	// Stopped is true when Stopped ended the relay.
	Stopped bool
	// ClientErr is set when writing to the client failed (it left).
	ClientErr error
	// UpstreamErr is set when the engine's stream broke before [DONE].
	UpstreamErr error
	// ID, Model and Created are taken from the first chunk so that the
	// gateway can write a well-formed closing chunk of its own.
	ID      string
	Model   string
	Created int64
}

// maxFrame bounds one SSE frame; a longer one is an engine bug, not an answer.
const maxFrame = 4 << 20

// Relay copies SSE frames from src (the engine) to dst (the client), flushing
// each one as it completes, byte for byte. It records usage and counts
// content without allocating per frame.
func Relay(dst *bufio.Writer, src *bufio.Reader, o RelayOptions) RelayResult {
	var res RelayResult
	frame := make([]byte, 0, 4096)
	for {
		frame, err := readFrame(src, frame[:0])
		if err != nil {
			// A frame cut off by the error is torn: it is never relayed.
			if o.Stopped != nil && o.Stopped() {
				res.Stopped = true
				return res
			}
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF // the engine hung up before [DONE]
			}
			res.UpstreamErr = err
			return res
		}
		kind := classify(frame, &res)
		if o.Stopped != nil && o.Stopped() {
			res.Stopped = true
			return res
		}
		if kind == frameUsage && o.StripUsage {
			continue
		}
		if _, werr := dst.Write(frame); werr != nil {
			res.ClientErr = werr
			return res
		}
		if werr := dst.Flush(); werr != nil {
			res.ClientErr = werr
			return res
		}
		switch kind {
		case frameContent:
			res.ContentChunks++
			if o.OnContent != nil {
				o.OnContent(res.ContentChunks)
			}
		case frameDone:
			res.Done = true
			return res
		}
	}
}

// readFrame appends one SSE frame (lines up to and including the blank line
// that ends it) to buf.
func readFrame(r *bufio.Reader, buf []byte) ([]byte, error) {
	for {
		line, err := r.ReadSlice('\n')
		buf = append(buf, line...)
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			if len(buf) > maxFrame {
				return buf, errors.New("SSE frame too large")
			}
			continue
		case err != nil:
			return buf, err
		}
		if isBlank(line) {
			if len(buf) == len(line) {
				// Stray blank line between frames: relay it as its own
				// frame would change nothing, so keep reading.
				buf = buf[:0]
				continue
			}
			return buf, nil
		}
	}
}

func isBlank(line []byte) bool {
	return len(line) == 1 || (len(line) == 2 && line[0] == '\r')
}

type frameKind int

const (
	frameOther frameKind = iota
	frameContent
	frameUsage // usage-only chunk: "choices": [] and a usage object
	frameDone
)

// classify looks at a frame's data payload. The payload is read through an
// unsafe string view of the frame buffer: nothing that points into it
// outlives this call.
func classify(frame []byte, res *RelayResult) frameKind {
	payload := dataPayload(frame)
	if len(payload) == 0 {
		return frameOther
	}
	if string(payload) == "[DONE]" {
		return frameDone
	}
	s := unsafe.String(&payload[0], len(payload))
	if res.ID == "" {
		if id := gjson.Get(s, "id"); id.Type == gjson.String {
			res.ID = strings.Clone(id.Str)
			res.Model = strings.Clone(gjson.Get(s, "model").Str)
			res.Created = gjson.Get(s, "created").Int()
		}
	}
	kind := frameOther
	if u := gjson.Get(s, "usage"); u.IsObject() {
		res.HasUsage = true
		res.Usage.PromptTokens = int(u.Get("prompt_tokens").Int())
		res.Usage.CompletionTokens = int(u.Get("completion_tokens").Int())
		if c := gjson.Get(s, "choices"); c.IsArray() && isEmptyArray(c.Raw) {
			kind = frameUsage
		}
	}
	if delta := gjson.Get(s, "choices.0.delta"); delta.IsObject() && hasContent(delta) {
		kind = frameContent
	}
	return kind
}

func hasContent(delta gjson.Result) bool {
	for _, f := range [...]string{"content", "reasoning_content", "reasoning"} {
		if v := delta.Get(f); v.Type == gjson.String && len(v.Raw) > 2 {
			return true
		}
	}
	tc := delta.Get("tool_calls")
	return tc.IsArray() && !isEmptyArray(tc.Raw)
}

func isEmptyArray(raw string) bool {
	return strings.TrimSpace(strings.TrimSpace(raw)[1:len(raw)-1]) == ""
}

// dataPayload returns the value of the frame's first data line, without the
// "data:" field name, its optional space and the line end.
func dataPayload(frame []byte) []byte {
	for len(frame) > 0 {
		line := frame
		if i := bytes.IndexByte(frame, '\n'); i >= 0 {
			line, frame = frame[:i], frame[i+1:]
		} else {
			frame = nil
		}
		line = bytes.TrimSuffix(line, []byte("\r"))
		if rest, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			return bytes.TrimPrefix(rest, []byte(" "))
		}
	}
	return nil
}

// UsageChunk formats the closing usage chunk the gateway writes itself when
// a stream ends early (a stop) and the client asked for usage.
func UsageChunk(id, model string, created int64, u Usage) []byte {
	b := make([]byte, 0, 256)
	b = append(b, `data: {"id":`...)
	b = appendJSONString(b, id)
	b = append(b, `,"object":"chat.completion.chunk","created":`...)
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"model":`...)
	b = appendJSONString(b, model)
	b = append(b, `,"choices":[],"usage":{"prompt_tokens":`...)
	b = strconv.AppendInt(b, int64(u.PromptTokens), 10)
	b = append(b, `,"total_tokens":`...)
	b = strconv.AppendInt(b, int64(u.PromptTokens+u.CompletionTokens), 10)
	b = append(b, `,"completion_tokens":`...)
	b = strconv.AppendInt(b, int64(u.CompletionTokens), 10)
	b = append(b, "}}\n\n"...)
	return b
}

func appendJSONString(b []byte, s string) []byte {
	q, _ := json.Marshal(s) // a string always marshals
	return append(b, q...)
}

// DoneFrame ends every stream.
var DoneFrame = []byte("data: [DONE]\n\n")

// ErrorFrame formats an error as a data frame, the way OpenAI reports an
// error that happens after a stream has begun; SDKs raise it as an APIError.
func ErrorFrame(message, typ, code string) []byte {
	b := make([]byte, 0, 128+len(message))
	b = append(b, `data: {"error":{"message":`...)
	b = appendJSONString(b, message)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, typ)
	b = append(b, `,"param":null,"code":`...)
	b = appendJSONString(b, code)
	b = append(b, "}}\n\n"...)
	return b
}
