package web_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/andybalholm/brotli"

	"moonji/internal/config"
	"moonji/internal/markdown"
	"moonji/models"
	"moonji/static"
)

// rawGet fetches path in browser c with Accept-Encoding set by hand, so
// that the transport hands the body over as it came on the wire.
func rawGet(t *testing.T, c *http.Client, url, acceptEncoding string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept-Encoding", acceptEncoding)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp, b
}

// decoded is body decoded from the response's Content-Encoding.
func decoded(t *testing.T, resp *http.Response, body []byte) []byte {
	t.Helper()
	var r io.Reader = bytes.NewReader(body)
	switch enc := resp.Header.Get("Content-Encoding"); enc {
	case "":
	case "gzip":
		zr, err := gzip.NewReader(r)
		if err != nil {
			t.Fatalf("%s: %v", resp.Request.URL.Path, err)
		}
		r = zr
	case "br":
		r = brotli.NewReader(r)
	default:
		t.Fatalf("%s: Content-Encoding %q", resp.Request.URL.Path, enc)
	}
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("%s: decode %s: %v", resp.Request.URL.Path, resp.Header.Get("Content-Encoding"), err)
	}
	return out
}

// pageAssets are the stylesheets and scripts a page loads, in order.
var pageAssets = regexp.MustCompile(`<link rel="stylesheet" href="([^"]+)"|<script src="([^"]+)"`)

func assetsOf(page string) []string {
	var out []string
	for _, m := range pageAssets.FindAllStringSubmatch(page, -1) {
		out = append(out, m[1]+m[2])
	}
	return out
}

// conversationWithAnswers is a conversation of two exchanges, answered.
func conversationWithAnswers(e *testEnv, p *chatter) string {
	e.t.Helper()
	e.mockBody(map[string]any{"tokens": 300})
	conv := p.newConversation()
	for _, q := range []string{"Tell me about **compression**, with `code`", "And brotli?"} {
		p.send(conv, q)
		p.reply(conv)
	}
	return conv
}

// Pages name every static file by a URL carrying its hash; the file is
// there with a year-long immutable cache, its own bytes in every encoding;
// another hash gets today's file and the plain URL still answers, both
// briefly cached.
func TestStaticAssetsHashed(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	p := e.chatter("hash@example.com")
	conv := p.newConversation()
	_, pageBody := rawGet(t, p.c, e.URL+"/c/"+conv, "identity")
	page := string(pageBody)
	names := map[string]string{
		"app.css": "text/css; charset=utf-8", "markdown.css": "text/css; charset=utf-8",
		"vendor/htmx.min.js": "text/javascript; charset=utf-8", "vendor/htmx-ext-sse.min.js": "text/javascript; charset=utf-8",
		"app.js": "text/javascript; charset=utf-8",
	}
	want := func(name string) []byte {
		if name == "markdown.css" {
			return []byte(markdown.CSS())
		}
		b, err := fs.ReadFile(static.FS, name)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	hashedURL := regexp.MustCompile(`^/static/[a-z0-9/._-]+\.[0-9a-f]{10}\.(css|js)$`)
	for _, u := range assetsOf(page) {
		if !hashedURL.MatchString(u) {
			t.Errorf("page names %q, not a hashed URL", u)
		}
	}
	for name, ctype := range names {
		u := static.URL(name)
		if !strings.Contains(page, `"`+u+`"`) {
			t.Errorf("the chat page does not name %s at %s", name, u)
		}
		for _, accept := range []string{"identity", "gzip", "br", "gzip, deflate, br, zstd"} {
			resp, body := rawGet(t, http.DefaultClient, e.URL+u, accept)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s (%s): %d", u, accept, resp.StatusCode)
			}
			if cc := resp.Header.Get("Cache-Control"); cc != "public, max-age=31536000, immutable" {
				t.Errorf("%s: Cache-Control %q", u, cc)
			}
			if ct := resp.Header.Get("Content-Type"); ct != ctype {
				t.Errorf("%s: Content-Type %q, want %q", u, ct, ctype)
			}
			if v := resp.Header.Get("Vary"); !strings.Contains(v, "Accept-Encoding") {
				t.Errorf("%s: Vary %q", u, v)
			}
			if got := decoded(t, resp, body); !bytes.Equal(got, want(name)) {
				t.Errorf("%s (%s, %s): %d bytes decoded, not the file's %d", u, accept, resp.Header.Get("Content-Encoding"), len(got), len(want(name)))
			}
			if enc := resp.Header.Get("Content-Encoding"); accept == "br" && enc != "br" || accept == "gzip" && enc != "gzip" ||
				accept == "identity" && enc != "" {
				t.Errorf("%s: asked %q, got Content-Encoding %q", u, accept, enc)
			}
		}
		// Pages from before the hashes name the plain URL: it still works,
		// cached for minutes only, and revalidates.
		resp, body := rawGet(t, http.DefaultClient, e.URL+"/static/"+name, "identity")
		if resp.StatusCode != http.StatusOK || !bytes.Equal(body, want(name)) || resp.Header.Get("Cache-Control") != "public, max-age=300" {
			t.Errorf("/static/%s: %d, Cache-Control %q", name, resp.StatusCode, resp.Header.Get("Cache-Control"))
		}
		if resp, _ := rawGet(t, http.DefaultClient, e.URL+"/static/"+name, "gzip", "If-None-Match", resp.Header.Get("ETag")); resp.StatusCode != http.StatusNotModified {
			t.Errorf("/static/%s with its ETag: %d, want 304", name, resp.StatusCode)
		}
	}
	// Another version's hash (a page from a replica on another release,
	// mid-deploy) gets today's file, briefly cached; a name of none of
	// ours is not found.
	app := static.URL("app.css")
	other := strings.Replace(app, app[len("/static/app."):len("/static/app.")+10], "0123456789", 1)
	if resp, body := rawGet(t, http.DefaultClient, e.URL+other, "identity"); resp.StatusCode != http.StatusOK ||
		!bytes.Equal(body, want("app.css")) || resp.Header.Get("Cache-Control") != "public, max-age=300" {
		t.Errorf("%s: %d, Cache-Control %q, want today's file briefly cached", other, resp.StatusCode, resp.Header.Get("Cache-Control"))
	}
	for _, u := range []string{
		"/static/app.deadbeef.css", "/static/nothing.0123456789.css", "/static/nothing.css", "/static/vendor/", "/static/../go.mod",
	} {
		if resp, _ := rawGet(t, http.DefaultClient, e.URL+u, "gzip"); resp.StatusCode != http.StatusNotFound {
			t.Errorf("%s: %d, want 404", u, resp.StatusCode)
		}
	}
}

