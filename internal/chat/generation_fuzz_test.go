package chat

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// fuzzChunk is a chunk of a chat stream as vLLM writes one.
func fuzzChunk(text string) string {
	b, _ := json.Marshal(map[string]any{
		"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
		"choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": text}, "finish_reason": nil}},
	})
	return string(b)
}

// FuzzReadAnswer feeds bytes as the gateway's answer stream through the
// chat's reader (readData, readDelta). On any stream: no panic, each
// payload comes from one "data:" line of the stream, in order, and a
// payload yields text or an engine error only when it is a JSON object.
// On a stream written from pieces of text (LF or CRLF line ends, comments,
// role, finish, usage, [DONE], maybe an engine error): exactly the
// non-empty pieces come back, one delta each, in order, and the error.
//
//	go test ./internal/chat -run '^$' -fuzz FuzzReadAnswer -fuzztime 60s
func FuzzReadAnswer(f *testing.F) {
	for _, s := range []string{
		"data: " + fuzzChunk("Hello") + "\n\ndata: " + fuzzChunk(" world") + "\n\ndata: [DONE]\n\n",
		"data:" + fuzzChunk("no space") + "\r\n\r\n: comment\r\ndata: [DONE]\r\n\r\n",
		"event: x\nid: 3\ndata: " + fuzzChunk("a") + "\ndata: " + fuzzChunk("b") + "\n\n",
		`data: {"error":{"message":"boom","type":"InternalServerError","code":500}}` + "\n\ndata: [DONE]\n\n",
		`data: {"error":{}}` + "\n\n" + `data: {"error":null,"choices":[{"delta":{"content":"x"}}]}` + "\n\n",
		`data: {"choices":[{"delta":{"content":1}}]}` + "\n\n" + `data: {"choices":[]}` + "\n\n" + `data: {"choices":{"0":{"delta":{"content":"k"}}}}`,
		`data: {"choices":[{"delta":{"content":"torn` + "\n\n",
		"data: " + strings.Repeat("[", 300) + "\n\n", "data: \n\ndata:\n\n", "no newline at all", "data: [DONE]",
	} {
		f.Add([]byte(s), "Hello| world", false, false)
	}
	f.Add([]byte{}, "a||b|\u00e9\n|\x00|\"quoted\"|<b>", true, true)
	f.Add([]byte("data: x\r\n"), "", false, true)
	f.Fuzz(func(t *testing.T, stream []byte, pieces string, crlf, failing bool) {
		// Any stream: the payloads are those of its "data:" lines, all of
		// them, in order, however the reads split it.
		var lines [][]byte
		for _, line := range bytes.SplitAfter(stream, []byte("\n")) {
			if p, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data:")); ok {
				lines = append(lines, bytes.TrimPrefix(p, []byte(" ")))
			}
		}
		seen := 0
		err := readData(bufio.NewReaderSize(bytes.NewReader(stream), 16), func(payload []byte) bool {
			if seen >= len(lines) || !bytes.Equal(payload, lines[seen]) {
				t.Fatalf("payload %d is %q; the stream's data lines are %q", seen, payload, lines)
			}
			seen++
			d := readDelta(payload)
			if (d.text != "" || d.engineErr != "") && !json.Valid(payload) {
				t.Fatalf("payload %q, not JSON, read as %+v", payload, d)
			}
			if d.text != "" && d.engineErr != "" {
				t.Fatalf("payload %q read as both text and error: %+v", payload, d)
			}
			return true
		})
		if err != nil || seen != len(lines) {
			t.Fatalf("%d payloads of %d data lines, err %v", seen, len(lines), err)
		}

		// A stream written from pieces.
		nl := "\n"
		if crlf {
			nl = "\r\n"
		}
		var b strings.Builder
		frame := func(payload string) { b.WriteString("data: " + payload + nl + nl) }
		frame(`{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`)
		var want []string
		for i, p := range strings.Split(strings.ToValidUTF8(pieces, ""), "|") {
			if i%3 == 2 {
				b.WriteString(": keep-alive" + nl + nl)
			}
			frame(fuzzChunk(p))
			if p != "" {
				want = append(want, p)
			}
		}
		if failing {
			frame(`{"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}`)
		}
		frame(`{"id":"chatcmpl-1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`)
		frame(`{"id":"chatcmpl-1","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}`)
		frame("[DONE]")
		var got []string
		engineErr := ""
		err = readData(bufio.NewReader(strings.NewReader(b.String())), func(payload []byte) bool {
			d := readDelta(payload)
			if d.text != "" {
				got = append(got, d.text)
			}
			if d.engineErr != "" {
				engineErr = d.engineErr
			}
			return true
		})
		if err != nil || strings.Join(got, "\x1f") != strings.Join(want, "\x1f") || len(got) != len(want) {
			t.Fatalf("read %q (err %v) from pieces %q", got, err, want)
		}
		if wantErr := map[bool]string{true: "boom"}[failing]; engineErr != wantErr {
			t.Fatalf("engine error %q, want %q", engineErr, wantErr)
		}
		for _, s := range got {
			if !utf8.ValidString(s) {
				t.Fatalf("text %q is not UTF-8", s)
			}
		}
	})
}

// readData stops at once when told to: an answer grown too large is cut
// there, and nothing after it is read.
func TestReadDataStopsWhenTold(t *testing.T) {
	stream := "data: " + fuzzChunk("a") + "\n\ndata: " + fuzzChunk("b") + "\n\ndata: " + fuzzChunk("c") + "\n\n"
	br := bufio.NewReader(strings.NewReader(stream))
	var got []string
	err := readData(br, func(payload []byte) bool {
		got = append(got, readDelta(payload).text)
		return len(got) < 2
	})
	if err != nil || strings.Join(got, "") != "ab" {
		t.Fatalf("read %q, %v", got, err)
	}
	if rest, _ := br.ReadString(0); !strings.Contains(rest, `"c"`) {
		t.Errorf("read past the stop: %q left", rest)
	}
}
