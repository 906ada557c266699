package jsonguard

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// chatWatch is the gateway's watch (internal/proxy): the fields it reads or
// writes.
var chatWatch = Watch{
	{Name: "model"}, {Name: "stream"}, {Name: "stream_options", Inner: []string{"include_usage"}},
	{Name: "max_tokens"}, {Name: "max_completion_tokens"},
	{Name: "messages", Each: []string{"role", "content", "tool_calls"}}, {Name: "n"}, {Name: "tools"},
}

// corpus returns documents valid and invalid, edge cases first, then the
// recorded bodies of testdata and the project's shared fixtures.
func corpus(t testing.TB) []string {
	docs := []string{
		// Literals and numbers.
		`true`, `false`, `null`, `tru`, `nul`, `falsey`, `True`, `nulll`,
		`0`, `-0`, `1`, `-1`, `10`, `01`, `-01`, `00`, `1.`, `.5`, `1.5`, `-1.5e10`, `1e`, `1e+`, `1e-5`,
		`1E5`, `1.0E+2`, `-`, `--1`, `+1`, `0x10`, `1.5.5`, `1e5e5`, `Infinity`, `NaN`, `-Infinity`,
		`123456789012345678901234567890`, `0.000001`, `1e999`,
		// Strings and escapes.
		`""`, `"a"`, `"`, `"abc`, `"\"`, `"\\"`, `"\/"`, `"\b\f\n\r\t"`, `"\a"`, `"\x41"`, `"\u0041"`,
		`"\u00e9"`, `"\u00E9"`, `"\u00g9"`, `"\u00"`, `"\u"`, `"\ud83d\ude00"`, `"\ud83d"`, `"\ude00"`,
		"\"tab\there\"", "\"nl\nhere\"", "\"nul\x00here\"", "\"del\x7fok\"", `"é"`, "\"\xff\xfe\"",
		`"` + strings.Repeat("x", 100) + `"`, `"` + strings.Repeat("ab\\n", 50) + `"`,
		`"0123456\"`, `"01234567"`, `"0123456789abcdef\\u00e9"`, `"01234567` + "\x1f" + `89"`,
		// Whitespace.
		` 1 `, "\t\n\r 1\r\n", "\f1", "\v1", "\u00a01", "1\x00", "\ufeff{}", ``, ` `,
		// Containers.
		`{}`, `[]`, `{ }`, `[ ]`, `[1,2,3]`, `[1,]`, `[,1]`, `[1 2]`, `[`, `]`, `[[]]`, `[[[]]`, `[]]`,
		`{"a":1}`, `{"a":1,}`, `{,"a":1}`, `{"a"}`, `{"a":}`, `{"a" 1}`, `{a:1}`, `{'a':1}`, `{"a":1 "b":2}`,
		`{"a":[1,{"b":null}],"c":{"d":[true,false]}}`, `{"a":1}}`, `{"a":1]`, `[1}`, `{1:2}`, `{"a":1,"a":2}`,
		`{} {}`, `[] x`, `{}x`, `[1][2]`, `{"":""}`, `{"\u0000":0}`,
		// Engine-shaped bodies.
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":null,"temperature":0.2,"stop":["\n"]}`,
	}
	var files []string
	for _, dir := range []string{"testdata", "../../testdata/ollama-0.17.4", "../../../shared/fixtures/ollama-0.17.4"} {
		m, _ := filepath.Glob(filepath.Join(dir, "*.json"))
		files = append(files, m...)
	}
	if len(files) == 0 {
		t.Fatal("no recorded bodies found")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, string(b))
		// A cut-off body, and one with a byte changed, are invalid.
		docs = append(docs, string(b[:len(b)/2]), strings.Replace(string(b), ":", ";", 1))
	}
	return docs
}

