package proxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
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
	if got := res.Unfinished(1); !slices.Equal(got, []OpenChoice{{Index: 0}, {Index: 2}}) {
		t.Errorf("Unfinished = %v, want [0 2]", got)
	}
	// n asks for choices the engine never started: they are open too.
	if got := res.Unfinished(4); !slices.Equal(got, []OpenChoice{{Index: 0}, {Index: 2}, {Index: 3, Fresh: true}}) {
		t.Errorf("Unfinished(4) = %v, want [0 2 3 (fresh)]", got)
	}
	if got := (&RelayResult{}).Unfinished(3); !slices.Equal(got, []OpenChoice{{0, true}, {1, true}, {2, true}}) {
		t.Errorf("with nothing seen, n fresh choices: %v", got)
	}
	if got := (&RelayResult{}).Unfinished(1000); len(got) != maxTrackedChoices {
		t.Errorf("n is bounded: %d", len(got))
	}
	if got := (&RelayResult{}).Unfinished(0); !slices.Equal(got, nil) {
		t.Errorf("n of 0 (the caller's default is 1): %v", got)
	}
}

// A stopped stream with n > 1 closes every choice the client has not seen
// finish — those whose chunks it had, and those of the n the engine had
// not started (an engine that opens choices lazily, or a stop between
// vLLM's opening chunks) — and a frame cut off by the stop counts for
// nothing: it never reached the client.
func TestStoppedStreamClosesEveryChoice(t *testing.T) {
	chunk := func(index int, delta, finish string) string {
		return `data: {"id":"chatcmpl-e","object":"chat.completion.chunk","created":7,"model":"up","choices":[{"index":` +
			strconv.Itoa(index) + `,"delta":` + delta + `,"logprobs":null,"finish_reason":` + finish + `}]}` + "\n\n"
	}
	frames := []string{
		chunk(0, `{"role":"assistant","content":""}`, "null"),
		chunk(0, `{"content":"a"}`, "null"),
		chunk(2, `{"role":"assistant","content":""}`, "null"),
		chunk(2, `{"content":"b"}`, `"length"`),
		// The stop lands here: this frame opens choice 1 and finishes 0,
		// but the client never gets it.
		chunk(1, `{"role":"assistant","content":"c"}`, "null") + chunk(0, `{}`, `"stop"`),
	}
	for _, c := range []struct {
		name      string
		stopAfter int
		want      []OpenChoice
	}{
		{"after two choices opened", 4, []OpenChoice{{Index: 0}, {Index: 1, Fresh: true}}},
		{"before anything", 0, []OpenChoice{{0, true}, {1, true}, {2, true}}},
		{"between the first two", 1, []OpenChoice{{Index: 0}, {Index: 1, Fresh: true}, {Index: 2, Fresh: true}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			relayed := 0
			s := NewStream(bufio.NewReader(strings.NewReader(strings.Join(frames, ""))), RelayOptions{
				Stopped: func() bool { return relayed >= c.stopAfter },
			})
			var closing []byte
			s.End = func(res *RelayResult) []byte {
				closing = FinishChunk(res.ID, res.Model, res.Created, res.Unfinished(3))
				return closing
			}
			var out []byte
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 && !bytes.Equal(buf[:n], closing) {
					relayed++
				}
				out = append(out, buf[:n]...)
				if err != nil {
					break
				}
			}
			res := s.Result()
			if got := res.Unfinished(3); !res.Stopped || !slices.Equal(got, c.want) {
				t.Fatalf("stopped %v, Unfinished(3) = %v, want %v", res.Stopped, got, c.want)
			}
			// Every choice 0..2 ends with a finish_reason, once, in the
			// stream's own id; each opened with its role.
			finished, roles := map[int]int{}, map[int]int{}
			for _, frame := range strings.Split(strings.TrimSuffix(string(out), "\n\n"), "\n\n") {
				var ch struct {
					ID, Model string
					Created   int64
					Choices   []struct {
						Index        int
						Delta        map[string]any
						FinishReason *string `json:"finish_reason"`
					}
				}
				if err := json.Unmarshal([]byte(strings.TrimPrefix(frame, "data: ")), &ch); err != nil {
					t.Fatalf("frame %q: %v", frame, err)
				}
				if ch.ID != "chatcmpl-e" || ch.Model != "up" || ch.Created != 7 {
					t.Errorf("frame %q: not the stream's own id, model and created", frame)
				}
				for _, x := range ch.Choices {
					if x.FinishReason != nil {
						finished[x.Index]++
					}
					if x.Delta["role"] == "assistant" {
						roles[x.Index]++
					}
				}
			}
			for i := range 3 {
				if finished[i] != 1 || roles[i] != 1 {
					t.Errorf("choice %d: %d finish_reasons, %d roles; want one each\n%s", i, finished[i], roles[i], out)
				}
			}
		})
	}
}

func TestFinishChunkIsAValidChunk(t *testing.T) {
	// The engine chose the id and model: a line break in them must not
	// end the SSE line, nor other bytes break the JSON.
	const model = "m\u2028<b>&\n\r\x00\xff"
	b := FinishChunk("chatcmpl-\"x\"", model, 1795979333, []OpenChoice{{Index: 0, Fresh: true}, {Index: 2}})
	payload, ok := strings.CutPrefix(string(b), "data: ")
	if !ok || !strings.HasSuffix(payload, "\n\n") || strings.Count(payload, "\n") != 2 || strings.Contains(payload, "\r") {
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
	if c.ID != `chatcmpl-"x"` || c.Object != "chat.completion.chunk" || c.Created != 1795979333 || c.Model != strings.ToValidUTF8(model, "\uFFFD") ||
		len(c.Choices) != 2 || c.Choices[1].Index != 2 || c.Choices[0].FinishReason != "stop" || c.Choices[0].Delta["role"] != "assistant" ||
		c.Choices[1].Delta["role"] != nil || c.Choices[1].FinishReason != "stop" {
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
	// A content part's members are below what the guard refuses repeats
	// of; the engines read the last of repeated keys, so the estimate must
	// count at least that one, whatever comes first.
	plain := EstimatePromptTokens([]byte(`{"messages":[{"role":"user","content":[{"type":"text","text":"` + text + `"}]}]}`))
	for name, part := range map[string]string{
		"text repeated":  `{"type":"text","text":"","text":"` + text + `"}`,
		"type repeated":  `{"type":"image_url","type":"text","text":"` + text + `"}`,
		"type after all": `{"text":"` + text + `","type":"input_audio","type":"text"}`,
	} {
		if got := EstimatePromptTokens([]byte(`{"messages":[{"role":"user","content":[` + part + `]}]}`)); got < plain {
			t.Errorf("%s: estimate %d, below the %d of the text an engine reads", name, got, plain)
		}
	}
}
