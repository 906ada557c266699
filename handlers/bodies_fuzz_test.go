package handlers

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// refusal checks that err is a *bodyError with a message and one of params.
func refusal(t *testing.T, err error, body []byte, params ...string) {
	t.Helper()
	var bad *bodyError
	if !errors.As(err, &bad) || bad.Message == "" {
		t.Fatalf("error %#v for %q: want a *bodyError with a message", err, body)
	}
	for _, p := range append(params, "") {
		if bad.Param == p {
			return
		}
	}
	t.Fatalf("param %q for %q: want one of %q or none", bad.Param, body, params)
}

// plainText reports whether s reads the same to every JSON reader: valid
// UTF-8 without replacement characters (encoding/json turns broken text
// into U+FFFD, gjson keeps the bytes).
func plainText(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsRune(s, utf8.RuneError)
}

// FuzzParseStopBody: the stop endpoint's body parser never panics; it
// refuses with a *bodyError naming inference_id, seen or nothing; what it
// accepts reads the same to encoding/json (a last-wins reader); and a body
// written by encoding/json from any id and count is read back exactly.
//
//	go test ./handlers -run '^$' -fuzz FuzzParseStopBody -fuzztime 60s
func FuzzParseStopBody(f *testing.F) {
	for _, b := range []string{
		`{"inference_id":"inf_1","seen":3}`, `{"inference_id":"inf_1"}`, `{"inference_id":"inf_1","seen":null}`,
		`{"inference_id":"inf_1","seen":0}`, `{"inference_id":"inf_1","seen":-0}`, `{"inference_id":"inf_1","seen":1e2}`,
		`{"inference_id":"inf_1","seen":1.5}`, `{"inference_id":"inf_1","seen":-1}`, `{"inference_id":"inf_1","seen":"4"}`,
		`{"inference_id":"inf_1","seen":99999999999999999999}`, `{"inference_id":"inf_1","seen":9223372036854775807}`,
		`{"inference_id":"a","inference_id":"b"}`, `{"inference_id":"a","Inference_ID":"b"}`, `{"inference_id":"a","s\u0065en":1,"seen":2}`,
		`{"inference_id":""}`, `{"inference_id":7}`, `{"seen":1}`, `["inf_1"]`, `"inf_1"`, ``, `{`, `{"inference_id":"inf_1"} {}`,
		`{"inference_id":"inf_\u00e9\ud83d\ude00","seen":2,"extra":[{"seen":1,"seen":2}]}`, `{"inference_id":"` + strings.Repeat("[", 200) + `"}`,
		`{"x":` + strings.Repeat("[", 200) + `}`,
	} {
		f.Add([]byte(b), "inf_1", int64(3))
	}
	f.Add([]byte(`{}`), "", int64(-1))
	f.Add([]byte(`{}`), "inf_\x00\"\\", int64(0))
	f.Fuzz(func(t *testing.T, body []byte, id string, seen int64) {
		got, err := parseStopBody(body)
		if err != nil {
			refusal(t, err, body, "inference_id", "seen")
		} else {
			if got.InferenceID == "" || got.Seen < -1 {
				t.Fatalf("accepted %q as %+v", body, got)
			}
			// encoding/json, which takes the last of repeated keys, reads
			// the same id and count.
			var std struct {
				InferenceID *string          `json:"inference_id"`
				Seen        *json.RawMessage `json:"seen"`
			}
			if err := json.Unmarshal(body, &std); err != nil {
				t.Fatalf("accepted %q, which encoding/json refuses: %v", body, err)
			}
			if std.InferenceID == nil || plainText(got.InferenceID) && *std.InferenceID != got.InferenceID {
				t.Fatalf("inference_id %q; encoding/json reads %v in %q", got.InferenceID, std.InferenceID, body)
			}
			if std.Seen == nil || string(*std.Seen) == "null" {
				if got.Seen != -1 {
					t.Fatalf("seen %d; encoding/json reads none in %q", got.Seen, body)
				}
			} else if n, err := strconv.ParseInt(string(*std.Seen), 10, 64); err == nil {
				if int64(got.Seen) != n {
					t.Fatalf("seen %d; encoding/json reads %d in %q", got.Seen, n, body)
				}
			} else {
				// Written as a float (1e2): the same number.
				var f float64
				if err := json.Unmarshal(*std.Seen, &f); err != nil || float64(got.Seen) != f {
					t.Fatalf("seen %d; encoding/json reads %s (%v) in %q", got.Seen, *std.Seen, err, body)
				}
			}
		}

		// A body written by encoding/json is accepted exactly when the id
		// is not empty and seen is a count or left out (an odd negative
		// seen leaves it out), and read back.
		id = strings.ToValidUTF8(id, "")
		m := map[string]any{"inference_id": id}
		hasSeen := seen >= 0 || seen%2 == 0
		if hasSeen {
			m["seen"] = seen
		}
		b, _ := json.Marshal(m)
		got, err = parseStopBody(b)
		switch {
		case id == "":
			refusal(t, err, b, "inference_id")
		case hasSeen && seen < 0:
			refusal(t, err, b, "seen")
		case err != nil:
			t.Fatalf("refused %s: %v", b, err)
		case got.InferenceID != id || hasSeen && int64(got.Seen) != seen || !hasSeen && got.Seen != -1:
			t.Fatalf("read %s as %+v", b, got)
		}
	})
}

