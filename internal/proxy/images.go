package proxy

import (
	"bytes"
	"strconv"

	"github.com/tidwall/gjson"
)

// ImagePart finds the first image content part of a request body that
// ParseFor accepted, for a model that cannot see images: in a chat
// request, a part of a message's content array with type image_url or an
// image_url member; in a Responses request, a part of an input item's
// content with type input_image or an image_url member. It returns the
// part's path as OpenAI's param names it ("messages[2].content[1]"), or ""
// when there is none.
//
// Every member of a part is looked at, not gjson's first: the guard's flat
// pass does not reach inside content parts, and an engine reads the last of
// repeated keys — {"type":"text","type":"image_url",…} is an image to it.
// Keys and values are compared decoded, so an escaped "image\u005furl" is
// one too. Only messages whose content is an array are walked: a text-only
// request costs one pass over its messages.
func ImagePart(api API, body []byte) string {
	switch api {
	case APIChat:
		return imageIn(gjson.GetBytes(body, "messages"), "messages", "content", "image_url")
	case APIResponses:
		return imageIn(gjson.GetBytes(body, "input"), "input", "content", "input_image")
	}
	return ""
}

func imageIn(items gjson.Result, name, field, imageType string) string {
	if !items.IsArray() {
		return ""
	}
	found := ""
	i := 0
	items.ForEach(func(_, item gjson.Result) bool {
		if item.IsObject() {
			item.ForEach(func(k, content gjson.Result) bool {
				if k.Str != field || !content.IsArray() {
					return true
				}
				j := 0
				content.ForEach(func(_, part gjson.Result) bool {
					if isImage(part, imageType) {
						found = name + "[" + strconv.Itoa(i) + "]." + field + "[" + strconv.Itoa(j) + "]"
						return false
					}
					j++
					return true
				})
				return found == ""
			})
		}
		i++
		return found == ""
	})
	return found
}

func isImage(part gjson.Result, imageType string) bool {
	if !part.IsObject() {
		return false
	}
	image := false
	part.ForEach(func(k, v gjson.Result) bool {
		switch {
		case k.Str == "image_url":
			image = true
		case k.Str == "type" && v.Type == gjson.String && (v.Str == imageType || v.Str == "image_url"):
			image = true
		}
		return !image
	})
	return image
}

// ImageTokens is what one image of a request counts for in the gateway's
// estimates (the tokens a rate limit reserves, the most a budget holds
// back) instead of its bytes: engines bill an image by its pixels, not its
// base64, and a 10 MB photo counted as 13 million tokens would be refused
// by any budget. 16,384 is about the most a vision model makes of one
// image by default (Qwen2.5-VL's pixel bound; GPT-4o and Claude use less).
const ImageTokens = 16384

// ImageWeight returns how many image parts a request body to api has (as
// ImagePart finds them) and the bytes they take. A body without the word
// "image" costs one scan.
func ImageWeight(api API, body []byte) (images, size int) {
	if !bytes.Contains(body, []byte("image")) {
		return 0, 0
	}
	var items gjson.Result
	field, imageType := "content", "image_url"
	switch api {
	case APIChat:
		items = gjson.GetBytes(body, "messages")
	case APIResponses:
		items, imageType = gjson.GetBytes(body, "input"), "input_image"
	default:
		return 0, 0
	}
	if !items.IsArray() {
		return 0, 0
	}
	items.ForEach(func(_, item gjson.Result) bool {
		if !item.IsObject() {
			return true
		}
		item.ForEach(func(k, content gjson.Result) bool {
			if k.Str == field && content.IsArray() {
				content.ForEach(func(_, part gjson.Result) bool {
					if isImage(part, imageType) {
						images++
						size += len(part.Raw)
					}
					return true
				})
			}
			return true
		})
		return true
	})
	return images, size
}

// weighImages makes r's prompt size count each image as ImageTokens
// rather than its bytes (see ImageTokens).
func (r *Request) weighImages(body []byte) {
	n, size := ImageWeight(r.API, body)
	if n == 0 {
		return
	}
	r.ImageBytes, r.Images = size, n
	// PromptBytes is read as about four bytes a token.
	r.PromptBytes = max(0, r.PromptBytes-size) + 4*n*ImageTokens
}
