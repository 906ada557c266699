package proxy

import (
	"bufio"
	"encoding/json"
	"strings"
	"testing"
)

func relayString(t *testing.T, stream string) (string, *RelayResult) {
	t.Helper()
	var out strings.Builder
	bw := bufio.NewWriter(&out)
	res := Relay(bw, bufio.NewReader(strings.NewReader(stream)), RelayOptions{})
	return out.String(), &res
}

// An error the engine writes into its 200 stream is relayed as written and
// reported, in both the shapes engines use.
func TestRelayReportsAnErrorInsideTheStream(t *testing.T) {
	for _, frame := range []string{
		`data: {"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}`,
		`data: {"object":"error","message":"boom","type":"BadRequestError","param":null,"code":400}`,
	} {
		stream := "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n" + frame + "\n\ndata: [DONE]\n\n"
		out, res := relayString(t, stream)
		if out != stream {
			t.Errorf("relayed %q, want it unchanged", out)
		}
		if res.EngineError != "boom" || !res.Done {
			t.Errorf("%s: result %+v", frame, res)
		}
	}
	// Content that merely mentions an error is no error.
	_, res := relayString(t, "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\\\"error\\\": 1\"}}]}\n\ndata: [DONE]\n\n")
	if res.EngineError != "" || res.ContentChunks != 1 {
		t.Errorf("content with the word error: %+v", res)
	}
}

// The relay knows which choices are still open, so that a stop can close
// exactly those.
func TestUnfinishedChoices(t *testing.T) {
	stream := "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}},{\"index\":1,\"delta\":{\"content\":\"b\"}}]}\n\n" +
		"data: {\"id\":\"c1\",\"choices\":[{\"index\":1,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n" +
		"data: {\"id\":\"c1\",\"choices\":[{\"index\":2,\"delta\":{\"content\":\"c\"}}]}\n\n"
	_, res := relayString(t, stream)
	if got := res.Unfinished(1); len(got) != 2 || got[0] != 0 || got[1] != 2 {
		t.Errorf("Unfinished = %v, want [0 2]", got)
	}
	if got := (&RelayResult{}).Unfinished(3); len(got) != 3 {
		t.Errorf("with nothing seen, n choices: %v", got)
	}
	if got := (&RelayResult{}).Unfinished(1000); len(got) != maxTrackedChoices {
		t.Errorf("n is bounded: %d", len(got))
	}
}

func TestFinishChunkIsAValidChunk(t *testing.T) {
	b := FinishChunk("chatcmpl-\"x\"", "m\u2028", 1795979333, []int{0, 2}, true)
	payload, ok := strings.CutPrefix(string(b), "data: ")
	if !ok || !strings.HasSuffix(payload, "\n\n") {
		t.Fatalf("not one SSE frame: %q", b)
	}
	var c struct {
		ID      string
		Object  string
		Created int64
		Model   string
		Choices []struct {
			Index        int
			Delta        map[string]any
			FinishReason string `json:"finish_reason"`
		}
	}
	if err := json.Unmarshal([]byte(payload), &c); err != nil {
		t.Fatal(err)
	}
	if c.ID != `chatcmpl-"x"` || c.Object != "chat.completion.chunk" || c.Created != 1795979333 || c.Model != "m\u2028" ||
		len(c.Choices) != 2 || c.Choices[1].Index != 2 || c.Choices[0].FinishReason != "stop" || c.Choices[0].Delta["role"] != "assistant" {
		t.Errorf("chunk = %+v", c)
	}
}

func TestEstimatePromptTokens(t *testing.T) {
	text := strings.Repeat("word ", 400) // 2,000 characters ≈ 500 tokens
	body := `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"` + text +
		`"},{"type":"image_url","image_url":{"url":"data:image/png;base64,` + strings.Repeat("A", 100000) + `"}}]}]}`
	got := EstimatePromptTokens([]byte(body))
	if got < 500+765 || got > 500+765+40 {
		t.Errorf("estimate %d, want about %d (text, one image, framing); base64 must not count as text", got, 500+765)
	}
	if EstimatePromptTokens([]byte(`{"messages":"nope"}`)) <= 0 || EstimatePromptTokens(nil) <= 0 {
		t.Error("a malformed body still gets a small positive estimate")
	}
}
