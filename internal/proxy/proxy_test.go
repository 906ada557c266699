package proxy

import (
	"bufio"
	"errors"
	"io"
	"strings"
	"testing"
)

func TestParseRequest(t *testing.T) {
	ok := []struct {
		body string
		want Request
	}{
		{`{"model":"m","messages":[]}`, Request{Model: "m", PromptBytes: 2, noStreamOptions: true}},
		{`{"model":"m","stream":null,"stream_options":null,"max_tokens":null}`, Request{Model: "m"}},
		{`{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":7}`, Request{Model: "m", Stream: true, ClientWantsUsage: true, MaxTokens: 7}},
		{`{"model":"m","stream":true,"stream_options":{"include_usage":false},"max_completion_tokens":9,"max_tokens":3}`, Request{Model: "m", Stream: true, MaxTokens: 9}},
	}
	for _, c := range ok {
		got, err := ParseRequest([]byte(c.body))
		if err != nil || got != c.want {
			t.Errorf("ParseRequest(%s) = %+v, %v; want %+v", c.body, got, err, c.want)
		}
	}
	for _, body := range []string{``, `{"model":"m",`, `[1]`, `{"messages":[]}`, `{"model":""}`, `{"model":7}`,
		`{"model":"m","stream":"yes"}`, `{"model":"m","stream_options":[]}`, `{"model":"m","stream_options":"x"}`} {
		var bad *BadRequestError
		if _, err := ParseRequest([]byte(body)); !errors.As(err, &bad) {
			t.Errorf("ParseRequest(%q): %v, want a BadRequestError", body, err)
		}
	}
}

func TestRewriteBodyTouchesOnlyWhatItMust(t *testing.T) {
	cases := []struct{ in, upstream, want string }{
		// Not streamed, no rename: the very same bytes.
		{`{"model":"m", "x":null ,"messages":[]}`, "", `{"model":"m", "x":null ,"messages":[]}`},
		{`{"model":"m","x":null}`, "Qwen/Qwen3-8B", `{"model":"Qwen/Qwen3-8B","x":null}`},
		{`{"model":"m","stream":true}`, "", `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`},
		{`{"model":"m","stream":true,"stream_options":null}`, "", `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`},
		{`{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":true}}`, "", `{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":true,"include_usage":true}}`},
		{`{"model":"m","stream":true,"stream_options":{"include_usage":true}}`, "", `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`},
	}
	for _, c := range cases {
		r, err := ParseRequest([]byte(c.in))
		if err != nil {
			t.Fatal(err)
		}
		got, err := RewriteBody([]byte(c.in), r, c.upstream)
		if err != nil || string(got) != c.want {
			t.Errorf("RewriteBody(%s, %q) = %s, %v; want %s", c.in, c.upstream, got, err, c.want)
		}
	}
}

const (
	role    = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}` + "\n\n"
	word    = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":0,"delta":{"content":" hi"},"finish_reason":null}]}` + "\n\n"
	finish  = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}]}` + "\n\n"
	usage   = `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":5,"model":"m","choices":[],"usage":{"prompt_tokens":4,"total_tokens":7,"completion_tokens":3}}` + "\n\n"
	done    = "data: [DONE]\n\n"
	comment = ": keep-alive\n\n"
)

