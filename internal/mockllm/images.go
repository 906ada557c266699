package mockllm

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/tidwall/gjson"
)

// DescribePrefix starts a last user message whose answer describes the
// images that message carries, one line each — its type, its size and the
// SHA-256 of its bytes as the engine decoded them from the data URL — so
// that a test in a browser can prove an image reached the engine byte for
// byte. A part that is not a base64 data URL is said so.
const DescribePrefix = "/describe"

// describeImages answers DescribePrefix for the last user message of msgs.
func describeImages(msgs gjson.Result) string {
	var last gjson.Result
	msgs.ForEach(func(_, m gjson.Result) bool {
		if m.Get("role").Str == "user" {
			last = m
		}
		return true
	})
	var lines []string
	last.Get("content").ForEach(func(_, part gjson.Result) bool {
		if part.Get("type").Str != "image_url" {
			return true
		}
		n := len(lines) + 1
		mime, data, ok := strings.Cut(strings.TrimPrefix(part.Get("image_url.url").Str, "data:"), ";base64,")
		raw, err := base64.StdEncoding.DecodeString(data)
		if !ok || err != nil {
			lines = append(lines, fmt.Sprintf("image %d: not a base64 data URL", n))
			return true
		}
		sum := sha256.Sum256(raw)
		lines = append(lines, fmt.Sprintf("image %d: %s, %d bytes, sha256 %s", n, mime, len(raw), hex.EncodeToString(sum[:])))
		return true
	})
	if len(lines) == 0 {
		return "I see no image."
	}
	return strings.Join(lines, "\n")
}
