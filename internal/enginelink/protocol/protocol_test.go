package protocol

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// valid are envelopes of every type as peers send them.
var valid = []string{
	`{"v":1,"id":"m1","type":"session.open","session":"s1","payload":{"model":"qwen3-8b","settings":{"temperature":"0.2"}}}`,
	`{"v":1,"id":"m2","type":"chat.request","session":"s1","payload":{"body":"{\"model\":\"qwen3-8b\",\"stream\":true,\"messages\":[],\"top_p\":null}"}}`,
	`{"v":1,"id":"e-0","type":"chat.response","session":"s1","payload":{"status":200,"content_type":"text/event-stream","stream":true}}`,
	`{"v":1,"id":"e-00","type":"chat.response","session":"s1","payload":{"status":429,"content_type":"application/json","body":"{\"error\":{\"message\":\"slow down\"}}"}}`,
	`{"v":1,"id":"e-1","type":"chat.chunk","session":"s1","payload":{"seq":1,"frame":"data: {\"choices\":[{\"delta\":{\"content\":\"<b>&\"}}]}\n\n"}}`,
	`{"v":1,"id":"e-2","type":"chat.done","session":"s1","payload":{"finish_reason":"stop","usage":{"prompt_tokens":3,"completion_tokens":5}}}`,
	`{"v":1,"id":"e-3","type":"chat.done","session":"s1"}`,
	`{"v":1,"id":"e-4","type":"chat.error","session":"s1","payload":{"status":503,"code":"overloaded","message":"busy"}}`,
	`{"v":1,"id":"m3","type":"session.cancel","session":"s1","payload":{"reason":"stop_requested"}}`,
	`{"v":1,"id":"m4","type":"session.close","session":"s1"}`,
	`{"v":1,"id":"e-5","type":"goaway","payload":{"reason":"restart"}}`,
	`{"v":1,"id":"e-6","type":"error","payload":{"ref":"m9","code":"unknown_session","message":"no session s9"}}`,
	// Fields a later minor version may add are skipped.
	`{"v":1,"id":"m5","type":"session.close","session":"s1","trace":"x","payload":{"why":"done"}}`,
}

// invalid are envelopes a peer must refuse, with the code of the refusal
// and whether the refusal can name the envelope's id.
var invalid = []struct {
	name, data, code string
	named            bool
}{
	{"not JSON", `{"v":1,`, CodeInvalid, false},
	{"an array", `[1,2]`, CodeInvalid, false},
	{"deep", strings.Repeat("[", 200) + strings.Repeat("]", 200), CodeInvalid, false},
	{"no id", `{"v":1,"type":"goaway"}`, CodeInvalid, false},
	{"id with a space", `{"v":1,"id":"a b","type":"goaway"}`, CodeInvalid, false},
	{"id too long", `{"v":1,"id":"` + strings.Repeat("a", 65) + `","type":"goaway"}`, CodeInvalid, false},
	{"version 2", `{"v":2,"id":"m1","type":"goaway"}`, CodeVersion, true},
	{"no version", `{"id":"m1","type":"goaway"}`, CodeVersion, true},
	{"unknown type", `{"v":1,"id":"m1","type":"chat.tool"}`, CodeInvalid, true},
	{"chunk without session", `{"v":1,"id":"m1","type":"chat.chunk","payload":{"seq":1,"frame":"data: x\n\n"}}`, CodeInvalid, true},
	{"session with a slash", `{"v":1,"id":"m1","type":"session.close","session":"s/1"}`, CodeInvalid, true},
	{"open without model", `{"v":1,"id":"m1","type":"session.open","session":"s1","payload":{}}`, CodeInvalid, true},
	{"open without payload", `{"v":1,"id":"m1","type":"session.open","session":"s1"}`, CodeInvalid, true},
	{"request with an object body", `{"v":1,"id":"m1","type":"chat.request","session":"s1","payload":{"body":{"model":"x"}}}`, CodeInvalid, true},
	{"response status 100", `{"v":1,"id":"m1","type":"chat.response","session":"s1","payload":{"status":100}}`, CodeInvalid, true},
	{"streamed response with a body", `{"v":1,"id":"m1","type":"chat.response","session":"s1","payload":{"status":200,"stream":true,"body":"x"}}`, CodeInvalid, true},
	{"chunk seq 0", `{"v":1,"id":"m1","type":"chat.chunk","session":"s1","payload":{"seq":0,"frame":"data: x\n\n"}}`, CodeInvalid, true},
	{"chunk without frame", `{"v":1,"id":"m1","type":"chat.chunk","session":"s1","payload":{"seq":1}}`, CodeInvalid, true},
	{"error status 200", `{"v":1,"id":"m1","type":"chat.error","session":"s1","payload":{"status":200,"message":"x"}}`, CodeInvalid, true},
	{"negative usage", `{"v":1,"id":"m1","type":"chat.done","session":"s1","payload":{"usage":{"prompt_tokens":-1,"completion_tokens":0}}}`, CodeInvalid, true},
	{"payload a string", `{"v":1,"id":"m1","type":"goaway","payload":"bye"}`, CodeInvalid, true},
	{"long reason", `{"v":1,"id":"m1","type":"goaway","payload":{"reason":"` + strings.Repeat("r", 1025) + `"}}`, CodeInvalid, true},
	{"error without code", `{"v":1,"id":"m1","type":"error","payload":{"message":"x"}}`, CodeInvalid, true},
}

