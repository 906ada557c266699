package proxy

import (
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// MaxReportedTokens bounds a token count an engine may report for one
// request: ten times the largest context windows there are. A larger count
// is an engine's bug (or an echo of a client's hostile max_tokens), and a
// bill no one ran up.
const MaxReportedTokens = 100_000_000

// ReadUsage reads the two counts of an engine's usage object, named prompt
// and completion (chat's prompt_tokens and completion_tokens, Responses'
// input_tokens and output_tokens). A missing or null count is 0: an
// embedding has no completion. ok is false when v is not an object or a
// count is not a whole number from 0 to MaxReportedTokens (-1, 1.5, 1e30,
// "7"): such usage is unknown, and the caller counts and estimates the
// tokens as for a stream cut short.
func ReadUsage(v gjson.Result, prompt, completion string) (Usage, bool) {
	if !v.IsObject() {
		return Usage{}, false
	}
	var (
		u          Usage
		pv, cv, dv gjson.Result
	)
	details := prompt + "_details" // prompt_tokens_details, input_tokens_details
	// One pass, the last of repeated keys winning, as engines' own JSON
	// parsers read them.
	v.ForEach(func(k, x gjson.Result) bool {
		switch k.Str {
		case prompt:
			pv = x
		case completion:
			cv = x
		case details:
			dv = x
		}
		return true
	})
	var okP, okC bool
	u.PromptTokens, okP = TokenCount(pv)
	u.CompletionTokens, okC = TokenCount(cv)
	if dv.IsObject() {
		// A cached count that cannot be true bills every prompt token at
		// the input price: never less than was used.
		if n, ok := TokenCount(dv.Get("cached_tokens")); ok && n <= u.PromptTokens {
			u.CachedTokens = n
		}
	}
	return u, okP && okC
}

// TokenCount reads one count of a usage object: a JSON integer from 0 to
// MaxReportedTokens, written without a fraction or exponent. A missing or
// null value is 0.
func TokenCount(v gjson.Result) (int, bool) {
	if !v.Exists() || v.Type == gjson.Null {
		return 0, true
	}
	if v.Type != gjson.Number || v.Raw == "" || len(v.Raw) > 9 {
		return 0, false
	}
	n := 0
	for i := 0; i < len(v.Raw); i++ {
		d := v.Raw[i]
		if d < '0' || d > '9' {
			return 0, false
		}
		n = n*10 + int(d-'0')
	}
	return n, n <= MaxReportedTokens
}

// UsageText cuts an engine's usage object for a log line: what it said,
// without letting it fill the log.
func UsageText(raw string) string {
	const max = 200
	if len(raw) <= max {
		return raw
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(raw[cut]) {
		cut--
	}
	return raw[:cut] + "…"
}

// EstimateCompletionTokensFor estimates the tokens of a whole answer to
// api whose engine gave no usable count: its text (message content,
// reasoning, tool call arguments; a completion's text; a response's output
// text) at about four characters a token. An embedding has none.
func EstimateCompletionTokensFor(api API, answer []byte) int {
	chars := 0
	add := func(v gjson.Result) {
		if v.Type == gjson.String {
			chars += utf8.RuneCountInString(v.Str)
		}
	}
	root := gjson.ParseBytes(answer)
	switch api {
	case APIEmbeddings:
		return 0
	case APIResponses:
		root.Get("output").ForEach(func(_, item gjson.Result) bool {
			add(item.Get("arguments"))
			item.Get("content").ForEach(func(_, part gjson.Result) bool {
				add(part.Get("text"))
				return true
			})
			return true
		})
	default:
		root.Get("choices").ForEach(func(_, c gjson.Result) bool {
			add(c.Get("text"))
			m := c.Get("message")
			add(m.Get("content"))
			add(m.Get("reasoning_content"))
			m.Get("tool_calls").ForEach(func(_, tc gjson.Result) bool {
				add(tc.Get("function.arguments"))
				return true
			})
			return true
		})
	}
	return (chars + charsPerToken - 1) / charsPerToken
}
