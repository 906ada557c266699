package responses

import (
	"bytes"
	"fmt"
	"strconv"
	"testing"
)

// vllmFrames returns the frames of a chat stream of n content chunks in
// vLLM's format: the role chunk, n content chunks, the finish chunk, the
// usage chunk and [DONE].
func vllmFrames(n int) [][]byte {
	const prefix = `data: {"id":"chatcmpl-8f1c2a9e4b7d4e0a9c3b5d6e7f8a9b0c","object":"chat.completion.chunk","created":1795979333,"model":"Qwen/Qwen3-8B","choices":[`
	words := []string{" Once", " upon", " a", " time", ",", " there", " was", " a", " little", " girl", " named", " Lily", "."}
	frames := [][]byte{[]byte(prefix + `{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n")}
	for i := 0; i < n; i++ {
		frames = append(frames, []byte(prefix+`{"index":0,"delta":{"content":`+strconv.Quote(words[i%len(words)])+`},"logprobs":null,"finish_reason":null}]}`+"\n\n"))
	}
	return append(frames,
		[]byte(prefix+`{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"length","stop_reason":null}]}`+"\n\n"),
		[]byte(prefix+`],"usage":{"prompt_tokens":12,"total_tokens":`+strconv.Itoa(12+n)+`,"completion_tokens":`+strconv.Itoa(n)+`}}`+"\n\n"),
		[]byte("data: [DONE]\n\n"))
}

const benchRequest = `{"model":"Qwen/Qwen3-8B","input":[{"role":"user","content":"Tell me a story"}],"max_output_tokens":1000,"stream":true}`

// BenchmarkStreamFrame is the cost of one content frame: ns/op and
// allocs/op are per chat frame. The stream starts over every 1,000 frames
// (reusing its buffers, as the text would otherwise grow without end), so
// the opening events are in the average too.
//
//	go test ./internal/responses -run '^$' -bench StreamFrame -benchmem
func BenchmarkStreamFrame(b *testing.B) {
	frames := vllmFrames(1000)
	content := frames[1 : len(frames)-3]
	s := NewStream([]byte(benchRequest), "resp_bench", 1795979333)
	var written int
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if i == len(content) {
			i = 0
			h := s.h
			*s = Stream{h: h, msg: -1, out: s.out[:0], text: s.text[:0]}
		}
		written += len(s.Frame(content[i]))
		i++
	}
	if written == 0 {
		b.Fatal("nothing written")
	}
}

// BenchmarkStream translates whole streams of N content chunks, from
// NewStream to response.completed; allocs/op is per stream.
//
//	go test ./internal/responses -run '^$' -bench 'Stream$' -benchmem
func BenchmarkStream(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("chunks=%d", n), func(b *testing.B) {
			frames := vllmFrames(n)
			req := []byte(benchRequest)
			var out bytes.Buffer
			b.ReportAllocs()
			for b.Loop() {
				out.Reset()
				s := NewStream(req, "resp_bench", 1795979333)
				for _, f := range frames {
					out.Write(s.Frame(f))
				}
				if _, _, ok := s.Usage(); !ok {
					b.Fatal("no usage")
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(frames)), "ns/frame")
		})
	}
}
