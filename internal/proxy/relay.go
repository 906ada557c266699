package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"math/bits"
	"strconv"
	"strings"
	"unsafe"

	"github.com/tidwall/gjson"

	"moonji/internal/jsonguard"
)

// Usage is the token count an engine reported.
type Usage struct {
	PromptTokens     int
	CompletionTokens int
	// CachedTokens are those of PromptTokens the engine served from its
	// prompt cache (prompt_tokens_details.cached_tokens, or Responses'
	// input_tokens_details): at most PromptTokens, 0 when it did not say.
	CachedTokens int
}

// RelayOptions steer one SSE relay.
type RelayOptions struct {
	// API is the stream's kind: chat and completions streams are chunks
	// ending with [DONE]; a Responses stream is typed events ending with
	// response.completed, response.incomplete or response.failed.
	API API
	// Transform, when set, replaces each frame with what it returns before
	// the frame is handed out (nil or empty: nothing is handed out): the
	// translation of a chat stream into Responses events.
	Transform func(frame []byte) []byte
	// StripUsage drops the usage-only chunk (choices: []) the gateway asked
	// for on the client's behalf.
	StripUsage bool
	// Stopped is checked before every frame is written; when it reports
	// true the relay ends without writing the frame. It must be cheap: it
	// runs once per token.
	Stopped func() bool
	// OnContent is called when a content chunk is handed to the client,
	// with the number so far (1 for the first: time to first token).
	OnContent func(n int)
	// BeforeWrite is called each time bytes are handed to the server to
	// write, before it writes them (a write deadline is set there, so a
	// client that stops reading is noticed).
	BeforeWrite func()
}

// RelayResult is what happened during a relay.
type RelayResult struct {
	// ContentChunks counts chunks carrying content (text, reasoning or
	// tool calls) that were flushed to the client.
	ContentChunks int
	// Usage is the engine's usage chunk, when one came with counts that
	// can be true (ReadUsage).
	Usage    Usage
	HasUsage bool
	// BadUsage is the usage object of a chunk whose counts cannot be
	// (negative, fractional, absurd), cut for a log line: the request's
	// tokens are then counted and estimated as if none had come.
	BadUsage string
	// Done is true when the engine's "data: [DONE]" was relayed.
	Done bool
	// Ended is true when the engine's last frame ([DONE], or a Responses
	// stream's terminal event) was read: nothing of the answer follows but
	// the end of its body (CloseAnswer).
	Ended bool
	// Stopped is true when Stopped ended the relay.
	Stopped bool
	// ClientErr is set when writing to the client failed (it left).
	ClientErr error
	// UpstreamErr is set when the engine's stream broke before [DONE].
	UpstreamErr error
	// EngineError is the message of an error frame the engine wrote into
	// the stream ({"error": …} or {"object": "error", …}); the stream is
	// relayed as it is, but the request failed.
	EngineError string
	// Seq is the sequence_number of the last event of a Responses stream
	// handed to the client, for the events the gateway adds to close it.
	Seq int64
	// ID, Model and Created are taken from the first chunk so that the
	// gateway can write a well-formed closing chunk of its own.
	ID      string
	Model   string
	Created int64
	// choices and finished are bitmasks of the choice indexes (below 64)
	// of the chunks handed to the client, and of those given a
	// finish_reason there.
	choices, finished uint64
}

// maxTrackedChoices bounds the choice indexes a relay keeps track of; n is
// far smaller in practice.
const maxTrackedChoices = 64

// OpenChoice is a choice that a stopped stream must still close.
type OpenChoice struct {
	Index int
	// Fresh is true when no chunk of this choice reached the client: the
	// closing chunk gives its role too (openai-node's finalChatCompletion
	// refuses a choice without one).
	Fresh bool
}

// Unfinished returns the choices the client has not seen finish, in index
// order: each of the n asked for (0..n-1, at most 64) and any other index
// the engine sent, that got no finish_reason. A choice the engine had not
// started yet is one of them: engines that open choices lazily (SGLang
// sends a choice's role with its first token) or a stop that lands between
// vLLM's opening chunks leave some of the n without a chunk.
func (r *RelayResult) Unfinished(n int) []OpenChoice {
	want := r.choices
	if n >= maxTrackedChoices {
		want = ^uint64(0)
	} else if n > 0 {
		want |= 1<<n - 1
	}
	var out []OpenChoice
	for open := want &^ r.finished; open != 0; open &= open - 1 {
		i := bits.TrailingZeros64(open)
		out = append(out, OpenChoice{Index: i, Fresh: r.choices&(1<<i) == 0})
	}
	return out
}

// maxFrame bounds one SSE frame; a longer one is an engine bug, not an answer.
const maxFrame = 4 << 20

var errFrameTooLarge = errors.New("SSE frame too large")