// The chat page loads neither the dashboard's stylesheet nor its charts;
// the usage page loads both.
func TestDashboardAssetsOnlyOnDashboards(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	p := e.chatter("dash@example.com")
	conv := p.newConversation()
	chat := p.page("/c/" + conv)
	usage := p.page("/usage")
	if chat.status != http.StatusOK || usage.status != http.StatusOK {
		t.Fatalf("pages: %d %d", chat.status, usage.status)
	}
	for _, u := range assetsOf(chat.body) {
		if strings.Contains(u, "dashboard") || strings.Contains(u, "chart") {
			t.Errorf("the chat page loads %s", u)
		}
	}
	for _, name := range []string{"dashboard.css", "dashboard.js", "vendor/chart.umd.min.js"} {
		if !strings.Contains(usage.body, `"`+static.URL(name)+`"`) {
			t.Errorf("the usage page does not load %s", name)
		}
	}
}

// Pages, JSON answers and static files go compressed when the browser
// takes it, and decode to the very bytes sent uncompressed.
func TestResponsesCompressed(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	p := e.chatter("zip@example.com")
	conv := conversationWithAnswers(e, p)
	for _, path := range []string{"/c/" + conv, "/api/v1/conversations/" + conv, "/history", static.URL("vendor/htmx.min.js")} {
		plainResp, plain := rawGet(t, p.c, e.URL+path, "identity")
		if plainResp.StatusCode != http.StatusOK || len(plain) < 2048 {
			t.Fatalf("%s: %d, %d bytes", path, plainResp.StatusCode, len(plain))
		}
		if enc := plainResp.Header.Get("Content-Encoding"); enc != "" {
			t.Errorf("%s: %q for a browser that takes none", path, enc)
		}
		for _, accept := range []string{"gzip", "br", "br;q=0, gzip"} {
			resp, body := rawGet(t, p.c, e.URL+path, accept)
			wantEnc := map[string]string{"gzip": "gzip", "br": "br", "br;q=0, gzip": "gzip"}[accept]
			if enc := resp.Header.Get("Content-Encoding"); enc != wantEnc {
				t.Errorf("%s (%s): Content-Encoding %q", path, accept, enc)
				continue
			}
			if !strings.Contains(resp.Header.Get("Vary"), "Accept-Encoding") {
				t.Errorf("%s: Vary %q", path, resp.Header.Get("Vary"))
			}
			if len(body) >= len(plain)/2 {
				t.Errorf("%s (%s): %d bytes for %d", path, accept, len(body), len(plain))
			}
			// Each page masks its CSRF token afresh: compare them with it left out.
			if got := decoded(t, resp, body); !bytes.Equal(withoutMaskedTokens(got), withoutMaskedTokens(plain)) {
				t.Errorf("%s (%s): decodes to %d bytes, not the %d sent plain", path, accept, len(got), len(plain))
			}
		}
	}
	// A tiny answer goes as it is.
	if resp, body := rawGet(t, p.c, e.URL+"/api/me", "gzip, br"); resp.Header.Get("Content-Encoding") != "" || !strings.Contains(string(body), "zip@example.com") {
		t.Errorf("/api/me: Content-Encoding %q", resp.Header.Get("Content-Encoding"))
	}
}

