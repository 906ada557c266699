package proxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tidwall/gjson"

	"moonji/internal/jsonguard"
)

// recorded returns the files of the engine recordings (testdata and the
// project's shared fixtures) whose names match pattern.
func recorded(t testing.TB, pattern string) [][]byte {
	var out [][]byte
	for _, dir := range []string{"../../testdata/ollama-0.17.4", "../../../shared/fixtures/ollama-0.17.4", "../jsonguard/testdata"} {
		files, _ := filepath.Glob(filepath.Join(dir, pattern))
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no recordings match %s", pattern)
	}
	return out
}

// engineView is a request as an engine reads it. Go's encoding/json (Ollama)
// takes the last of repeated keys and matches field names regardless of
// case; Python's json (vLLM) takes the last, case matters: engineView reads
// both ways.
type engineView struct {
	Model         json.RawMessage `json:"model"`
	Stream        json.RawMessage `json:"stream"`
	StreamOptions json.RawMessage `json:"stream_options"`
}

func readAsEngines(t *testing.T, body []byte) (goView, pyView engineView) {
	t.Helper()
	if err := json.Unmarshal(body, &goView); err != nil {
		t.Fatalf("encoding/json cannot read an accepted body: %v\n%q", err, body)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("encoding/json cannot read an accepted body: %v\n%q", err, body)
	}
	pyView = engineView{Model: m["model"], Stream: m["stream"], StreamOptions: m["stream_options"]}
	return goView, pyView
}

// includeUsage is stream_options.include_usage as an engine reads it.
func (v engineView) includeUsage() bool {
	var so map[string]json.RawMessage
	if json.Unmarshal(v.StreamOptions, &so) != nil {
		return false
	}
	return string(so["include_usage"]) == "true"
}

// modelName is the engine's model string, and whether it is one a route
// could be configured with (valid text, no replacement character: engines
// turn broken text into U+FFFD, the gateway keeps the bytes).
func (v engineView) modelName() (string, bool) {
	var s string
	if json.Unmarshal(v.Model, &s) != nil {
		return "", false
	}
	return s, !strings.ContainsRune(s, utf8.RuneError)
}