func TestVerdictMatchesEncodingJSON(t *testing.T) {
	for _, doc := range corpus(t) {
		err := Validate([]byte(doc), nil)
		if want := json.Valid([]byte(doc)); (err == nil) != want {
			t.Errorf("Validate(%.80q) = %v; encoding/json.Valid says %v", doc, err, want)
		}
		var e *Error
		if err != nil && (!errors.As(err, &e) || e.Kind != Syntax || e.Offset < 0 || e.Offset > len(doc)) {
			t.Errorf("Validate(%.80q) = %#v; want a Syntax *Error with an offset in the document", doc, err)
		}
	}
}

func TestSyntaxErrorsSayWhatAndWhere(t *testing.T) {
	cases := []struct {
		doc    string
		offset int
		detail string
	}{
		{`{"model":"m",`, 13, "unexpected end of input"},
		{`{"a":tru}`, 8, `invalid character '}' in literal true`},
		{`{"a":"x` + "\n" + `"}`, 7, `invalid character byte 0x0a in a string (control characters must be escaped)`},
		{`{"a":"\q"}`, 7, `invalid character 'q' in a string escape`},
		{`[1,2 3]`, 5, `invalid character '3' after an array element; expected ',' or ']'`},
		{`{"a":1} x`, 8, `invalid character 'x' after the top-level value`},
		{`{"a":01}`, 6, `invalid character '1' after an object member; expected ',' or '}'`},
	}
	for _, c := range cases {
		var e *Error
		if err := Validate([]byte(c.doc), nil); !errors.As(err, &e) || e.Kind != Syntax || e.Offset != c.offset || e.Detail != c.detail {
			t.Errorf("Validate(%q) = %#v; want Syntax at %d: %s", c.doc, err, c.offset, c.detail)
		}
	}
	err := Validate([]byte(`{"a":tru}`), nil)
	if got := err.Error(); got != `invalid JSON at byte 8: invalid character '}' in literal true` {
		t.Errorf("Error() = %q", got)
	}
}

// nest returns depth levels of open, then the innermost value, then the
// closing brackets.
func nest(depth int, open, inner, close string) []byte {
	return []byte(strings.Repeat(open, depth) + inner + strings.Repeat(close, depth))
}