// maskedToken is a CSRF token as a page carries it (csrfmask.Mask).
var maskedToken = regexp.MustCompile(`m\.[A-Za-z0-9_-]{16,}`)

func withoutMaskedTokens(b []byte) []byte { return maskedToken.ReplaceAll(b, []byte("m.TOKEN")) }

// /v1 answers pass byte for byte, streamed or not, even to a client that
// asks for gzip or br: OpenAI clients and the engine's frames count on it.
func TestV1NeverCompressed(t *testing.T) {
	var stream strings.Builder
	for i := range 60 {
		stream.WriteString(`data: {"id":"chatcmpl-z","object":"chat.completion.chunk","created":1,"model":"m1","choices":[{"index":0,"delta":{"content":"word ` +
			strings.Repeat("x", i) + `"},"finish_reason":null}]}` + "\n\n")
	}
	stream.WriteString(`data: {"id":"chatcmpl-z","object":"chat.completion.chunk","created":1,"model":"m1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":60,"total_tokens":63}}` + "\n\n")
	stream.WriteString("data: [DONE]\n\n")
	whole := `{"id":"chatcmpl-w","object":"chat.completion","created":1,"model":"m1","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		strings.Repeat("the same words again and again ", 100) + `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":600,"total_tokens":603}}`
	manyModels := func(c *config.Config) { // a /v1/models list of some kilobytes
		for i := range 40 {
			c.Models = append(c.Models, config.Model{Name: fmt.Sprintf("model-with-a-long-name-%02d", i), Backend: "mock"})
		}
	}
	e := startEnvReplaying(t, "sqlite://"+t.TempDir()+"/m.db", recordings(t, map[string]string{"z.sse": stream.String(), "w.json": whole}), manyModels)
	for _, c := range []struct{ body, want string }{
		{`{"model":"m1","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"x"}],"mock":{"replay":"z.sse"}}`, stream.String()},
		{`{"model":"m1","messages":[{"role":"user","content":"x"}],"mock":{"replay":"w.json"}}`, whole},
	} {
		for _, path := range []string{"/v1/chat/completions", "/V1/chat/completions"} {
			req, _ := http.NewRequest(http.MethodPost, e.URL+path, strings.NewReader(c.body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+e.Key)
			req.Header.Set("Accept-Encoding", "gzip, deflate, br")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: %d %s", path, resp.StatusCode, got)
			}
			if enc := resp.Header.Get("Content-Encoding"); enc != "" {
				t.Errorf("%s: Content-Encoding %q", path, enc)
			}
			if string(got) != c.want {
				t.Errorf("%s: %d bytes relayed, not the engine's %d as written:\n%.300q", path, len(got), len(c.want), got)
			}
		}
	}
	// /v1's JSON that the gateway writes itself goes as it is too.
	for _, path := range []string{"/v1/models", "/V1/Models"} {
		resp, body := rawGet(t, http.DefaultClient, e.URL+path, "gzip, br", "Authorization", "Bearer "+e.Key)
		if resp.StatusCode != http.StatusOK || !json.Valid(body) || len(body) < 2048 {
			t.Fatalf("%s: %d, %d bytes", path, resp.StatusCode, len(body))
		}
		if enc := resp.Header.Get("Content-Encoding"); enc != "" {
			t.Errorf("%s: Content-Encoding %q", path, enc)
		}
	}
}

