package proxy

import (
	"encoding/json"
	"testing"

	"github.com/tidwall/gjson"
)

func TestReadUsage(t *testing.T) {
	for _, c := range []struct {
		usage string
		want  Usage
		ok    bool
	}{
		{`{"prompt_tokens":12,"completion_tokens":9}`, Usage{PromptTokens: 12, CompletionTokens: 9}, true},
		{`{"prompt_tokens":12}`, Usage{PromptTokens: 12, CompletionTokens: 0}, true}, // an embedding
		{`{"prompt_tokens":null,"completion_tokens":0}`, Usage{PromptTokens: 0, CompletionTokens: 0}, true},
		{`{"prompt_tokens":100000000,"completion_tokens":1}`, Usage{PromptTokens: 100000000, CompletionTokens: 1}, true},
		{`{"prompt_tokens":1,"prompt_tokens":-1}`, Usage{}, false}, // the last of repeats, as engines read
		{`{"prompt_tokens":-5,"completion_tokens":9}`, Usage{}, false},
		{`{"prompt_tokens":5,"completion_tokens":-1}`, Usage{}, false},
		{`{"prompt_tokens":-0,"completion_tokens":1}`, Usage{}, false},
		{`{"prompt_tokens":1.5}`, Usage{}, false},
		{`{"prompt_tokens":5.0}`, Usage{}, false},
		{`{"prompt_tokens":1e3}`, Usage{}, false},
		{`{"prompt_tokens":1e30}`, Usage{}, false},
		{`{"completion_tokens":9223372036854775807}`, Usage{}, false},
		{`{"completion_tokens":100000001}`, Usage{}, false},
		{`{"prompt_tokens":"12"}`, Usage{}, false},
		{`{"prompt_tokens":true}`, Usage{}, false},
		{`{"prompt_tokens":[1]}`, Usage{}, false},
		{`[1,2]`, Usage{}, false},
		// Cached tokens: read when they can be true, else billed as input.
		{`{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}`, Usage{PromptTokens: 10, CompletionTokens: 2, CachedTokens: 4}, true},
		{`{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":40}}`, Usage{PromptTokens: 10, CompletionTokens: 2}, true},
		{`{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":-1}}`, Usage{PromptTokens: 10, CompletionTokens: 2}, true},
		{`{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":null}`, Usage{PromptTokens: 10, CompletionTokens: 2}, true},
		{`7`, Usage{}, false},
	} {
		got, ok := ReadUsage(gjson.Parse(c.usage), "prompt_tokens", "completion_tokens")
		if ok != c.ok || (ok && got != c.want) {
			t.Errorf("ReadUsage(%s) = %+v, %v; want %+v, %v", c.usage, got, ok, c.want, c.ok)
		}
	}
}

// FuzzReadUsage: whatever an engine's usage object holds, a count read from
// it is one that can be true, and it is what a JSON decoder reads there.
func FuzzReadUsage(f *testing.F) {
	for _, s := range []string{`{"prompt_tokens":12,"completion_tokens":9}`, `{"prompt_tokens":-1}`, `{"prompt_tokens":1e30}`,
		`{"completion_tokens":9223372036854775807}`, `{"prompt_tokens":1.5}`, `{"prompt_tokens":007}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, ok := ReadUsage(gjson.Parse(s), "prompt_tokens", "completion_tokens")
		if !ok {
			return
		}
		if u.PromptTokens < 0 || u.PromptTokens > MaxReportedTokens || u.CompletionTokens < 0 || u.CompletionTokens > MaxReportedTokens {
			t.Fatalf("ReadUsage(%q) = %+v", s, u)
		}
		var m map[string]json.RawMessage
		if json.Unmarshal([]byte(s), &m) != nil {
			return // not JSON: gjson's reading of it is all there is
		}
		for name, got := range map[string]int{"prompt_tokens": u.PromptTokens, "completion_tokens": u.CompletionTokens} {
			raw, present := m[name]
			var n *int64
			if present && json.Unmarshal(raw, &n) != nil {
				t.Fatalf("ReadUsage(%q) took %s = %s, which is not an integer", s, name, raw)
			}
			if n != nil && *n != int64(got) {
				t.Fatalf("ReadUsage(%q): %s = %d, a decoder reads %d", s, name, got, *n)
			}
		}
	})
}