// FuzzParseRequest: ParseRequest and RewriteBody never panic; a body
// ParseRequest accepts reads the same to the engines as to the gateway; and
// what RewriteBody sends is valid JSON, unambiguous, with the model and
// stream settings the gateway decided.
//
//	go test ./internal/proxy -run '^$' -fuzz FuzzParseRequest -fuzztime 2m
func FuzzParseRequest(f *testing.F) {
	for _, b := range recorded(f, "*.json") {
		f.Add(b, "")
		f.Add(b, "Qwen/Qwen3-8B")
	}
	for _, b := range []string{
		`{"model":"m","messages":[]}`,
		`{"model":"m","stream":null,"stream_options":null,"max_tokens":null}`,
		`{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":7}`,
		`{"model":"m","stream":true,"stream_options":{"include_usage":false},"max_completion_tokens":9,"max_tokens":3}`,
		`{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":true}}`,
		`{"model":"allowed","model":"secret"}`,
		`{"model":"m","stream":false,"stream":true}`,
		`{"mod\u0065l":"m","str\u0065am":true,"stream_options":{"include_us\u0061ge":false}}`,
		`{"model":"m","MODEL":"x","Stream":true}`,
		`{"model":"m","stream":true,"stream_options":{"include_usage":true,"include_usage":false}}`,
		` {"model" : "m\u00e9" , "stream" : true , "stream_options" : { } } `,
		`{"model":"m","x":` + strings.Repeat("[", 130) + `}`,
		`{"model":"m","n":2,"n":1,"tools":[]}`,
		`{"model":"m","stream":true,"n":3,"tools":[{"type":"function","function":{"name":"f"}}]}`,
		`{"model":"m","messages":[{"role":"user","content":"a","content":"b"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a","text":"bb"}]},{"role":"assistant","tool_calls":[],"Tool_Calls":[]}]}`,
	} {
		f.Add([]byte(b), "")
		f.Add([]byte(b), "up")
	}
	f.Fuzz(func(t *testing.T, body []byte, upstream string) {
		// Upstream names come from the configuration: text, not bytes.
		upstream = strings.ToValidUTF8(upstream, "")
		r, err := ParseRequest(body)
		if err != nil {
			var bad *BadRequestError
			if !errors.As(err, &bad) || bad.Message == "" {
				t.Fatalf("ParseRequest = %#v, want a *BadRequestError", err)
			}
			return
		}

		// The engines read what the gateway read.
		goView, pyView := readAsEngines(t, body)
		for name, v := range map[string]engineView{"encoding/json": goView, "a last-wins map": pyView} {
			if m, ok := v.modelName(); ok && m != r.Model {
				t.Fatalf("the gateway reads model %q, %s %q", r.Model, name, m)
			}
			if stream := string(v.Stream) == "true"; stream != r.Stream {
				t.Fatalf("the gateway reads stream %v, %s %s", r.Stream, name, v.Stream)
			}
			if u := v.includeUsage(); u != r.ClientWantsUsage {
				t.Fatalf("the gateway reads include_usage %v, %s %v", r.ClientWantsUsage, name, u)
			}
		}

		out, err := RewriteBody(bytes.Clone(body), r, upstream)
		if err != nil {
			t.Fatalf("RewriteBody of an accepted body: %v", err)
		}
		if err := jsonguard.Validate(out, requestWatch); err != nil {
			t.Fatalf("RewriteBody's output is refused: %v\nin:  %q\nout: %q", err, body, out)
		}
		want := r
		if upstream != "" && upstream != r.Model {
			want.Model = upstream
		}
		if r.Stream {
			want.ClientWantsUsage, want.noStreamOptions = true, false
		}
		got, err := ParseRequest(out)
		if err != nil {
			t.Fatalf("ParseRequest of RewriteBody's output: %v\nin:  %q\nout: %q", err, body, out)
		}
		// Only model (maybe) and stream_options (for a stream) changed.
		want.PromptBytes, got.PromptBytes = 0, 0
		if got != want {
			t.Fatalf("after RewriteBody the gateway reads %+v, want %+v\nin:  %q\nout: %q", got, want, body, out)
		}
		if m := gjson.GetBytes(out, "model"); m.Str != want.Model {
			t.Fatalf("gjson reads model %q, want %q", m.Str, want.Model)
		}
		goView, pyView = readAsEngines(t, out)
		for name, v := range map[string]engineView{"encoding/json": goView, "a last-wins map": pyView} {
			if m, ok := v.modelName(); ok && m != want.Model {
				t.Fatalf("after RewriteBody %s reads model %q, want %q\nout: %q", name, m, want.Model, out)
			}
			if r.Stream && !v.includeUsage() {
				t.Fatalf("after RewriteBody %s reads no include_usage\nout: %q", name, out)
			}
		}
		if r.noStreamOptions {
			// The member is added as sjson adds it, without a parse.
			old := r
			old.noStreamOptions = false
			if sj, err := RewriteBody(bytes.Clone(body), old, upstream); err != nil || !bytes.Equal(out, sj) {
				t.Fatalf("RewriteBody added stream_options as %q, sjson as %q (%v)", out, sj, err)
			}
		}
		if !r.Stream && upstream == "" && !bytes.Equal(out, body) {
			t.Fatalf("nothing to rewrite, yet the body changed:\nin:  %q\nout: %q", body, out)
		}
	})
}

