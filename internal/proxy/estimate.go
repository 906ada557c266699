package proxy

import (
	"unicode/utf8"

	"github.com/tidwall/gjson"
)

// Token estimates for a prompt the engine never counted (a request cut
// short before its usage came). They follow OpenAI's published rules of
// thumb: about four characters of English per token, a few tokens of
// framing per message, and a fixed cost per image.
const (
	charsPerToken     = 4
	tokensPerMessage  = 4
	tokensPerImage    = 765 // a high-detail 1024×1024 image in OpenAI's accounting
	tokensReplyPrimer = 3
)

// EstimatePromptTokens estimates the prompt tokens of a chat request body:
// the text of every message (string content or text parts), tool call
// arguments and tool definitions, plus the framing per message and a fixed
// cost per image. Base64 image data is not counted as text.
func EstimatePromptTokens(body []byte) int {
	chars, tokens := 0, tokensReplyPrimer
	gjson.GetBytes(body, "messages").ForEach(func(_, m gjson.Result) bool {
		tokens += tokensPerMessage
		m.ForEach(func(k, v gjson.Result) bool {
			switch k.Str {
			case "content":
				if v.Type == gjson.String {
					chars += utf8.RuneCountInString(v.Str)
					return true
				}
				v.ForEach(func(_, part gjson.Result) bool {
					c, t := estimatePart(part)
					chars, tokens = chars+c, tokens+t
					return true
				})
			case "tool_calls", "function_call":
				chars += len(v.Raw)
			default:
				if v.Type == gjson.String {
					chars += utf8.RuneCountInString(v.Str) // role, name, tool_call_id
				}
			}
			return true
		})
		return true
	})
	if tools := gjson.GetBytes(body, "tools"); tools.Exists() {
		chars += len(tools.Raw)
	}
	return tokens + (chars+charsPerToken-1)/charsPerToken
}

// estimatePart estimates one content part: its text, a fixed cost for an
// image, a rough share of anything else (audio, files). Its members are read
// in one pass with every repeat counted, not with Get (the first of repeated
// keys): the request guard refuses repeats only down to a message's own
// members, and an engine reads the last of repeated keys, so a first-wins
// read could be steered to count less than the engine reads.
func estimatePart(part gjson.Result) (chars, tokens int) {
	hasText, image := false, false
	part.ForEach(func(k, v gjson.Result) bool {
		switch k.Str {
		case "type":
			switch v.Str {
			case "text":
				hasText = true
			case "image_url", "input_image", "image":
				image = true
			}
		case "text":
			if v.Type == gjson.String {
				chars += utf8.RuneCountInString(v.Str)
				hasText = true
			}
		}
		return true
	})
	if image {
		tokens += tokensPerImage
	}
	if !hasText && !image {
		chars += len(part.Raw) / 2
	}
	return chars, tokens
}
