package handlers

import (
	"net/http"

	"github.com/gofiber/fiber/v2"
	"github.com/valyala/fasthttp"
)

// setCookie writes a cookie built by internal/auth (which keeps net/http's
// type so as not to depend on Fiber). MaxAge < 0 deletes the cookie, which
// fasthttp expresses as an expiry in the past.
func setCookie(c *fiber.Ctx, hc *http.Cookie) {
	fc := &fiber.Cookie{Name: hc.Name, Value: hc.Value, Path: hc.Path, MaxAge: hc.MaxAge,
		Secure: hc.Secure, HTTPOnly: hc.HttpOnly, SameSite: fiber.CookieSameSiteLaxMode}
	if hc.MaxAge < 0 {
		fc.MaxAge = 0
		fc.Expires = fasthttp.CookieExpireDelete
	}
	c.Cookie(fc)
}
