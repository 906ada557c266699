package web

import (
	"context"
	"net/http"
	"net/url"
	"strings"
)

// detach returns r with its own copies of every string fasthttp lent it.
//
// Fiber's adaptor (fasthttpadaptor) builds the net/http request with unsafe
// byte-to-string conversions over fasthttp's buffers, which are reused for
// the next request. A handler that keeps any of those strings past the
// request (the development provider stores client_id, redirect_uri and
// state from the authorize URL in its auth requests) finds them overwritten
// later: sign-in failed with a client id like "d=P6GL". Copying costs little
// on these few, rare requests.
//
// The context is detached too: the adaptor's is fasthttp's RequestCtx, whose
// Done races with the server's Shutdown (seen with -race when a database
// query watched it), and it never signals a disconnect anyway.
func detach(r *http.Request) *http.Request {
	c := r.Clone(context.WithoutCancel(r.Context()))
	c.Method = strings.Clone(r.Method)
	c.Proto = strings.Clone(r.Proto)
	c.Host = strings.Clone(r.Host)
	c.RemoteAddr = strings.Clone(r.RemoteAddr)
	c.RequestURI = strings.Clone(r.RequestURI)
	if u, err := url.ParseRequestURI(c.RequestURI); err == nil {
		c.URL = u
	} else {
		u := *r.URL
		u.Path, u.RawPath, u.RawQuery = strings.Clone(u.Path), strings.Clone(u.RawPath), strings.Clone(u.RawQuery)
		c.URL = &u
	}
	h := make(http.Header, len(r.Header))
	for k, vs := range r.Header {
		cp := make([]string, len(vs))
		for i, v := range vs {
			cp[i] = strings.Clone(v)
		}
		h[strings.Clone(k)] = cp
	}
	c.Header = h
	return c
}
