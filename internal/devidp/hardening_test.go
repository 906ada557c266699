package devidp

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"

	"github.com/zitadel/oidc/v3/pkg/client/rp"
	"github.com/zitadel/oidc/v3/pkg/oidc"
)

// TestRedirectURIMustMatchExactly checks that the public client gets no
// RFC 8252 leeway: a redirect_uri on another loopback port, or on localhost
// for 127.0.0.1, is refused, so no other local program can receive a code.
func TestRedirectURIMustMatchExactly(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	u, _ := url.Parse(e.callback)
	port, _ := strconv.Atoi(u.Port())
	other := *u
	other.Host = u.Hostname() + ":" + strconv.Itoa(port+1)
	localhost := *u
	localhost.Host = "localhost:" + u.Port()
	for _, uri := range []string{other.String(), localhost.String(), e.callback + "/x", e.callback + "?x=1"} {
		for _, client := range []string{publicID, confID} {
			q := url.Values{"client_id": {client}, "redirect_uri": {uri}, "response_type": {"code"}, "scope": {"openid"},
				"state": {"s"}, "code_challenge": {oidc.NewSHACodeChallenge(GeneratePassword() + GeneratePassword())},
				"code_challenge_method": {"S256"}}
			resp, body := get(t, browser(t), e.issuer+"/authorize?"+q.Encode())
			if resp.StatusCode != http.StatusBadRequest || resp.Request.URL.Path == "/idp/login" {
				t.Errorf("%s with redirect_uri %s: %d at %s, want 400:\n%.300s", client, uri, resp.StatusCode, resp.Request.URL, body)
			}
		}
	}
	// The registered URI itself still works.
	party := e.relyingParty(t, publicID, "")
	e.openLogin(t, browser(t), rp.AuthURL("s", party, rp.WithCodeChallenge(oidc.NewSHACodeChallenge(GeneratePassword()+GeneratePassword()))))

	// The same holds for post_logout_redirect_uri.
	out := *u
	out.Host = u.Hostname() + ":" + strconv.Itoa(port+1)
	out.Path = "/bye"
	noFollow := browser(t)
	noFollow.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	q := url.Values{"client_id": {publicID}, "post_logout_redirect_uri": {out.String()}}
	resp, _ := get(t, noFollow, party.GetEndSessionEndpoint()+"?"+q.Encode())
	if loc := resp.Header.Get("Location"); strings.HasPrefix(loc, out.String()) {
		t.Errorf("end_session redirected to another port: %s", loc)
	}
}

// TestLoopbackOnly checks the guard in front of the provider: only a
// loopback peer without forwarding headers gets through.
func TestLoopbackOnly(t *testing.T) {
	t.Parallel()
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "provider") })
	h := LoopbackOnly(ok, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, tc := range []struct {
		remote string
		header string
		want   int
	}{
		{"127.0.0.1:4711", "", http.StatusOK},
		{"127.0.0.2:4711", "", http.StatusOK},
		{"[::1]:4711", "", http.StatusOK},
		{"[::ffff:127.0.0.1]:4711", "", http.StatusOK},
		{"203.0.113.5:4711", "", http.StatusForbidden},
		{"10.0.0.1:4711", "", http.StatusForbidden},
		{"[2001:db8::1]:4711", "", http.StatusForbidden},
		{"garbage", "", http.StatusForbidden},
		{"127.0.0.1:4711", "X-Forwarded-For", http.StatusForbidden},
		{"127.0.0.1:4711", "X-Forwarded-Host", http.StatusForbidden},
		{"127.0.0.1:4711", "X-Forwarded-Proto", http.StatusForbidden},
		{"127.0.0.1:4711", "Forwarded", http.StatusForbidden},
		{"127.0.0.1:4711", "X-Real-IP", http.StatusForbidden},
		{"127.0.0.1:4711", "Via", http.StatusForbidden},
	} {
		r := httptest.NewRequest(http.MethodGet, "/idp/.well-known/openid-configuration", nil)
		r.RemoteAddr = tc.remote
		if tc.header != "" {
			r.Header.Set(tc.header, "127.0.0.1")
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("peer %s, header %q: %d, want %d", tc.remote, tc.header, w.Code, tc.want)
		}
	}
}
