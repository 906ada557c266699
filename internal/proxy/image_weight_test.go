package proxy

import (
	"strings"
	"testing"
)

// An image counts as ImageTokens in the prompt's estimate, whatever its
// bytes: a large photo must not look like millions of tokens to a budget
// or a rate limit; text-only requests are counted as before.
func TestImagesWeighTheirTokensNotTheirBytes(t *testing.T) {
	data := strings.Repeat("A", 1<<20)
	chat := `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"what is this?"},` +
		`{"type":"image_url","image_url":{"url":"data:image/png;base64,` + data + `"}},` +
		`{"type":"image_url","image_url":{"url":"data:image/png;base64,` + data + `"}}]}]}`
	r, err := ParseFor(APIChat, []byte(chat))
	if err != nil {
		t.Fatal(err)
	}
	if r.Images != 2 || r.ImageBytes < 2<<20 || r.PromptBytes/4 < 2*ImageTokens || r.PromptBytes/4 > 2*ImageTokens+100 {
		t.Fatalf("images %d (%d bytes), prompt bytes %d", r.Images, r.ImageBytes, r.PromptBytes)
	}
	responses := `{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,` + data + `"}]}]}`
	if r, err = ParseFor(APIResponses, []byte(responses)); err != nil || r.Images != 1 || r.PromptBytes/4 > ImageTokens+100 {
		t.Fatalf("responses: %+v %v", r, err)
	}
	text := `{"model":"m","messages":[{"role":"user","content":"an image_url is mentioned, none sent"}]}`
	if r, err = ParseFor(APIChat, []byte(text)); err != nil || r.Images != 0 || r.PromptBytes != len(`[{"role":"user","content":"an image_url is mentioned, none sent"}]`) {
		t.Fatalf("text only: %+v %v", r, err)
	}
}
