package mockllm

import (
	"fmt"
	"net/http"
	"regexp"
	"testing"

	"github.com/tidwall/gjson"
)

// sentenceEnd matches text that ends a sentence: '.', '!' or '?', then
// perhaps closing quotes or brackets.
var sentenceEnd = regexp.MustCompile(`[.!?]["')\]”’]*$`)

// chatAnswer posts a chat request and returns the answer's text and finish
// reason, read from the stream's deltas and finish chunk or from the whole
// answer.
func chatAnswer(t *testing.T, url string, stream bool, extra string) (string, string) {
	t.Helper()
	body := fmt.Sprintf(`{"model":"mock","stream":%t,"messages":[{"role":"user","content":"Tell me story number 7"}]%s}`, stream, extra)
	status, _, got := do(t, url, body)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, got)
	}
	if !stream {
		return gjson.Get(got, "choices.0.message.content").Str, gjson.Get(got, "choices.0.finish_reason").Str
	}
	text, finish := "", ""
	for _, e := range parseSSE(t, got) {
		if e.data == "[DONE]" {
			continue
		}
		text += gjson.Get(e.data, "choices.0.delta.content").Str
		if f := gjson.Get(e.data, "choices.0.finish_reason"); f.Type == gjson.String {
			finish = f.Str
		}
	}
	return text, finish
}

// An answer that finishes "stop" ends at a sentence, as a model's own end
// does; one cut mid-sentence — by max_tokens, or by the mock's own length —
// finishes "length", as a real engine's does. The demo model's answers
// (WholeSentences) end at a sentence. Streamed and whole alike.
func TestFinishStopEndsASentence(t *testing.T) {
	_, plain := start(t, Options{})
	demo := DemoOptions()
	demo.TokensPerSecond, demo.Models = 0, []string{"mock"}
	_, whole := start(t, demo)
	prompt := "Tell me story number 7"
	sentence := SentenceLength(prompt, 30)
	if sentence < 2 {
		t.Fatalf("SentenceLength = %d", sentence)
	}
	cases := []struct {
		name, url, extra string
		tokens           int
		finish           string
	}{
		{"default length, mid-sentence", plain.URL, ``, 16, "length"},
		{"knob, mid-sentence", plain.URL, fmt.Sprintf(`,"mock":{"tokens":%d}`, sentence-1), sentence - 1, "length"},
		{"knob, at a sentence end", plain.URL, fmt.Sprintf(`,"mock":{"tokens":%d}`, sentence), sentence, "stop"},
		{"max_tokens, mid-sentence", plain.URL, `,"max_tokens":5`, 5, "length"},
		{"max_tokens, at a sentence end", plain.URL, fmt.Sprintf(`,"max_tokens":%d`, sentence), sentence, "length"},
		{"demo model", whole.URL, ``, SentenceLength(prompt, 120), "stop"},
		{"demo model, max_tokens", whole.URL, `,"max_tokens":5`, 5, "length"},
	}
	for _, c := range cases {
		for _, stream := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/stream=%t", c.name, stream), func(t *testing.T) {
				text, finish := chatAnswer(t, c.url, stream, c.extra)
				if want := CompletionText(prompt, c.tokens); text != want || finish != c.finish {
					t.Fatalf("answer %q finish %q, want %q finish %q", text, finish, want, c.finish)
				}
				if finish == "stop" && !sentenceEnd.MatchString(text) {
					t.Errorf("finish stop, but the answer stops mid-sentence: %q", text)
				}
				if !sentenceEnd.MatchString(text) && finish != "length" {
					t.Errorf("cut mid-sentence, but finish %q: %q", finish, text)
				}
			})
		}
	}
}

// Whatever the prompt (every story) and the target length, the demo
// model's answer ends at a sentence, at most the target long unless its
// first sentence is longer.
func TestSentenceLength(t *testing.T) {
	for i := range 30 {
		prompt := fmt.Sprintf("prompt %d", i)
		for _, n := range []int{1, 10, 16, 40, 120, 500} {
			k := SentenceLength(prompt, n)
			toks := CompletionTokens(prompt, k)
			if k < 1 || !EndsSentence(toks[k-1]) {
				t.Fatalf("%q, %d: %d tokens, ending %q", prompt, n, k, toks[len(toks)-1])
			}
			if k > n {
				for _, tok := range toks[:k-1] {
					if EndsSentence(tok) {
						t.Fatalf("%q, %d: %d tokens although a sentence ends at %q", prompt, n, k, tok)
					}
				}
			}
		}
	}
	for tok, want := range map[string]bool{"reef.\"": true, "way.": true, "blink.": true, "say,": false, "Mia,\"": false, "\"Please": false, "Pip": false, "why?": true, "hi!)": true} {
		if EndsSentence(tok) != want {
			t.Errorf("EndsSentence(%q) = %t", tok, !want)
		}
	}
}