func TestDecodeAcceptsEveryType(t *testing.T) {
	for _, data := range valid {
		env, err := Decode([]byte(data))
		if err != nil {
			t.Errorf("%s: %v", data, err)
			continue
		}
		// What Encode writes, Decode reads back the same.
		out, err := Encode(env)
		if err != nil {
			t.Fatal(err)
		}
		again, err := Decode(out)
		if err != nil || !sameEnvelope(env, again) {
			t.Errorf("round trip of %s: %s (%v)", data, out, err)
		}
	}
}

func TestDecodeRefuses(t *testing.T) {
	for _, c := range invalid {
		_, err := Decode([]byte(c.data))
		var de *DecodeError
		if !errors.As(err, &de) {
			t.Errorf("%s: accepted (%v)", c.name, err)
			continue
		}
		if de.Code != c.code || (de.ID != "") != c.named {
			t.Errorf("%s: code %q id %q, want %q named %v (%v)", c.name, de.Code, de.ID, c.code, c.named, err)
		}
		// The answer to it is itself a valid envelope naming it.
		reply, err := Encode(de.Reply("r1"))
		if err != nil {
			t.Fatal(err)
		}
		if env, err := Decode(reply); err != nil || env.Type != TypeError {
			t.Errorf("%s: the error reply %s does not decode: %v", c.name, reply, err)
		}
	}
	if _, err := Decode(make([]byte, MaxEnvelope+1)); err == nil {
		t.Error("an envelope over MaxEnvelope was accepted")
	}
}

// A chunk's frame reaches the gateway byte for byte, whatever it holds:
// HTML characters, line breaks, invalid-looking escapes, non-ASCII text.
func TestChunkFramesAreExact(t *testing.T) {
	frames := []string{
		"data: {\"choices\":[{\"delta\":{\"content\":\"<script>&amp;</script>\"}}]}\n\n",
		"data: {\"a\":\"\\u00e9\\n\"}\r\n\r\n",
		"event: x\ndata: 한국어 🙂\n\n",
		"data: [DONE]\n\n",
	}
	for i, f := range frames {
		env, err := New("e1", TypeChatChunk, "s1", ChatChunk{Seq: int64(i + 1), Frame: f})
		if err != nil {
			t.Fatal(err)
		}
		data, err := Encode(env)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(data)
		if err != nil {
			t.Fatal(err)
		}
		p, err := Payload[ChatChunk](got)
		if err != nil || p.Frame != f {
			t.Errorf("frame %q came back as %q (%v)", f, p.Frame, err)
		}
	}
}

func TestSubprotocol(t *testing.T) {
	if v, ok := ParseSubprotocol(Subprotocol(Version)); !ok || v != Version {
		t.Fatalf("%s parses as %d %v", Subprotocol(Version), v, ok)
	}
	for _, bad := range []string{"", "moonji-engine.v", "moonji-engine.v0", "moonji-engine.v01", "moonji-engine.v-1", "moonji-engine.v99999", "other.v1"} {
		if _, ok := ParseSubprotocol(bad); ok {
			t.Errorf("%q parsed", bad)
		}
	}
}

func sameEnvelope(a, b Envelope) bool {
	pa, pb := a.Payload, b.Payload
	a.Payload, b.Payload = nil, nil
	if !reflect.DeepEqual(a, b) {
		return false
	}
	var va, vb any
	if len(pa) > 0 {
		va = mustJSON(pa)
	}
	if len(pb) > 0 {
		vb = mustJSON(pb)
	}
	return reflect.DeepEqual(va, vb)
}