// chatFields are the fields the chat API's bodies carry, one per body.
var chatFields = []string{"model", "title", "content"}

// FuzzParseStringBody: the chat API's body parser (create, rename, send)
// never panics; it refuses with a *bodyError naming the field or nothing;
// what it accepts reads the same to encoding/json; and a body written by
// encoding/json with any text is read back exactly, whatever else it holds.
//
//	go test ./handlers -run '^$' -fuzz FuzzParseStringBody -fuzztime 60s
func FuzzParseStringBody(f *testing.F) {
	for _, b := range []string{
		`{"model":"m1"}`, `{"title":"A title"}`, `{"content":"Hello\nthere \u00e9 \ud83d\ude00"}`, `{"content":""}`,
		`{"content":null}`, `{"content":1}`, `{"content":["a"]}`, `{}`, `[]`, `"content"`, ``, `{"content":"a"`,
		`{"content":"a","content":"b"}`, `{"content":"a","CONTENT":"b"}`, `{"cont\u0065nt":"a"}`, `{"content":"a","x":{"content":1,"content":2}}`,
		`{"content":"\ud800"}`, "{\"content\":\"\xff\"}", `{"content":"` + strings.Repeat("x", 1000) + `"}`,
		`{"x":` + strings.Repeat("[", 200) + `}`, ` {"model" : "m1" , "model_" : 2 } `,
	} {
		f.Add([]byte(b), uint8(2), "text", false)
	}
	f.Add([]byte(`{"model":"m1"}`), uint8(0), "m1", true)
	f.Fuzz(func(t *testing.T, body []byte, which uint8, text string, extra bool) {
		field := chatFields[int(which)%len(chatFields)]
		got, err := parseStringBody(body, field)
		if err != nil {
			refusal(t, err, body, field)
		} else {
			var std map[string]json.RawMessage
			if err := json.Unmarshal(body, &std); err != nil {
				t.Fatalf("accepted %q, which encoding/json refuses: %v", body, err)
			}
			var s string
			if err := json.Unmarshal(std[field], &s); err != nil {
				t.Fatalf("accepted %q; encoding/json reads %s as %s", body, field, std[field])
			}
			if plainText(got) && s != got {
				t.Fatalf("%s %q; encoding/json reads %q in %q", field, got, s, body)
			}
		}

		// A body written by encoding/json is accepted and read back.
		text = strings.ToValidUTF8(text, "")
		m := map[string]any{field: text}
		if extra {
			// Other members, even repeats of the field deeper down, change nothing.
			m["other"] = map[string]any{field: 1, "list": []any{field, nil}}
		}
		b, _ := json.Marshal(m)
		if got, err := parseStringBody(b, field); err != nil || got != text {
			t.Fatalf("read %s as %q, %v; want %q", b, got, err, text)
		}
		// The same body as another field's is refused, naming that field.
		other := chatFields[(int(which)+1)%len(chatFields)]
		if _, err := parseStringBody(b, other); err == nil {
			t.Fatalf("%s read from %s", other, b)
		} else {
			refusal(t, err, b, other)
		}
	})
}