// The chat's event stream is never compressed, and its events come as
// they happen, not when the answer ends.
func TestChatEventStreamNotCompressed(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	p := e.chatter("sse@example.com")
	e.mockBody(map[string]any{"tokens": 2000, "tps": 20})
	conv := p.newConversation()
	s := p.send(conv, "a long one")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.URL+"/api/v1/generations/"+s.InferenceID+"/events", nil)
	req.Header.Set("Accept-Encoding", "gzip, deflate, br")
	resp, err := p.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("events: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if enc := resp.Header.Get("Content-Encoding"); enc != "" {
		t.Fatalf("event stream Content-Encoding %q", enc)
	}
	sc := bufio.NewScanner(resp.Body)
	chunks := 0
	for chunks < 3 && sc.Scan() {
		if sc.Text() == "event: chunk" {
			chunks++
		}
	}
	if chunks < 3 {
		t.Fatalf("stream ended after %d chunks: %v", chunks, sc.Err())
	}
	// Three chunks read while the answer (100 s long) is still being
	// written: nothing held them back.
	if m := p.conversation(conv).Messages; m[len(m)-1].Status != models.MessageStreaming {
		t.Errorf("answer %s before its first chunks arrived", m[len(m)-1].Status)
	}
	if status, body := p.do(http.MethodDelete, "/api/v1/conversations/"+conv, ""); status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", status, body)
	}
}

// chatPageBudget is the most /c/{id} may weigh, page, scripts and
// stylesheets together, as transferred (issue 45).
const chatPageBudget = 150 << 10

// The weight of a conversation's page: the page and every script and
// stylesheet it loads, as a first visit transfers them (br), within budget.
// Run with -v for the numbers BENCHMARKS.md quotes.
func TestChatPageWeight(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	p := e.chatter("weight@example.com")
	conv := conversationWithAnswers(e, p)
	const accept = "gzip, deflate, br, zstd" // Chromium's
	resp, page := rawGet(t, p.c, e.URL+"/c/"+conv, accept)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Encoding") != "br" {
		t.Fatalf("page: %d, Content-Encoding %q", resp.StatusCode, resp.Header.Get("Content-Encoding"))
	}
	plainPage := decoded(t, resp, page)
	wire, plain := len(page), len(plainPage)
	t.Logf("%-44s %7d B  %7d B uncompressed", "/c/{id}", len(page), len(plainPage))
	urls := assetsOf(string(plainPage))
	if len(urls) < 4 {
		t.Fatalf("the page loads %d assets: %v", len(urls), urls)
	}
	for _, u := range urls {
		resp, body := rawGet(t, p.c, e.URL+u, accept)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", u, resp.StatusCode)
		}
		full := decoded(t, resp, body)
		t.Logf("%-44s %7d B  %7d B uncompressed (%s)", u, len(body), len(full), resp.Header.Get("Content-Encoding"))
		wire += len(body)
		plain += len(full)
	}
	t.Logf("page weight of /c/{id}: %d B (%.1f KiB) transferred, %d B (%.1f KiB) uncompressed, %d files",
		wire, float64(wire)/1024, plain, float64(plain)/1024, len(urls)+1)
	if wire > chatPageBudget {
		t.Errorf("/c/{id} weighs %d B transferred, over the budget of %d", wire, chatPageBudget)
	}
}

// Pages are compressed, so the CSRF token they carry is masked afresh in
// each (BREACH): two loads of one page never hold the same token bytes,
// and the session's raw token appears in neither; both masked tokens (and
// the raw one, which scripts read from /api/me) are accepted.
func TestCSRFTokenMaskedInEveryPage(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/mask.db")
	p := e.chatter("masked@example.com")
	conv := p.newConversation()
	tokenRE := regexp.MustCompile(`X-CSRF-Token&#34;: &#34;([^&]+)&#34;`)
	var masked []string
	for range 2 {
		pg := p.page("/c/" + conv)
		m := tokenRE.FindStringSubmatch(pg.body)
		if m == nil {
			t.Fatalf("no CSRF token in the page:\n%.600s", pg.body)
		}
		if strings.Contains(pg.body, p.csrf) {
			t.Fatal("the page holds the raw CSRF token")
		}
		masked = append(masked, m[1])
	}
	if masked[0] == masked[1] {
		t.Fatalf("two pages carry the same token %q", masked[0])
	}
	for _, tok := range append(masked, p.csrf) {
		req, _ := http.NewRequest(http.MethodPatch, e.URL+"/api/v1/conversations/"+conv, strings.NewReader(`{"title":"t"}`))
		req.Header.Set("X-CSRF-Token", tok)
		req.Header.Set("Content-Type", "application/json")
		resp, err := p.c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("token %.12q…: %d", tok, resp.StatusCode)
		}
	}
}