// FuzzReadFrame feeds arbitrary bytes as an engine's stream through Stream
// (readFrame, classify), read with buffers of every size: it never panics,
// ends, calls End and Done once each, and hands out nothing but bytes of the
// stream, in order, plus the closing bytes.
//
//	go test ./internal/proxy -run '^$' -fuzz FuzzReadFrame -fuzztime 2m
func FuzzReadFrame(f *testing.F) {
	for _, b := range recorded(f, "*.sse") {
		f.Add(b, false, uint8(0), uint8(0))
		f.Add(b, true, uint8(6), uint8(3))
	}
	for _, s := range []string{
		role + word + comment + word + finish + usage + done,
		role + word + word[:40],
		strings.ReplaceAll(role+word+usage+done, "\n", "\r\n"),
		"\n\n\n" + word + "\r\n" + done,
		"data:[DONE]\n\n" + word,
		"event: x\nid: 1\ndata: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\ndata: more\n\n",
		"data: {\"usage\":{},\"choices\":[ ]}\n\n",
		"data: {\"choices\":[{\"delta\":{\"tool_calls\":[{}]}}]}\n\n",
		"data: {\"id\":1}\n\ndata: {\"id\":\"x\",\"model\":7}\n\n",
		"data: \n\ndata:\n\n",
		"no newline at all",
		// Lines one byte longer than the 16-byte reader: their last piece
		// is just the line's end.
		"data: {\"a\":\"bc\"}\n\n" + done,
		"data: {\"a\":\"b\"}\r\n\r\n" + done,
	} {
		f.Add([]byte(s), false, uint8(0), uint8(0))
		f.Add([]byte(s), true, uint8(1), uint8(2))
	}
	closing := []byte("data: {\"closing\":true}\n\ndata: [DONE]\n\n")
	f.Fuzz(func(t *testing.T, stream []byte, strip bool, stopAfter, bufSize uint8) {
		// The relay's reader is smaller than many lines: the frames must be
		// the ones a reader holding the whole stream at once finds.
		if got, want := framesOf(stream, 16), framesOf(stream, len(stream)+16); !slices.Equal(got, want) {
			t.Fatalf("frames with a 16-byte reader:\n%q\nwith one holding the stream:\n%q", got, want)
		}
		var frames, content, ends, dones int
		s := NewStream(bufio.NewReaderSize(bytes.NewReader(stream), 16), RelayOptions{
			StripUsage: strip,
			// Stop before frame stopAfter, when it is not zero.
			Stopped:   func() bool { frames++; return stopAfter != 0 && frames > int(stopAfter) },
			OnContent: func(n int) { content = n },
		})
		s.End = func(*RelayResult) []byte { ends++; return closing }
		s.Done = func(_ *RelayResult, delivered bool) {
			dones++
			if !delivered {
				t.Error("Done(false) while the stream was read to its end")
			}
		}
		buf := make([]byte, int(bufSize)%64+1)
		var out []byte
		// Every Read but the last hands out a byte at least.
		for reads := 0; ; reads++ {
			if reads > len(stream)+len(closing)+1 {
				t.Fatalf("no end after %d reads of a %d-byte stream", reads, len(stream))
			}
			n, err := s.Read(buf)
			if n < 0 || n > len(buf) {
				t.Fatalf("Read = %d into %d bytes", n, len(buf))
			}
			out = append(out, buf[:n]...)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("Read: %v", err)
			}
			if n == 0 {
				t.Fatal("Read handed out nothing, and no error")
			}
		}
		if n, err := s.Read(buf); n != 0 || err != io.EOF {
			t.Errorf("Read after the end = %d, %v", n, err)
		}
		_ = s.Close()
		if ends != 1 || dones != 1 {
			t.Fatalf("End called %d times, Done %d times", ends, dones)
		}
		if !bytes.HasSuffix(out, closing) {
			t.Fatalf("the closing bytes are not at the end: %q", out)
		}
		relayed := out[:len(out)-len(closing)]
		if len(relayed) > len(stream) || !isSubsequence(relayed, stream) {
			t.Fatalf("handed out bytes the engine did not send:\nstream: %q\nout:    %q", stream, relayed)
		}
		// It ended one way: the engine's [DONE], a stop, or a broken stream.
		res := s.Result()
		ways := 0
		for _, b := range []bool{res.Done, res.Stopped, res.UpstreamErr != nil} {
			if b {
				ways++
			}
		}
		if ways != 1 || res.ContentChunks != content || res.ClientErr != nil {
			t.Fatalf("result %+v (OnContent saw %d)", res, content)
		}
	})
}

// framesOf splits stream into frames with readFrame over a reader of the
// given buffer size; the last element is what the final read returned, with
// its error.
func framesOf(stream []byte, size int) []string {
	br := bufio.NewReaderSize(bytes.NewReader(stream), size)
	var out []string
	var buf []byte
	for {
		var err error
		buf, err = readFrame(br, buf)
		if err != nil {
			return append(out, fmt.Sprintf("%q: %v", buf, err))
		}
		out = append(out, string(buf))
	}
}

// isSubsequence reports whether a is b with some bytes left out.
func isSubsequence(a, b []byte) bool {
	for _, c := range a {
		i := bytes.IndexByte(b, c)
		if i < 0 {
			return false
		}
		b = b[i+1:]
	}
	return true
}
