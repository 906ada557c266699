package devidp

import (
	"log/slog"
	"net"
	"net/http"
	"net/netip"
)

// forwardingHeaders are set by reverse proxies (some always, some when told
// to). A request that carries one came through a proxy, whatever its peer.
var forwardingHeaders = []string{"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "Forwarded",
	"X-Real-Ip", "Via"}

// LoopbackOnly guards a development provider: it answers 403 to every
// request whose TCP peer is not a loopback address, or which carries a
// forwarding header. The provider signs in anyone who knows a password that
// a newcomer's first start printed or wrote to disk, so it must not be
// reachable from other machines — directly (a non-loopback listen address)
// or through a reverse proxy on this one, whose connections do come from
// 127.0.0.1 but which adds one of these headers on the way.
//
// A proxy that adds none of them cannot be told apart here; Moonji's
// configuration also refuses the development provider with a public_url that
// is not loopback, which a proxy in front would need.
func LoopbackOnly(next http.Handler, log *slog.Logger) http.Handler {
	if log == nil {
		log = slog.Default()
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reason := ""
		if !loopbackPeer(r.RemoteAddr) {
			reason = "peer is not a loopback address"
		} else {
			for _, h := range forwardingHeaders {
				if _, ok := r.Header[http.CanonicalHeaderKey(h)]; ok {
					reason = "forwarded by a proxy (" + h + ")"
					break
				}
			}
		}
		if reason != "" {
			log.WarnContext(r.Context(), "development sign-in provider refused a request", "reason", reason,
				"remote", r.RemoteAddr, "path", r.URL.Path,
				"hint", "configure an oidc section, or set dev_idp.allow_non_loopback: true if you really mean it")
			http.Error(w, "The development sign-in provider answers only local requests.", http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// loopbackPeer reports whether a RemoteAddr ("127.0.0.1:4711", "[::1]:4711")
// is a loopback address.
func loopbackPeer(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}
