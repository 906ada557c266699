package engine

import "testing"

// finishReason finds the reason in the frame that has one and skips, without
// parsing, the frames whose finish_reason is null (every other vLLM chunk).
func TestFinishReason(t *testing.T) {
	for _, c := range []struct {
		frame, want string
		parsed      bool
	}{
		{"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}\n\n", "", false},
		{"data: {\"choices\":[{\"delta\":{},\"finish_reason\" : null }]}\n\n", "", false},
		{"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n", "stop", true},
		{"data: {\"choices\":[{\"finish_reason\":null},{\"finish_reason\": \"length\"}]}\n\n", "length", true},
		{"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3}}\n\n", "", false},
		{"data: [DONE]\n\n", "", false},
		// Content that quotes the key has it escaped: not a match.
		{"data: {\"choices\":[{\"delta\":{\"content\":\"\\\"finish_reason\\\": x\"},\"finish_reason\":null}]}\n\n", "", false},
		// A key in content unescaped cannot be told apart: parsed, nothing found.
		{"data: {\"choices\":[{\"delta\":{\"content\":\"x\"},\"finish_reason\":null}],\"x\":{\"finish_reason\":1}}\n\n", "", true},
	} {
		if got := hasFinishReason([]byte(c.frame)); got != c.parsed {
			t.Errorf("hasFinishReason(%q) = %v, want %v", c.frame, got, c.parsed)
		}
		if got := finishReason([]byte(c.frame)); got != c.want {
			t.Errorf("finishReason(%q) = %q, want %q", c.frame, got, c.want)
		}
	}
}
