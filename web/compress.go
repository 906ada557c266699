package web

import (
	"strings"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"

	"moonji/internal/assets"
)

// minCompressBody is the size under which a response goes as it is: a
// small answer saves a few bytes and costs a compressor.
const minCompressBody = 1 << 10

// Levels for answers compressed as they go: fast ones, since a page is
// compressed at every request (static files are compressed once, harder).
const (
	pageBrotliLevel = fasthttp.CompressBrotliDefaultCompression // 4
	pageGzipLevel   = fasthttp.CompressDefaultCompression       // 6
)

// noCompression marks (in Locals) a response that is compressed already
// (a static file) or must go as it is.
const noCompression = "moonji.no_compression"

// compressResponses compresses pages and JSON answers for browsers that
// accept br or gzip. It is our own rather than Fiber's compress middleware,
// which decides before the handler runs and would compress an event
// stream: here the decision is made on the finished response. Left as they
// are:
//   - everything under /v1: the gateway relays an engine's bodies and
//     frames byte for byte, and OpenAI clients count on that;
//   - streamed bodies (SetBodyStreamWriter), event streams among them: a
//     compressor holds bytes back until a block fills, so a chat's events
//     would arrive late and in bursts;
//   - bodies under minCompressBody, types that do not shrink (images),
//     and responses already encoded.
func compressResponses(c *fiber.Ctx) error {
	if underV1(c.Path()) {
		return c.Next()
	}
	if err := c.Next(); err != nil {
		return err
	}
	compressBody(c)
	return nil
}

func compressBody(c *fiber.Ctx) {
	resp := c.Response()
	// The matched route too, should a path reach a /v1 route spelled
	// otherwise than underV1 expects.
	if underV1(c.Route().Path) || c.Locals(noCompression) != nil || resp.IsBodyStream() ||
		len(resp.Header.ContentEncoding()) > 0 || !assets.Compressible(string(resp.Header.ContentType())) {
		return
	}
	switch resp.StatusCode() {
	case fiber.StatusNoContent, fiber.StatusNotModified, fiber.StatusPartialContent:
		return
	}
	body := resp.Body()
	if len(body) < minCompressBody {
		return
	}
	// The answer depends on Accept-Encoding from here on, compressed or not.
	c.Vary(fiber.HeaderAcceptEncoding)
	var out []byte
	encoding := assets.Negotiate(c.Get(fiber.HeaderAcceptEncoding))
	switch encoding {
	case "br":
		out = fasthttp.AppendBrotliBytesLevel(nil, body, pageBrotliLevel)
	case "gzip":
		out = fasthttp.AppendGzipBytesLevel(nil, body, pageGzipLevel)
	default:
		return
	}
	if len(out) >= len(body) {
		return
	}
	resp.SetBodyRaw(out)
	resp.Header.Set(fiber.HeaderContentEncoding, encoding)
}

// underV1 says whether path is in the OpenAI-compatible API.
func underV1(path string) bool {
	return len(path) >= 3 && strings.EqualFold(path[:3], "/v1") && (len(path) == 3 || path[3] == '/')
}