// Stream relays an engine's SSE answer as an io.ReadCloser that the HTTP
// server pulls from (fasthttp's SetBodyStream). Each Read hands out at most
// one frame, byte for byte; fasthttp writes and flushes it to the socket
// before it asks for more. So when the server asks for more after the
// closing bytes, everything before them has left the gateway: that is when
// Done runs, and a stop acknowledged there is never overtaken by content.
// No goroutine or pipe stands between the engine and the client.
type Stream struct {
	src   *bufio.Reader
	opts  RelayOptions
	res   RelayResult
	frame []byte // the frame being read; grows to the largest and is reused
	out   []byte // bytes not yet handed out
	phase int
	// End is called once, when relaying stops (the engine's [DONE], a stop,
	// an engine failure, a client that left); it returns the bytes that
	// close the stream (nil for none).
	End func(*RelayResult) []byte
	// Done is called once: with true after the closing bytes were
	// delivered, with false when the server gave up early (the client left).
	Done func(res *RelayResult, delivered bool)
}

const (
	relaying = iota
	closing  // the closing bytes are being handed out
	over
)

// NewStream returns a Stream over the engine's body.
func NewStream(src *bufio.Reader, o RelayOptions) *Stream {
	// frame starts empty and grows to the largest frame: most are a few
	// hundred bytes, and an open stream holds this buffer as long as it
	// runs.
	return &Stream{src: src, opts: o}
}

// Result is what happened so far.
func (s *Stream) Result() *RelayResult { return &s.res }

// Read hands out the next bytes of the stream.
func (s *Stream) Read(p []byte) (int, error) {
	for len(s.out) == 0 {
		switch s.phase {
		case relaying:
			s.next()
		case closing:
			s.phase = over
			s.finish(true)
			return 0, io.EOF
		default:
			return 0, io.EOF
		}
	}
	if s.opts.BeforeWrite != nil {
		s.opts.BeforeWrite()
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	return n, nil
}

// MidFrame reports whether the last Read handed out only part of a frame
// (or of the closing bytes): nothing may be written between its pieces.
func (s *Stream) MidFrame() bool { return len(s.out) > 0 }

// Close is called by the server when it is done with the stream, having
// delivered everything or not.
func (s *Stream) Close() error {
	if s.phase != over {
		if s.phase == relaying {
			s.res.ClientErr = errors.New("client connection closed")
		}
		s.phase = over
		s.finish(false)
	}
	return nil
}

func (s *Stream) finish(delivered bool) {
	if s.Done != nil {
		done := s.Done
		s.Done = nil
		done(&s.res, delivered)
	}
}

// next reads one frame and either queues it for the client, drops it (the
// usage chunk the client did not ask for), or ends the relay.
func (s *Stream) next() {
	var err error
	s.frame, err = readFrame(s.src, s.frame)
	if err != nil {
		// A frame cut off by the error is torn: it is never relayed.
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF // the engine hung up before [DONE]
		}
		if s.opts.Stopped != nil && s.opts.Stopped() {
			s.res.Stopped = true
		} else {
			s.res.UpstreamErr = err
		}
		s.end()
		return
	}
	opened, finished, seq := s.res.choices, s.res.finished, s.res.Seq
	var kind frameKind
	if s.opts.API == APIResponses {
		kind = classifyEvent(s.frame, &s.res)
	} else {
		kind = classify(s.frame, &s.res)
	}
	if s.opts.Stopped != nil && s.opts.Stopped() {
		// This frame never reaches the client: the choices it opens or
		// finishes stay open for the closing chunk, and the closing event
		// of a Responses stream takes the sequence number it had.
		s.res.choices, s.res.finished, s.res.Seq = opened, finished, seq
		s.res.Stopped = true
		s.end()
		return
	}
	switch kind {
	case frameUsage:
		if s.opts.StripUsage {
			return
		}
	case frameError:
		// Relayed as the engine wrote it: SDKs raise it. The request is an
		// error whatever follows.
	case frameContent:
		// Handed out now, flushed before the next Read.
		s.res.ContentChunks++
		if s.opts.OnContent != nil {
			s.opts.OnContent(s.res.ContentChunks)
		}
	case frameDone:
		// A Responses stream that ends in response.failed did not finish;
		// a chat stream's [DONE] after an error frame did.
		s.res.Done = s.opts.API != APIResponses || s.res.EngineError == ""
		s.res.Ended = true
		s.out = s.transform(s.frame)
		s.phase = closing
		if s.End != nil {
			s.out = append(s.out, s.End(&s.res)...)
		}
		return
	}
	s.out = s.transform(s.frame)
}

// transform is the frame as the client gets it.
func (s *Stream) transform(frame []byte) []byte {
	if s.opts.Transform == nil {
		return frame
	}
	return s.opts.Transform(frame)
}