func TestDepth(t *testing.T) {
	shapes := []struct{ name, open, close string }{
		{"arrays", "[", "]"},
		{"objects", `{"a":`, "}"},
		{"mixed", `[{"a":`, "}]"}, // two levels per repeat
	}
	for _, s := range shapes {
		perRepeat := 1
		if s.name == "mixed" {
			perRepeat = 2
		}
		okDepth := MaxDepth / perRepeat
		if err := Validate(nest(okDepth, s.open, "1", s.close), chatWatch); err != nil {
			t.Errorf("%s nested %d deep: %v", s.name, MaxDepth, err)
		}
		doc := nest(okDepth, s.open, s.open+"1"+s.close, s.close) // one repeat more
		var e *Error
		if err := Validate(doc, chatWatch); !errors.As(err, &e) || e.Kind != TooDeep {
			t.Errorf("%s nested %d deep: %v; want TooDeep", s.name, MaxDepth+perRepeat, err)
		}
	}
	// The 129th bracket is the one refused, wherever it is.
	doc := append([]byte(`{"model":"m","messages":`), nest(MaxDepth-1, "[", "", "]")...)
	doc = append(doc, '}')
	if err := Validate(doc, chatWatch); err != nil {
		t.Errorf("128 levels under the top-level object: %v", err)
	}
	doc = append([]byte(`{"model":"m","messages":`), nest(MaxDepth, "[", "", "]")...)
	doc = append(doc, '}')
	var e *Error
	if err := Validate(doc, chatWatch); !errors.As(err, &e) || e.Kind != TooDeep || e.Offset != len(`{"model":"m","messages":`)+MaxDepth-1 {
		t.Errorf("129 levels: %#v; want TooDeep at the 129th bracket", err)
	}
	if got, want := e.Error(), "JSON nests deeper than 128 levels at byte 151"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

// TestHugeNestingIsRefusedQuickly is the attack that killed the process:
// gjson.ValidBytes recursed once per level and overflowed the stack.
func TestHugeNestingIsRefusedQuickly(t *testing.T) {
	for name, doc := range map[string][]byte{
		"arrays":        bytes.Repeat([]byte("["), 3<<20),
		"objects":       bytes.Repeat([]byte(`{"a":`), 3<<20/5),
		"closed arrays": nest(1<<20, "[", "", "]"),
		"in a body":     append([]byte(`{"model":"m","messages":`), bytes.Repeat([]byte(`[{"content":`), 3<<20/12)...),
	} {
		start := time.Now()
		var e *Error
		if err := Validate(doc, chatWatch); !errors.As(err, &e) || e.Kind != TooDeep {
			t.Errorf("%s: %v; want TooDeep", name, err)
		}
		// It stops at the 129th level: microseconds, whatever the size.
		if d := time.Since(start); d > 50*time.Millisecond {
			t.Errorf("%s: took %v", name, d)
		}
	}
}

func TestWatchedKeys(t *testing.T) {
	stop := Watch{{Name: "inference_id"}, {Name: "seen"}}
	cases := []struct {
		name  string
		watch Watch
		doc   string
		kind  Kind // 0: accepted
		field string
		at    int
	}{
		{"plain body", chatWatch, `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[]}`, 0, "", 0},
		{"model twice", chatWatch, `{"model":"allowed","model":"secret"}`, Duplicate, "model", 19},
		{"model twice, spaced", chatWatch, "{ \"model\" : \"a\" ,\n \"model\" : \"b\" }", Duplicate, "model", 19},
		{"stream twice", chatWatch, `{"model":"m","stream":false,"messages":[],"stream":true}`, Duplicate, "stream", 42},
		{"stream_options twice", chatWatch, `{"stream_options":{},"stream_options":{"include_usage":false}}`, Duplicate, "stream_options", 21},
		{"max_tokens twice", chatWatch, `{"max_tokens":1,"max_tokens":100000}`, Duplicate, "max_tokens", 16},
		{"max_completion_tokens twice", chatWatch, `{"max_completion_tokens":1,"max_completion_tokens":2}`, Duplicate, "max_completion_tokens", 27},
		{"messages twice", chatWatch, `{"messages":[],"messages":[{"role":"user","content":"long"}]}`, Duplicate, "messages", 15},
		{"escaped repeat", chatWatch, `{"model":"allowed","mod\u0065l":"secret"}`, Duplicate, "model", 19},
		{"both escaped", chatWatch, `{"\u006dodel":"a","\u006D\u006F\u0064\u0065\u006C":"b"}`, Duplicate, "model", 18},
		{"escaped slash is no model", chatWatch, `{"model":"a","mod\/el":"b"}`, 0, "", 0},
		{"include_usage twice", chatWatch, `{"model":"m","stream":true,"stream_options":{"include_usage":true,"include_usage":false}}`, Duplicate, "stream_options.include_usage", 66},
		{"include_usage escaped twice", chatWatch, `{"stream_options":{"include_usage":true,"include_u\u0073age":false}}`, Duplicate, "stream_options.include_usage", 40},
		{"include_usage in two objects", chatWatch, `{"stream_options":{"include_usage":true},"x":{"include_usage":false}}`, 0, "", 0},
		{"include_usage at the top level", chatWatch, `{"include_usage":true,"stream_options":{"include_usage":true},"include_usage":false}`, 0, "", 0},
		{"stream_options as an array", chatWatch, `{"stream_options":[{"include_usage":true,"include_usage":false}]}`, 0, "", 0},
		{"nested repeats pass", chatWatch, `{"model":"m","messages":[{"role":"user","name":"a","name":"b","content":[{"text":"a","text":"b"}]}],"tools":[{"model":1,"model":2}],"x":{"stream":1,"stream":2}}`, 0, "", 0},
		{"n twice", chatWatch, `{"model":"m","n":1,"n":8}`, Duplicate, "n", 19},
		{"n in another case", chatWatch, `{"model":"m","N":8}`, CaseVariant, "n", 13},
		{"tools twice", chatWatch, `{"tools":[],"tools":[{"type":"function"}]}`, Duplicate, "tools", 12},
		{"content twice in a message", chatWatch, `{"messages":[{"role":"user","content":"a","content":"b"}]}`, Duplicate, "messages[0].content", 42},
		{"role twice in the second message", chatWatch, `{"messages":[{"role":"system"},{"role":"user","role":"system"}]}`, Duplicate, "messages[1].role", 46},
		{"tool_calls twice, escaped", chatWatch, `{"messages":[1,"x",[],{"tool_calls":[],"tool_c\u0061lls":[{}]}]}`, Duplicate, "messages[3].tool_calls", 39},
		{"content in another case", chatWatch, `{"messages":[{"role":"user","Content":"b"}]}`, CaseVariant, "messages[0].content", 28},
		{"each message checked alone", chatWatch, `{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}],"x":[{"content":1,"content":2}]}`, 0, "", 0},
		{"messages as an object", chatWatch, `{"messages":{"content":1,"content":2}}`, 0, "", 0},
		{"deeper than a message", chatWatch, `{"messages":[{"content":[{"content":1,"content":2}]},[{"role":1,"role":2}]]}`, 0, "", 0},
		{"messages repeated after one", chatWatch, `{"messages":[{"role":"user"}],"messages":[]}`, Duplicate, "messages", 30},
		{"unwatched repeats pass", chatWatch, `{"model":"m","temperature":1,"temperature":2,"seed":1,"seed":2}`, 0, "", 0},
		{"top-level array", chatWatch, `[{"model":"a"},{"model":"b"}]`, 0, "", 0},
		{"case variant", chatWatch, `{"model":"allowed","MODEL":"secret"}`, CaseVariant, "model", 19},
		{"case variant alone", chatWatch, `{"model":"m","Stream":true}`, CaseVariant, "stream", 13},
		{"long s", chatWatch, `{"model":"m","ſtream":true}`, CaseVariant, "stream", 13},
		{"kelvin sign", chatWatch, `{"max_to\u212Aens":5}`, CaseVariant, "max_tokens", 1},
		{"inner case variant", chatWatch, `{"stream_options":{"Include_Usage":false}}`, CaseVariant, "stream_options.include_usage", 19},
		{"prefix is no match", chatWatch, `{"model":"m","models":1,"mode":2,"model_":3,"":4}`, 0, "", 0},
		{"stop body", stop, `{"inference_id":"inf_1","seen":3}`, 0, "", 0},
		{"stop id twice", stop, `{"inference_id":"inf_mine","inference_id":"inf_theirs"}`, Duplicate, "inference_id", 27},
		{"stop seen twice", stop, `{"inference_id":"inf_1","seen":3,"seen":0}`, Duplicate, "seen", 33},
		{"no watch", nil, `{"model":"a","model":"b"}`, 0, "", 0},
	}
	for _, c := range cases {
		if !json.Valid([]byte(c.doc)) {
			t.Fatalf("%s: the case itself is not JSON", c.name)
		}
		err := Validate([]byte(c.doc), c.watch)
		if c.kind == 0 {
			if err != nil {
				t.Errorf("%s: %v; want it accepted", c.name, err)
			}
			continue
		}
		var e *Error
		if !errors.As(err, &e) || e.Kind != c.kind || e.Field != c.field || e.Offset != c.at {
			t.Errorf("%s: %#v; want kind %d, field %q at %d", c.name, err, c.kind, c.field, c.at)
		}
	}
	err := Validate([]byte(`{"model":"a","MODEL":"b"}`), chatWatch)
	if got, want := err.Error(), `key "MODEL" at byte 13 differs from "model" only in letter case`; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	err = Validate([]byte(`{"stream":true,"stream":false}`), chatWatch)
	if got, want := err.Error(), `duplicate key "stream" at byte 15`; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

// TestKeysMatchLikeEncodingJSON checks the premise of CaseVariant against
// Go's own decoder: whatever key fills a struct field named like a watched
// key is refused or accepted as that key.
func TestKeysMatchLikeEncodingJSON(t *testing.T) {
	for _, key := range []string{"model", "MODEL", "Model", "mOdEl", "ſtream", "STREAM", "max_to\u212Aens",
		"mod\\u0065l", "mod\\u0045L", "models", "mode", "mod\\u00e9l", "m\\u00f6del", "moDel\\u0000"} {
		doc := []byte(`{"` + key + `":"x"}`)
		var v struct {
			Model     string `json:"model"`
			Stream    string `json:"stream"`
			MaxTokens string `json:"max_tokens"`
		}
		if err := json.Unmarshal(doc, &v); err != nil {
			t.Fatal(err)
		}
		goReads := v.Model != "" || v.Stream != "" || v.MaxTokens != ""
		err := Validate(doc, chatWatch)
		var e *Error
		refused := errors.As(err, &e) && e.Kind == CaseVariant
		exact := gjson.GetBytes(doc, "model").Exists() || gjson.GetBytes(doc, "stream").Exists() || gjson.GetBytes(doc, "max_tokens").Exists()
		if goReads != (exact || refused) {
			t.Errorf("key %s: encoding/json reads it: %v; gjson reads it: %v, refused: %v", key, goReads, exact, err)
		}
	}
}

// TestEqualFold checks the rune comparison against strings.EqualFold for
// every printable ASCII character a watched name may hold and every rune of
// the planes that have case (the rest fold to nothing).
func TestEqualFold(t *testing.T) {
	for c := rune(' '); c < utf8.RuneSelf; c++ {
		for r := rune(0); r < 0x30000; r++ {
			if r == c || !utf8.ValidRune(r) {
				continue
			}
			if got, want := equalFold(r, c), strings.EqualFold(string(r), string(c)); got != want {
				t.Fatalf("equalFold(%U, %q) = %v, strings.EqualFold says %v", r, c, got, want)
			}
		}
	}
}

func TestValidBodiesAllocateNothing(t *testing.T) {
	body, err := os.ReadFile("testdata/chat_8k.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(body, chatWatch); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { _ = Validate(body, chatWatch) }); n != 0 {
		t.Errorf("%v allocations per valid body", n)
	}
	escaped := []byte(`{"mod\u0065l":"m","STREAMING":true,"stream_options":{"include_us\u0061ge":true}}`)
	if n := testing.AllocsPerRun(100, func() { _ = Validate(escaped, chatWatch) }); n != 0 {
		t.Errorf("%v allocations per body with escaped keys", n)
	}
}

// BenchmarkValidate compares the guard with gjson.ValidBytes, which it
// replaces, on a realistic 8 KB chat request (a system prompt, a tool call
// and its result, Korean text, a long user message, two tools with JSON
// schemas, stream_options).
//
//	go test ./internal/jsonguard -run '^$' -bench Validate -benchmem
func BenchmarkValidate(b *testing.B) {
	body, err := os.ReadFile("testdata/chat_8k.json")
	if err != nil {
		b.Fatal(err)
	}
	b.Run("jsonguard", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			if err := Validate(body, chatWatch); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("gjson.ValidBytes", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			if !gjson.ValidBytes(body) {
				b.Fatal("invalid")
			}
		}
	})
	b.Run("encoding_json.Valid", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			if !json.Valid(body) {
				b.Fatal("invalid")
			}
		}
	})
}
