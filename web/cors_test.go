package web_test

import (
	"net/http"
	"strings"
	"testing"

	"moonji/internal/config"
)

// TestCORS: a browser app on a configured origin may call /v1 with a key —
// its preflight is answered, its answers readable — and nothing else is
// granted: not other origins, not cookies, not /api or the pages.
func TestCORS(t *testing.T) {
	const app = "https://app.example.com"
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", func(c *config.Config) {
		c.CORS.AllowedOrigins = []string{app, "http://localhost:5173"}
	})
	// What the openai npm SDK asks for before a chat completion.
	sdkHeaders := "authorization,content-type,x-stainless-arch,x-stainless-lang,x-stainless-os,x-stainless-package-version," +
		"x-stainless-retry-count,x-stainless-runtime,x-stainless-runtime-version,x-stainless-timeout,openai-organization,openai-project"
	cases := []struct {
		name, method, path, origin string
		hdr                        map[string]string
		body                       string
		status                     int
		granted                    bool
		allowHeaders               string // for a granted preflight
	}{
		{name: "preflight from the app", method: http.MethodOptions, path: "/v1/chat/completions", origin: app,
			hdr:    map[string]string{"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": sdkHeaders},
			status: 204, granted: true, allowHeaders: sdkHeaders},
		{name: "preflight without headers", method: http.MethodOptions, path: "/v1/models", origin: "http://localhost:5173",
			hdr: map[string]string{"Access-Control-Request-Method": "GET"}, status: 204, granted: true, allowHeaders: "Authorization, Content-Type"},
		{name: "preflight asking for odd header names", method: http.MethodOptions, path: "/v1/chat/completions", origin: app,
			hdr:    map[string]string{"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, x(y)"},
			status: 204, granted: true, allowHeaders: "Authorization, Content-Type"},
		{name: "preflight from another origin", method: http.MethodOptions, path: "/v1/chat/completions", origin: "https://evil.example",
			hdr: map[string]string{"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}, status: 204},
		{name: "preflight from a look-alike origin", method: http.MethodOptions, path: "/v1/chat/completions", origin: app + ".evil.example",
			hdr: map[string]string{"Access-Control-Request-Method": "POST"}, status: 204},
		{name: "preflight from the app over http", method: http.MethodOptions, path: "/v1/chat/completions", origin: "http://app.example.com",
			hdr: map[string]string{"Access-Control-Request-Method": "POST"}, status: 204},
		{name: "preflight from a null origin", method: http.MethodOptions, path: "/v1/chat/completions", origin: "null",
			hdr: map[string]string{"Access-Control-Request-Method": "POST"}, status: 204},
		{name: "chat from the app", method: http.MethodPost, path: "/v1/chat/completions", origin: app,
			hdr: map[string]string{"Authorization": "Bearer " + e.Key, "Content-Type": "application/json"}, body: chatBody, status: 200, granted: true},
		{name: "stream from the app", method: http.MethodPost, path: "/v1/chat/completions", origin: app,
			hdr:  map[string]string{"Authorization": "Bearer " + e.Key, "Content-Type": "application/json"},
			body: `{"model":"m1","stream":true,"max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`, status: 200, granted: true},
		{name: "refusal to the app", method: http.MethodPost, path: "/v1/chat/completions", origin: app,
			hdr: map[string]string{"Content-Type": "application/json"}, body: chatBody, status: 401, granted: true},
		{name: "wrong method from the app", method: http.MethodDelete, path: "/v1/models", origin: app, status: 405, granted: true},
		{name: "models from the app", method: http.MethodGet, path: "/v1/models", origin: app,
			hdr: map[string]string{"Authorization": "Bearer " + e.Key}, status: 200, granted: true},
		{name: "chat from another origin", method: http.MethodPost, path: "/v1/chat/completions", origin: "https://evil.example",
			hdr: map[string]string{"Authorization": "Bearer " + e.Key, "Content-Type": "application/json"}, body: chatBody, status: 200},
		{name: "chat without an origin", method: http.MethodPost, path: "/v1/chat/completions",
			hdr: map[string]string{"Authorization": "Bearer " + e.Key, "Content-Type": "application/json"}, body: chatBody, status: 200},
		{name: "/api stays same-origin", method: http.MethodGet, path: "/api/me", origin: app, status: 401},
		{name: "/api preflight", method: http.MethodOptions, path: "/api/v1/inference/stop", origin: app,
			hdr: map[string]string{"Access-Control-Request-Method": "POST"}, status: 401},
		{name: "pages stay same-origin", method: http.MethodGet, path: "/", origin: app, status: 200},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, _ := http.NewRequest(c.method, e.URL+c.path, strings.NewReader(c.body))
			if c.origin != "" {
				req.Header.Set("Origin", c.origin)
			}
			for k, v := range c.hdr {
				req.Header.Set(k, v)
			}
			resp, err := noRedirects(http.DefaultClient).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body := readAll(t, resp.Body)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, tail(body))
			}
			h := resp.Header
			if h.Get("Access-Control-Allow-Credentials") != "" {
				t.Errorf("Access-Control-Allow-Credentials: %q", h.Get("Access-Control-Allow-Credentials"))
			}
			acao := h.Get("Access-Control-Allow-Origin")
			if !c.granted {
				for k := range h {
					if strings.HasPrefix(strings.ToLower(k), "access-control-") {
						t.Errorf("%s: %q granted to %q", k, h.Get(k), c.origin)
					}
				}
				return
			}
			if acao != c.origin {
				t.Errorf("Access-Control-Allow-Origin %q, want %q", acao, c.origin)
			}
			if !strings.Contains(strings.Join(h.Values("Vary"), ","), "Origin") {
				t.Errorf("Vary %q lacks Origin", h.Values("Vary"))
			}
			if c.method == http.MethodOptions {
				if m := h.Get("Access-Control-Allow-Methods"); !strings.Contains(m, "POST") || !strings.Contains(m, "GET") {
					t.Errorf("Access-Control-Allow-Methods %q", m)
				}
				if got := h.Get("Access-Control-Allow-Headers"); got != c.allowHeaders {
					t.Errorf("Access-Control-Allow-Headers %q, want %q", got, c.allowHeaders)
				}
				if h.Get("Access-Control-Max-Age") == "" {
					t.Error("no Access-Control-Max-Age")
				}
				return
			}
			exposed := strings.ToLower(h.Get("Access-Control-Expose-Headers"))
			for _, want := range []string{"x-inference-id", "x-request-id", "retry-after", "x-ratelimit-remaining-requests", "x-ratelimit-reset-tokens"} {
				if !strings.Contains(exposed, want) {
					t.Errorf("Access-Control-Expose-Headers %q lacks %s", exposed, want)
				}
			}
		})
	}
}

// TestNoCORSByDefault: without allowed origins, no origin is granted
// anything, and a preflight is refused like any unknown method.
func TestNoCORSByDefault(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db")
	req, _ := http.NewRequest(http.MethodOptions, e.URL+"/v1/chat/completions", nil)
	req.Header.Set("Origin", "https://app.example.com")
	req.Header.Set("Access-Control-Request-Method", "POST")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp.Body)
	if resp.StatusCode/100 == 2 || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("preflight without configured origins: %d %v", resp.StatusCode, resp.Header)
	}
}