// end stops relaying and queues the closing bytes.
func (s *Stream) end() {
	s.phase = closing
	if s.End != nil {
		s.out = s.End(&s.res)
	}
}

// Relay copies a whole stream to dst, flushing after every frame: Stream
// for a writer instead of a reader (benchmarks, tools).
func Relay(dst *bufio.Writer, src *bufio.Reader, o RelayOptions) RelayResult {
	s := NewStream(src, o)
	buf := make([]byte, 32<<10)
	for {
		n, err := s.Read(buf)
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr == nil {
				werr = dst.Flush()
				if werr != nil {
					s.res.ClientErr = werr
					_ = s.Close()
					return s.res
				}
			} else {
				s.res.ClientErr = werr
				_ = s.Close()
				return s.res
			}
		}
		if err != nil {
			return s.res
		}
	}
}

// readFrame reads one SSE frame (lines up to and including the blank line
// that ends it) into buf's storage and returns it. A line longer than r's
// buffer comes in pieces; only a whole line can be the blank one, so the
// piece that ends a long line is never taken for the frame's end (a line
// one byte longer than the buffer ends in a piece that is just "\n"). A
// frame longer than maxFrame, in long lines or many short ones, is an
// error.
func readFrame(r *bufio.Reader, buf []byte) ([]byte, error) {
	buf = buf[:0]
	lineStart := 0 // where the line being read starts in buf
	for {
		piece, err := r.ReadSlice('\n')
		buf = append(buf, piece...)
		if len(buf) > maxFrame {
			return buf, errFrameTooLarge
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err != nil:
			return buf, err
		}
		if isBlank(buf[lineStart:]) {
			if lineStart == 0 {
				// Stray blank line between frames: relay it as its own
				// frame would change nothing, so keep reading.
				buf = buf[:0]
				continue
			}
			return buf, nil
		}
		lineStart = len(buf)
	}
}

// readUsage records an engine's usage object: its counts when they can be
// true, otherwise what it said (BadUsage), and no counts at all — a later
// usage chunk is not mixed with an earlier one's.
func (res *RelayResult) readUsage(v gjson.Result, prompt, completion string) {
	u, ok := ReadUsage(v, prompt, completion)
	if !ok {
		res.HasUsage, res.Usage = false, Usage{}
		res.BadUsage = strings.Clone(UsageText(v.Raw))
		return
	}
	res.HasUsage, res.Usage = true, u
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
	frameError // an error the engine reported inside the stream
)

// classify looks at a frame's data payload in one pass over its top-level
// keys. The payload is read through an unsafe string view of the frame
// buffer: nothing that points into it outlives this call.
func classify(frame []byte, res *RelayResult) frameKind {
	payload := DataPayload(frame)
	if len(payload) == 0 {
		return frameOther
	}
	if string(payload) == "[DONE]" {
		return frameDone
	}
	s := unsafe.String(&payload[0], len(payload))
	root := gjson.Parse(s)
	if !root.IsObject() {
		return frameOther
	}
	var (
		id, model, created gjson.Result
		choices, usage     gjson.Result
		errMsg             string
		isError            bool
	)
	root.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "id":
			id = v
		case "model":
			model = v
		case "created":
			created = v
		case "choices":
			choices = v
		case "usage":
			usage = v
		case "error":
			if v.Type != gjson.Null {
				isError = true
				errMsg = v.Get("message").Str
				if errMsg == "" && v.Type == gjson.String {
					errMsg = v.Str
				}
			}
		case "object":
			if v.Str == "error" {
				isError = true
			}
		case "message":
			errMsg = v.Str
		}
		return true
	})
	if isError {
		if res.EngineError == "" {
			res.EngineError = strings.Clone(errMsg)
			if res.EngineError == "" {
				res.EngineError = "error"
			}
		}
		return frameError
	}
	if res.ID == "" && id.Type == gjson.String && id.Str != "" {
		res.ID = strings.Clone(id.Str)
		res.Model = strings.Clone(model.Str)
		res.Created = created.Int()
	}
	kind := frameOther
	if usage.IsObject() {
		res.readUsage(usage, "prompt_tokens", "completion_tokens")
		if choices.IsArray() && isEmptyArray(choices.Raw) {
			kind = frameUsage
		}
	}
	if choices.IsArray() {
		choices.ForEach(func(_, c gjson.Result) bool {
			var index, delta, finish gjson.Result
			c.ForEach(func(k, v gjson.Result) bool {
				switch k.Str {
				case "index":
					index = v
				case "delta":
					delta = v
				case "finish_reason":
					finish = v
				}
				return true
			})
			if i := index.Int(); i >= 0 && i < maxTrackedChoices {
				res.choices |= 1 << i
				if finish.Type == gjson.String {
					res.finished |= 1 << i
				}
			}
			if delta.IsObject() && hasContent(delta) {
				kind = frameContent
			}
			// A completions chunk carries its text beside the index.
			if t := c.Get("text"); t.Type == gjson.String && len(t.Raw) > 2 {
				kind = frameContent
			}
			return true
		})
	}
	return kind
}

