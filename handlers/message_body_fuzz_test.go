package handlers

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzParseMessageBody: a message's body parser never panics; it refuses
// with a *bodyError naming content, attachment_ids (or one of its ids) or
// nothing; what it accepts has at most maxAttachmentIDs ids, each non-empty
// and bounded, and reads the same to encoding/json (a last-wins reader).
//
//	go test ./handlers -run '^$' -fuzz FuzzParseMessageBody -fuzztime 60s
func FuzzParseMessageBody(f *testing.F) {
	for _, s := range []string{`{"content":"hi"}`, `{"content":"hi","attachment_ids":["a_1","a_2"]}`,
		`{"content":"hi","attachment_ids":null}`, `{"content":"hi","attachment_ids":"a_1"}`, `{"content":"x","attachment_ids":[1]}`,
		`{"content":"x","attachment_ids":["a"],"attachment_ids":["b"]}`, `{"content":"x","attachment\u005fids":["b"]}`,
		`{"content":"x","attachment_ids":[""]}`, `[]`, `{"attachment_ids":[]}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		m, err := parseMessageBody(body)
		if err != nil {
			var bad *bodyError
			if e, ok := err.(*bodyError); ok {
				bad = e
			}
			if bad == nil || bad.Message == "" || !(bad.Param == "" || bad.Param == "content" || strings.HasPrefix(bad.Param, "attachment_ids")) {
				t.Fatalf("error %#v for %q", err, body)
			}
			return
		}
		if len(m.AttachmentIDs) > maxAttachmentIDs {
			t.Fatalf("%d ids accepted", len(m.AttachmentIDs))
		}
		for _, id := range m.AttachmentIDs {
			if id == "" || len(id) > maxAttachmentID {
				t.Fatalf("id %q accepted", id)
			}
		}
		var std struct {
			Content       string   `json:"content"`
			AttachmentIDs []string `json:"attachment_ids"`
		}
		if json.Unmarshal(body, &std) != nil || !plainText(m.Content) {
			return // a body only one reader takes, or text each reads its own way
		}
		if std.Content != m.Content || len(std.AttachmentIDs) != len(m.AttachmentIDs) {
			t.Fatalf("%q: parsed %+v, encoding/json %+v", body, m, std)
		}
	})
}
