package attachment

import (
	"encoding/base64"
	"strings"
)

// Part is one content part of a user message in OpenAI's chat API: text, or
// an image by URL (here always a data URL).
type Part struct {
	Type     string    `json:"type"`
	Text     string    `json:"text,omitempty"`
	ImageURL *ImageURL `json:"image_url,omitempty"`
}

// ImageURL is an image part's image.
type ImageURL struct {
	URL string `json:"url"`
}

// Attached is an attachment as a message's content needs it.
type Attached struct {
	Kind, Name, MIME string
	Data             []byte
}

// ImageTokens is what an image is counted as in a context's estimate:
// engines tile images into a few hundred to a few thousand tokens, and its
// base64 says nothing of that.
const ImageTokens = 1000

// Tokens estimates what a's part costs in the prompt: a text file four
// bytes a token (as the chat counts text), an image ImageTokens.
func (a Attached) Tokens() int { return TokensOf(a.Kind, int64(len(a.Data))) }

// TokensOf is Tokens for an attachment of kind and size n.
func TokensOf(kind string, n int64) int {
	if kind == KindImage {
		return ImageTokens
	}
	return int(n/4) + 8
}

// Parts builds a user message's content from its text and attachments: the
// text first (when there is any), then each attachment in order — an image
// as an image_url part with a data URL, a text file as a text part naming
// it. For a model that cannot see images (vision false) an image is a text
// part saying it was left out, so that a conversation that had images can
// go on with another model.
func Parts(text string, files []Attached, vision bool) []Part {
	out := make([]Part, 0, len(files)+1)
	if strings.TrimSpace(text) != "" {
		out = append(out, Part{Type: "text", Text: text})
	}
	for _, f := range files {
		switch {
		case f.Kind == KindImage && vision:
			out = append(out, ImagePart(f.MIME, f.Data))
		case f.Kind == KindImage:
			out = append(out, Part{Type: "text", Text: "[Image " + quoteName(f.Name) + " left out: this model cannot see images.]"})
		default:
			out = append(out, TextPart(f.Name, f.Data))
		}
	}
	return out
}

// ImagePart is an image_url part carrying data as a data URL.
func ImagePart(mime string, data []byte) Part {
	var b strings.Builder
	b.Grow(len("data:;base64,") + len(mime) + base64.StdEncoding.EncodedLen(len(data)))
	b.WriteString("data:")
	b.WriteString(mime)
	b.WriteString(";base64,")
	b.WriteString(base64.StdEncoding.EncodeToString(data))
	return Part{Type: "image_url", ImageURL: &ImageURL{URL: b.String()}}
}

// TextPart is a text file as a text part: its name, then its content in a
// Markdown code fence longer than any run of backticks inside it, so that
// the file cannot close the fence early.
func TextPart(name string, data []byte) Part {
	fence := strings.Repeat("`", max(3, longestRun(data, '`')+1))
	text := "File " + quoteName(name) + ":\n" + fence + "\n" + string(data)
	if !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	return Part{Type: "text", Text: text + fence}
}

func quoteName(name string) string { return "\"" + name + "\"" }

// longestRun is the length of the longest run of c in data.
func longestRun(data []byte, c byte) int {
	best, n := 0, 0
	for _, b := range data {
		if b == c {
			n++
			best = max(best, n)
		} else {
			n = 0
		}
	}
	return best
}