// drain reads a Stream the way fasthttp does, with a small buffer.
func drain(t *testing.T, s *Stream) string {
	t.Helper()
	var out strings.Builder
	buf := make([]byte, 7) // smaller than a frame: frames span Reads
	for {
		n, err := s.Read(buf)
		out.Write(buf[:n])
		if err == io.EOF {
			return out.String()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func newStream(src string, o RelayOptions) *Stream {
	return NewStream(bufio.NewReader(strings.NewReader(src)), o)
}

func TestStreamRelaysBytesAndStripsUsage(t *testing.T) {
	src := role + word + comment + word + word + finish + usage + done
	var delivered bool
	s := newStream(src, RelayOptions{})
	s.Done = func(_ *RelayResult, ok bool) { delivered = ok }
	if got := drain(t, s); got != src {
		t.Errorf("relay changed the bytes:\n%q\n%q", got, src)
	}
	res := s.Result()
	if !delivered || !res.Done || res.ContentChunks != 3 || !res.HasUsage || res.Usage.CompletionTokens != 3 || res.ID != "chatcmpl-1" {
		t.Errorf("result %+v, delivered %v", res, delivered)
	}
	s = newStream(src, RelayOptions{StripUsage: true})
	if got, want := drain(t, s), strings.Replace(src, usage, "", 1); got != want {
		t.Errorf("usage not stripped:\n%q", got)
	}
}

func TestStreamStopsBeforeTheNextFrame(t *testing.T) {
	stopped := false
	n := 0
	s := newStream(role+word+word+word+finish+done, RelayOptions{
		Stopped:   func() bool { return stopped },
		OnContent: func(k int) { n = k; stopped = k == 2 },
	})
	s.End = func(*RelayResult) []byte { return []byte(done) }
	got := drain(t, s)
	if want := role + word + word + done; got != want {
		t.Errorf("after a stop at 2 chunks got %q", got)
	}
	if res := s.Result(); !res.Stopped || res.ContentChunks != 2 || n != 2 {
		t.Errorf("result %+v", res)
	}
}

func TestStreamNeverRelaysATornFrame(t *testing.T) {
	s := newStream(role+word+word[:40], RelayOptions{})
	var ended *RelayResult
	s.End = func(r *RelayResult) []byte { ended = r; return []byte("data: {\"error\":{}}\n\n") }
	got := drain(t, s)
	if got != role+word+"data: {\"error\":{}}\n\n" {
		t.Errorf("got %q", got)
	}
	if ended == nil || !errors.Is(ended.UpstreamErr, io.ErrUnexpectedEOF) || ended.ContentChunks != 1 {
		t.Errorf("ended %+v", ended)
	}
}

// A line longer than the reader's buffer comes in pieces, and the last
// piece of a line one byte longer is just its line feed: that piece must not
// end the frame (found with Ollama's response.completed event, whose data
// line was 1,025 bytes against the relay's 1 KiB buffer: the client got the
// frame without its blank line and never saw the event).
func TestFramesWithLinesLongerThanTheBuffer(t *testing.T) {
	const size = 16 // bufio's smallest buffer
	for n := 1; n <= 4*size; n++ {
		for _, eol := range []string{"\n", "\r\n"} {
			data := "data: " + strings.Repeat("x", n) + eol
			frames := []string{"event: e\n" + data + eol, data + "data: y" + eol + eol, "data: [DONE]" + eol + eol}
			br := bufio.NewReaderSize(strings.NewReader(strings.Join(frames, "")), size)
			var buf []byte
			for i, want := range frames {
				var err error
				buf, err = readFrame(br, buf[:0])
				if err != nil || string(buf) != want {
					t.Fatalf("line of %d bytes, %q: frame %d = %q, %v; want %q", len(data), eol, i, buf, err, want)
				}
			}
			if buf, err := readFrame(br, buf[:0]); err != io.EOF || len(buf) != 0 {
				t.Fatalf("line of %d bytes, %q: after the last frame %q, %v", len(data), eol, buf, err)
			}
		}
	}
}

// An engine that never ends its frame cannot make the relay hold more than
// maxFrame, whether in one long line or in many short ones.
func TestFrameIsBounded(t *testing.T) {
	for name, line := range map[string]string{"one long line": strings.Repeat("x", 64<<10), "short lines": "data: x\n"} {
		r := io.MultiReader(strings.NewReader("data: {}\n"), io.LimitReader(&repeat{s: line}, 2*maxFrame))
		buf, err := readFrame(bufio.NewReaderSize(r, 1<<10), nil)
		if !errors.Is(err, errFrameTooLarge) || len(buf) > maxFrame+64<<10 {
			t.Errorf("%s: %d bytes held, %v", name, len(buf), err)
		}
	}
}

// repeat reads s over and over, without end.
type repeat struct {
	s   string
	off int
}

func (r *repeat) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		c := copy(p[n:], r.s[r.off:])
		n += c
		r.off = (r.off + c) % len(r.s)
	}
	return n, nil
}

func TestStreamCloseEarlyMeansTheClientLeft(t *testing.T) {
	s := newStream(role+word+word+done, RelayOptions{})
	var delivered = true
	s.Done = func(_ *RelayResult, ok bool) { delivered = ok }
	buf := make([]byte, 4096)
	if _, err := s.Read(buf); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if delivered || s.Result().ClientErr == nil {
		t.Errorf("close mid-stream: delivered %v, result %+v", delivered, s.Result())
	}
	s.Close() // twice is harmless
}

func TestStreamAllocationsDoNotGrowWithTheAnswer(t *testing.T) {
	allocs := func(words int) float64 {
		src := role + strings.Repeat(word, words) + finish + usage + done
		buf := make([]byte, 32<<10)
		r := strings.NewReader(src)
		br := bufio.NewReaderSize(r, 32<<10)
		return testing.AllocsPerRun(20, func() {
			r.Reset(src)
			br.Reset(r)
			s := NewStream(br, RelayOptions{StripUsage: true, Stopped: func() bool { return false }})
			for {
				if _, err := s.Read(buf); err != nil {
					break
				}
			}
		})
	}
	if few, many := allocs(10), allocs(2000); many > few {
		t.Errorf("allocations per stream grew with the answer: %v for 10 chunks, %v for 2,000", few, many)
	}
}

func TestFramesOfTheGateway(t *testing.T) {
	if got := string(UsageChunk("chatcmpl-\"x", "m", 5, Usage{PromptTokens: 4, CompletionTokens: 2})); got !=
		`data: {"id":"chatcmpl-\"x","object":"chat.completion.chunk","created":5,"model":"m","choices":[],"usage":{"prompt_tokens":4,"total_tokens":6,"completion_tokens":2}}`+"\n\n" {
		t.Errorf("UsageChunk = %s", got)
	}
	if got := string(ErrorFrame("bad\nthing", "t", "c")); got != `data: {"error":{"message":"bad\nthing","type":"t","param":null,"code":"c"}}`+"\n\n" {
		t.Errorf("ErrorFrame = %s", got)
	}
}