// classifyEvent looks at one event of a Responses stream: its type says
// whether it carries content, ends the stream (with the usage of the
// response it carries), or reports an error.
func classifyEvent(frame []byte, res *RelayResult) frameKind {
	payload := DataPayload(frame)
	if len(payload) == 0 {
		return frameOther
	}
	s := unsafe.String(&payload[0], len(payload))
	var typ string
	gjson.Parse(s).ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "type":
			typ = v.Str
		case "sequence_number":
			res.Seq = v.Int()
		}
		return true
	})
	switch typ {
	case "response.output_text.delta", "response.function_call_arguments.delta", "response.refusal.delta",
		"response.reasoning_text.delta", "response.reasoning_summary_text.delta":
		return frameContent
	case "response.created":
		if res.ID == "" {
			r := gjson.Get(s, "response")
			res.ID = strings.Clone(r.Get("id").Str)
			res.Model = strings.Clone(r.Get("model").Str)
			res.Created = r.Get("created_at").Int()
		}
	case "response.completed", "response.incomplete", "response.failed":
		u := gjson.Get(s, "response.usage")
		if u.IsObject() {
			res.readUsage(u, "input_tokens", "output_tokens")
		}
		if typ == "response.failed" && res.EngineError == "" {
			res.EngineError = strings.Clone(gjson.Get(s, "response.error.message").Str)
			if res.EngineError == "" {
				res.EngineError = "response.failed"
			}
		}
		return frameDone
	case "error":
		if res.EngineError == "" {
			res.EngineError = strings.Clone(gjson.Get(s, "message").Str)
			if res.EngineError == "" {
				res.EngineError = "error"
			}
		}
		return frameError
	}
	return frameOther
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

// isEmptyArray reports whether raw is "[]" (blanks allowed). A torn array
// (an engine's broken frame, where gjson returns what there is) is not.
func isEmptyArray(raw string) bool {
	raw = strings.TrimSpace(raw)
	if len(raw) < 2 || raw[len(raw)-1] != ']' {
		return false
	}
	return strings.TrimSpace(raw[1:len(raw)-1]) == ""
}

// DataPayload returns the value of a server-sent event frame's first data
// line, without the "data:" field name, its optional space and the line
// end; nil when the frame has no data line (a comment or a keep-alive).
// Engines write each chunk on one data line.
func DataPayload(frame []byte) []byte {
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
	return usageChunk("chat.completion.chunk", id, model, created, u)
}

// FinishChunk formats the chunk that closes choices the engine never
// finished (a stop): an empty delta with finish_reason "stop" for each, with
// the stream's own id, model and created, so that SDK helpers that assemble
// the whole completion end cleanly. A fresh choice's delta carries the
// assistant role too, as its first chunk must.
func FinishChunk(id, model string, created int64, choices []OpenChoice) []byte {
	return finishChunk("chat.completion.chunk", id, model, created, choices)
}

// finishChunk formats a closing chunk of a chat stream, or of a completions
// stream (object text_completion, whose choices carry text, not a delta).
func finishChunk(object, id, model string, created int64, choices []OpenChoice) []byte {
	b := make([]byte, 0, 160+80*len(choices))
	b = append(b, `data: {"id":`...)
	b = jsonguard.AppendString(b, id)
	b = append(b, `,"object":`...)
	b = jsonguard.AppendString(b, object)
	b = append(b, `,"created":`...)
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"model":`...)
	b = jsonguard.AppendString(b, model)
	b = append(b, `,"choices":[`...)
	for i, c := range choices {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(c.Index), 10)
		switch {
		case object == "text_completion":
			b = append(b, `,"text":""`...)
		case c.Fresh:
			b = append(b, `,"delta":{"role":"assistant","content":""}`...)
		default:
			b = append(b, `,"delta":{}`...)
		}
		b = append(b, `,"logprobs":null,"finish_reason":"stop"}`...)
	}
	b = append(b, "]}\n\n"...)
	return b
}

// DoneFrame ends every stream.
var DoneFrame = []byte("data: [DONE]\n\n")

// ErrorFrame formats an error as a data frame, the way OpenAI reports an
// error that happens after a stream has begun; SDKs raise it as an APIError.
func ErrorFrame(message, typ, code string) []byte {
	b := make([]byte, 0, 128+len(message))
	b = append(b, `data: {"error":{"message":`...)
	b = jsonguard.AppendString(b, message)
	b = append(b, `,"type":`...)
	b = jsonguard.AppendString(b, typ)
	b = append(b, `,"param":null,"code":`...)
	b = jsonguard.AppendString(b, code)
	b = append(b, "}}\n\n"...)
	return b
}
