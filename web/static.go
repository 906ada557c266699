package web

import (
	"strings"

	"github.com/gofiber/fiber/v2"

	"moonji/internal/assets"
)

// Cache lifetimes of static files: a hashed URL never changes content, so
// browsers keep it a year without asking; a plain one (/static/app.css,
// named by pages from before the hashes) may change at any deploy.
const (
	immutableCache = "public, max-age=31536000, immutable"
	plainCache     = "public, max-age=300"
)

// serveAssets answers GET /static/* from set: the file compressed once at
// start-up in the best encoding the browser takes, with Vary so that a
// cache between keeps the encodings apart. A hash that is not the current
// one is a 404: its content is gone.
func serveAssets(set *assets.Set) fiber.Handler {
	return func(c *fiber.Ctx) error {
		a, hashed, ok := set.Lookup(strings.TrimPrefix(c.Params("*"), "/"))
		if !ok {
			return fiber.ErrNotFound
		}
		c.Vary(fiber.HeaderAcceptEncoding)
		c.Set(fiber.HeaderXContentTypeOptions, "nosniff")
		c.Set(fiber.HeaderETag, a.ETag)
		if hashed {
			c.Set(fiber.HeaderCacheControl, immutableCache)
		} else {
			c.Set(fiber.HeaderCacheControl, plainCache)
		}
		if etagMatches(c.Get(fiber.HeaderIfNoneMatch), a.ETag) {
			return c.SendStatus(fiber.StatusNotModified)
		}
		body, encoding := a.Body(c.Get(fiber.HeaderAcceptEncoding))
		c.Set(fiber.HeaderContentType, a.ContentType)
		if encoding != "" {
			c.Set(fiber.HeaderContentEncoding, encoding)
		}
		// Send keeps a reference, no copy: the set's bytes are never
		// written to.
		c.Locals(noCompression, true)
		return c.Send(body)
	}
}

// etagMatches is If-None-Match's weak comparison against etag (all
// encodings of an asset share it).
func etagMatches(header, etag string) bool {
	if header == "" {
		return false
	}
	want := strings.TrimPrefix(etag, "W/")
	for i, tag := range strings.Split(header, ",") {
		if i == 32 {
			break
		}
		tag = strings.TrimSpace(tag)
		if tag == "*" || strings.TrimPrefix(tag, "W/") == want {
			return true
		}
	}
	return false
}