// FuzzParseConversationPatch: whatever the body, parseConversationPatch
// never panics; it refuses with a *bodyError naming one of its fields or
// nothing; what it accepts is a JSON object to encoding/json, and a
// temperature, max_tokens, pinned, folder and text it reads are what
// encoding/json reads. A body written by encoding/json with a pin and any
// folder name is read back exactly.
//
//	go test ./handlers -run '^$' -fuzz FuzzParseConversationPatch -fuzztime 60s
func FuzzParseConversationPatch(f *testing.F) {
	for _, b := range []string{
		`{"system_prompt":"Be brief.","temperature":0.2,"max_tokens":100}`, `{"title":"t"}`, `{"temperature":null}`,
		`{"max_tokens":1e2}`, `{"max_tokens":-1}`, `{"max_tokens":1.5}`, `{"temperature":"1"}`, `{}`, `[]`, ``,
		`{"system_prompt":"a","system_prompt":"b"}`, `{"Temperature":1,"temperature":2}`, `{"x":` + strings.Repeat("[", 200) + `}`,
		`{"pinned":true}`, `{"pinned":false,"folder":"Work"}`, `{"pinned":"true"}`, `{"pinned":1}`, `{"pinned":null}`,
		`{"folder":null}`, `{"folder":""}`, `{"folder":7}`, `{"folder":["a"]}`, `{"folder":"a","folder":"b"}`,
		`{"folder":"\u0000\u001b[31m"}`, `{"folder":"\ud800"}`, `{"pinned":true,"pinned":false}`, `{"folder":{"folder":"x"}}`,
	} {
		f.Add([]byte(b))
	}
	fields := []string{"title", "system_prompt", "temperature", "max_tokens", "pinned", "folder"}
	f.Fuzz(func(t *testing.T, body []byte) {
		// Whatever the body, a well-formed patch made of it is read back.
		name := strings.ToValidUTF8(string(body), "")
		pin := len(body)%2 == 0
		b, _ := json.Marshal(map[string]any{"pinned": pin, "folder": name, "other": map[string]any{"folder": 1}})
		if p, err := parseConversationPatch(b); err != nil || p.Pinned == nil || *p.Pinned != pin || p.Folder == nil || *p.Folder != name {
			t.Fatalf("read %s as %+v, %v", b, p, err)
		}

		p, err := parseConversationPatch(body)
		if err != nil {
			refusal(t, err, body, fields...)
			return
		}
		var std map[string]any
		if err := json.Unmarshal(body, &std); err != nil {
			t.Fatalf("accepted %q, which encoding/json refuses: %v", body, err)
		}
		if p.Temperature != nil {
			if v, ok := std["temperature"].(float64); !ok || v != *p.Temperature {
				t.Fatalf("temperature %v; encoding/json reads %v in %q", *p.Temperature, std["temperature"], body)
			}
		}
		if p.MaxTokens != nil {
			if v, ok := std["max_tokens"].(float64); !ok || v != float64(*p.MaxTokens) || *p.MaxTokens < 0 {
				t.Fatalf("max_tokens %d; encoding/json reads %v in %q", *p.MaxTokens, std["max_tokens"], body)
			}
		}
		if p.SystemPrompt != nil && plainText(*p.SystemPrompt) {
			if v, ok := std["system_prompt"].(string); !ok || v != *p.SystemPrompt {
				t.Fatalf("system_prompt %q; encoding/json reads %v in %q", *p.SystemPrompt, std["system_prompt"], body)
			}
		}
		if p.Pinned != nil {
			if v, ok := std["pinned"].(bool); !ok || v != *p.Pinned {
				t.Fatalf("pinned %v; encoding/json reads %v in %q", *p.Pinned, std["pinned"], body)
			}
		} else if _, ok := std["pinned"]; ok {
			t.Fatalf("pinned ignored; encoding/json reads %v in %q", std["pinned"], body)
		}
		if p.Folder != nil {
			switch v := std["folder"].(type) {
			case nil:
				if *p.Folder != "" {
					t.Fatalf("folder %q; encoding/json reads null in %q", *p.Folder, body)
				}
			case string:
				if plainText(*p.Folder) && v != *p.Folder {
					t.Fatalf("folder %q; encoding/json reads %q in %q", *p.Folder, v, body)
				}
			default:
				t.Fatalf("folder %q; encoding/json reads %v in %q", *p.Folder, v, body)
			}
		} else if _, ok := std["folder"]; ok {
			t.Fatalf("folder ignored; encoding/json reads %v in %q", std["folder"], body)
		}
	})
}
