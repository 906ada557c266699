package mockllm

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"testing"
	"time"
)

// nodeSDKResult is what testdata/openai_sdk.mjs prints.
type nodeSDKResult struct {
	Create struct {
		Status, Text string
		Usage        respUsage
	}
	Stream struct {
		Status, Text, Deltas string
		Usage                respUsage
	}
	Embeddings struct {
		Base64, Float [][]float64
		Usage         struct {
			PromptTokens int `json:"prompt_tokens"`
			TotalTokens  int `json:"total_tokens"`
		}
	}
	Completions struct {
		Text, Finish string
		Usage        struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		}
	}
}

// The official openai npm SDK, as the repo pins it, accepts the mock's
// Responses (created and streamed), embeddings (in its default base64 form)
// and streamed completions. Skipped without node or node_modules (npm ci).
func TestOpenAINodeSDK(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed")
	}
	if _, err := os.Stat("../../node_modules/openai/package.json"); err != nil {
		t.Skip("no node_modules/openai: run npm ci at the repository root")
	}
	_, ts := start(t, Options{})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "testdata/openai_sdk.mjs", ts.URL+"/v1")
	cmd.Stderr = t.Output()
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\nstdout: %s", err, stdout)
	}
	var r nodeSDKResult
	if err := json.Unmarshal(stdout, &r); err != nil {
		t.Fatalf("node printed %q: %v", stdout, err)
	}

	want := CompletionText("Tell me a story", 12)
	if r.Create.Status != "incomplete" || r.Create.Text != want || r.Create.Usage != (respUsage{8, 12, 20}) {
		t.Errorf("responses.create: %+v", r.Create)
	}
	if r.Stream.Status != "incomplete" || r.Stream.Text != want || r.Stream.Deltas != want || r.Stream.Usage != (respUsage{5, 12, 17}) {
		t.Errorf("responses.stream: %+v", r.Stream)
	}

	e := r.Embeddings
	if len(e.Base64) != 2 || len(e.Float) != 2 || e.Usage.PromptTokens != 5 || e.Usage.TotalTokens != 5 {
		t.Fatalf("embeddings: %+v", e)
	}
	for i, text := range []string{"hello world", "one two three"} {
		wantVec := Embedding(text, defaultEmbeddingDims)
		if len(e.Base64[i]) != len(wantVec) || len(e.Float[i]) != len(wantVec) {
			t.Fatalf("embedding %d: %d and %d components", i, len(e.Base64[i]), len(e.Float[i]))
		}
		for j, w := range wantVec {
			if float32(e.Base64[i][j]) != w || float32(e.Float[i][j]) != w {
				t.Errorf("embedding %d[%d]: base64 %v float %v, want %v", i, j, e.Base64[i][j], e.Float[i][j], w)
			}
		}
	}

	c := r.Completions
	if c.Text != CompletionText("Tell me a story", 10) || c.Finish != "length" || c.Usage.PromptTokens != 4 || c.Usage.CompletionTokens != 10 {
		t.Errorf("completions stream: %+v", c)
	}
}
