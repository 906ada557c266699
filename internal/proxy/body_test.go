package proxy

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestParseRequestRefusesDeepNesting: a few MB of nesting used to end the
// process in gjson.ValidBytes (a stack overflow, which recover() cannot
// catch: 6 MB of "[" exceed Go's 1 GB stack limit; 3 MB took 1.5 s); now
// the guard refuses it at the 129th level.
func TestParseRequestRefusesDeepNesting(t *testing.T) {
	for name, body := range map[string][]byte{
		"arrays":          bytes.Repeat([]byte("["), 8<<20),
		"3 MB of arrays":  bytes.Repeat([]byte("["), 3<<20),
		"objects":         bytes.Repeat([]byte(`{"a":`), 3<<20/5),
		"under messages":  append([]byte(`{"model":"m","messages":`), bytes.Repeat([]byte("["), 3<<20)...),
		"129 levels":      []byte(`{"model":"m","x":` + strings.Repeat("[", 128) + strings.Repeat("]", 128) + `}`),
		"129 levels, obj": []byte(strings.Repeat(`{"a":`, 129) + "1" + strings.Repeat("}", 129)),
	} {
		start := time.Now()
		_, err := ParseRequest(body)
		var bad *BadRequestError
		if !errors.As(err, &bad) || bad.Message != "request body nests deeper than 128 levels" || bad.Param != "" {
			t.Errorf("%s: %v; want the depth refusal", name, err)
		}
		if d := time.Since(start); d > 100*time.Millisecond {
			t.Errorf("%s: took %v", name, d)
		}
	}
	// 128 levels are fine.
	body := `{"model":"m","x":` + strings.Repeat("[", 127) + strings.Repeat("]", 127) + `}`
	if _, err := ParseRequest([]byte(body)); err != nil {
		t.Errorf("128 levels: %v", err)
	}
}

// TestParseRequestRefusesRepeatedFields: the gateway reads the first of
// repeated keys, the engines the last; a repeat of a field the gateway
// reads or writes is refused, naming it.
func TestParseRequestRefusesRepeatedFields(t *testing.T) {
	refused := []struct{ body, param, message string }{
		{`{"model":"allowed","model":"secret","messages":[]}`, "model", `duplicate key "model" in the request body`},
		{`{"model":"allowed","messages":[],"mod\u0065l":"secret"}`, "model", `duplicate key "model" in the request body`},
		{`{"model":"m","stream":false,"messages":[],"stream":true}`, "stream", `duplicate key "stream" in the request body`},
		{`{"model":"m","stream":true,"stream_options":{"include_usage":true,"include_usage":false}}`, "stream_options.include_usage",
			`duplicate key "stream_options.include_usage" in the request body`},
		{`{"model":"m","stream":true,"stream_options":{"include_usage":false},"stream_options":{}}`, "stream_options",
			`duplicate key "stream_options" in the request body`},
		{`{"model":"m","max_tokens":1,"max_tokens":100000}`, "max_tokens", `duplicate key "max_tokens" in the request body`},
		{`{"model":"m","max_completion_tokens":1,"max_completion_tokens":2}`, "max_completion_tokens", `duplicate key "max_completion_tokens" in the request body`},
		{`{"model":"m","messages":[],"messages":[{"role":"user","content":"x"}]}`, "messages", `duplicate key "messages" in the request body`},
		{`{"model":"m","n":1,"n":8}`, "n", `duplicate key "n" in the request body`},
		{`{"model":"m","tools":[],"tools":[{"type":"function","function":{"name":"f"}}]}`, "tools", `duplicate key "tools" in the request body`},
		// The prompt estimate reads each message's role, content and tool_calls.
		{`{"model":"m","messages":[{"role":"user","content":"a","content":"b"}]}`, "messages[0].content", `duplicate key "messages[0].content" in the request body`},
		{`{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","tool_calls":[],"role":"user","content":"b"}]}`, "messages[1].role", `duplicate key "messages[1].role" in the request body`},
		{`{"model":"m","messages":[{"role":"assistant","tool_calls":[],"tool_calls":[{"id":"x"}]}]}`, "messages[0].tool_calls", `duplicate key "messages[0].tool_calls" in the request body`},
		{`{"model":"allowed","MODEL":"secret"}`, "model", `key "MODEL" in the request body differs from "model" only in letter case; some engines read it as "model"`},
		{`{"model":"m","Stream":true}`, "stream", `key "Stream" in the request body differs from "stream" only in letter case; some engines read it as "stream"`},
	}
	for _, c := range refused {
		_, err := ParseRequest([]byte(c.body))
		var bad *BadRequestError
		if !errors.As(err, &bad) || bad.Param != c.param || bad.Message != c.message {
			t.Errorf("ParseRequest(%s) = %#v; want param %q, message %q", c.body, err, c.param, c.message)
		}
	}
	// Repeats elsewhere pass through untouched: only the gateway's fields matter.
	for _, body := range []string{
		`{"model":"m","messages":[{"role":"user","content":"a","name":"x","name":"y"}],"temperature":1,"temperature":0}`,
		`{"model":"m","tools":[{"model":"x","model":"y"}],"metadata":{"stream":true,"stream":false}}`,
		`{"model":"m","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true,"continuous_usage_stats":false}}`,
	} {
		if _, err := ParseRequest([]byte(body)); err != nil {
			t.Errorf("ParseRequest(%s): %v", body, err)
		}
	}
	// An escaped key is read as what it decodes to, by the gateway as by the engine.
	r, err := ParseRequest([]byte(`{"mod\u0065l":"m","str\u0065am":true}`))
	if err != nil || r.Model != "m" || !r.Stream {
		t.Errorf("escaped keys: %+v, %v", r, err)
	}
}

func TestParseRequestSaysWhereTheSyntaxBreaks(t *testing.T) {
	_, err := ParseRequest([]byte(`{"model":"m",}`))
	var bad *BadRequestError
	if !errors.As(err, &bad) || bad.Message != `request body is not valid JSON: invalid character '}' looking for the beginning of an object key at byte 13` {
		t.Errorf("ParseRequest = %v", err)
	}
}
