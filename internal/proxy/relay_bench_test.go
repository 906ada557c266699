package proxy_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strconv"
	"testing"

	"moonji/internal/proxy"
)

// vllmStream returns an SSE answer of n content chunks in vLLM's format (the
// one internal/mockllm writes): a role chunk, n content chunks, the finish
// chunk, the usage-only chunk and [DONE].
func vllmStream(n int) []byte {
	const prefix = `data: {"id":"chatcmpl-8f1c2a9e4b7d4e0a9c3b5d6e7f8a9b0c","object":"chat.completion.chunk","created":1795979333,"model":"Qwen/Qwen3-8B","choices":[`
	words := []string{" Once", " upon", " a", " time", ",", " there", " was", " a", " little", " girl", " named", " Lily", "."}
	var b bytes.Buffer
	b.WriteString(prefix + `{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	for i := 0; i < n; i++ {
		b.WriteString(prefix + `{"index":0,"delta":{"content":` + strconv.Quote(words[i%len(words)]) + `},"logprobs":null,"finish_reason":null}]}` + "\n\n")
	}
	b.WriteString(prefix + `{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"length","stop_reason":null}]}` + "\n\n")
	b.WriteString(prefix + `],"usage":{"prompt_tokens":12,"total_tokens":` + strconv.Itoa(12+n) + `,"completion_tokens":` + strconv.Itoa(n) + `}}` + "\n\n")
	b.WriteString("data: [DONE]\n\n")
	return b.Bytes()
}

// BenchmarkRelay relays one in-memory vLLM stream of N content chunks per
// op, the way the gateway does (usage stripped, a stop check and a content
// callback per frame), to a bufio.Writer over io.Discard that is flushed per
// frame. allocs/op is per stream: it must not grow with N.
//
//	go test ./internal/proxy -run '^$' -bench Relay -benchmem
//
// The reader and writer are reused across ops (the gateway allocates one
// 32 KiB reader per stream, outside Relay), so only Relay's own allocations
// are counted.
func BenchmarkRelay(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		for _, strip := range []bool{true, false} {
			name := fmt.Sprintf("chunks=%d/strip_usage=%v", n, strip)
			b.Run(name, func(b *testing.B) {
				stream := vllmStream(n)
				src := bytes.NewReader(stream)
				br := bufio.NewReaderSize(src, 32<<10)
				bw := bufio.NewWriterSize(io.Discard, 4096)
				stopped := func() bool { return false }
				var content int
				opts := proxy.RelayOptions{StripUsage: strip, Stopped: stopped, OnContent: func(k int) { content = k }}
				b.SetBytes(int64(len(stream)))
				b.ReportAllocs()
				for b.Loop() {
					src.Reset(stream)
					br.Reset(src)
					res := proxy.Relay(bw, br, opts)
					if !res.Done || res.ContentChunks != n || !res.HasUsage {
						b.Fatalf("relay: %+v", res)
					}
				}
				_ = content
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n+4), "ns/frame")
			})
		}
	}
}

// BenchmarkRelayLargeFrames is the same with content chunks larger than the
// relay's 4 KiB initial frame buffer (a tool call's arguments or a batch of
// tokens in one chunk), where the buffer has to grow.
//
//	go test ./internal/proxy -run '^$' -bench RelayLargeFrames -benchmem
func BenchmarkRelayLargeFrames(b *testing.B) {
	big := bytes.Repeat([]byte("x"), 6000)
	for _, n := range []int{10, 100} {
		b.Run(fmt.Sprintf("chunks=%d/6KB", n), func(b *testing.B) {
			var s bytes.Buffer
			for i := 0; i < n; i++ {
				s.WriteString(`data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"`)
				s.Write(big)
				s.WriteString(`"},"finish_reason":null}]}` + "\n\n")
			}
			s.WriteString("data: [DONE]\n\n")
			stream := s.Bytes()
			src := bytes.NewReader(stream)
			br := bufio.NewReaderSize(src, 32<<10)
			bw := bufio.NewWriterSize(io.Discard, 4096)
			b.SetBytes(int64(len(stream)))
			b.ReportAllocs()
			for b.Loop() {
				src.Reset(stream)
				br.Reset(src)
				res := proxy.Relay(bw, br, proxy.RelayOptions{StripUsage: true})
				if !res.Done || res.ContentChunks != n {
					b.Fatalf("relay: %+v", res)
				}
			}
		})
	}
}
