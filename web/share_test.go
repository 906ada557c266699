package web_test

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"
	"golang.org/x/net/html"

	"moonji/internal/config"
	"moonji/internal/mockllm"
	"moonji/models"
)

// share makes a link to conversation conv with body and returns its token,
// failing the test unless the answer is 201 {token, url}.
func (p *chatter) share(conv, body string) string {
	p.e.t.Helper()
	status, resp := p.do(http.MethodPost, "/api/v1/conversations/"+conv+"/shares", body)
	if status != http.StatusCreated {
		p.e.t.Fatalf("share %s: %d %s", conv, status, resp)
	}
	token := gjson.Get(resp, "token").Str
	if u := gjson.Get(resp, "url").Str; u != p.e.URL+"/s/"+token {
		p.e.t.Fatalf("share url %q for token %q", u, token)
	}
	return token
}

// answered starts a conversation of p with one question answered by the
// mock engine, which echoes what follows "/echo ".
func (p *chatter) answered(question string) string {
	p.e.t.Helper()
	conv := p.newConversation()
	p.send(conv, mockllm.EchoPrefix+question)
	if m := p.reply(conv); m.Status != models.MessageDone {
		p.e.t.Fatalf("reply: %+v", m)
	}
	return conv
}

// checkSharedHeaders fails unless a page a link opens keeps out search
// engines, scripts and referrers.
func checkSharedHeaders(t *testing.T, what string, pg page) {
	t.Helper()
	csp := pg.header.Get("Content-Security-Policy")
	if pg.header.Get("X-Robots-Tag") != "noindex" || !strings.Contains(csp, "script-src 'none'") ||
		!strings.Contains(csp, "default-src 'none'") || pg.header.Get("Referrer-Policy") != "no-referrer" ||
		pg.header.Get("Cache-Control") != "no-store" || !strings.Contains(pg.body, `<meta name="robots" content="noindex">`) {
		t.Errorf("%s: headers %v, body %.300s", what, pg.header, pg.body)
	}
	if strings.Contains(strings.ToLower(pg.body), "<script") {
		t.Errorf("%s: a script in the page:\n%s", what, pg.body)
	}
}

// A link opens a copy of the conversation as shown when it was made: the
// conversation's later messages and title do not change it, nobody is
// named unless the person chose so, and it ends (404, one page for every
// way) when revoked, when it expires, or with its conversation. Nobody
// shares or revokes someone else's.
func TestShareLinks(t *testing.T) {
	eachDatabase(t, func(t *testing.T, dbURL string) {
		e := startEnv(t, dbURL)
		p := e.chatter("sharer@example.com")
		viewer := e.chatter("viewer@example.com")
		conv := p.answered("The **first** answer.")
		token := p.share(conv, `{}`)

		first := viewer.page("/s/" + token)
		if first.status != http.StatusOK || !strings.Contains(first.body, "/echo The **first** answer.") ||
			!strings.Contains(first.body, "<strong>first</strong>") {
			t.Fatalf("shared page: %d %s", first.status, first.body)
		}
		checkSharedHeaders(t, "shared page", first)
		if strings.Contains(first.body, "sharer@example.com") || strings.Contains(first.body, "viewer@example.com") {
			t.Fatalf("an email on a page that names nobody:\n%s", first.body)
		}

		// The conversation goes on, and is renamed: the page does not move.
		p.send(conv, mockllm.EchoPrefix+"A second exchange.")
		p.reply(conv)
		if status, body := p.do(http.MethodPatch, "/api/v1/conversations/"+conv, `{"title":"Renamed later"}`); status != http.StatusOK {
			t.Fatalf("rename: %d %s", status, body)
		}
		if again := viewer.page("/s/" + token); again.status != http.StatusOK || again.body != first.body {
			t.Fatalf("the shared page changed with its conversation:\n%s\nwas\n%s", again.body, first.body)
		}
		if anew := p.page("/s/" + p.share(conv, `{}`)); !strings.Contains(anew.body, "A second exchange.") ||
			!strings.Contains(anew.body, "Renamed later") {
			t.Fatalf("a new link lacks what came later: %s", anew.body)
		}

		// Named only when chosen: the name, else the email.
		named := p.share(conv, `{"show_author":true}`)
		if pg := viewer.page("/s/" + named); !strings.Contains(pg.body, "sharer@example.com") {
			t.Fatalf("show_author without the email: %s", pg.body)
		}
		if err := e.DB.Model(&models.User{}).Where("email = ?", "sharer@example.com").Update("name", "Ann Sharer").Error; err != nil {
			t.Fatal(err)
		}
		if pg := viewer.page("/s/" + named); !strings.Contains(pg.body, "Ann Sharer") || strings.Contains(pg.body, "sharer@example.com") {
			t.Fatalf("show_author with a name: %s", pg.body)
		}
		if pg := viewer.page("/s/" + token); strings.Contains(pg.body, "Ann Sharer") {
			t.Fatalf("a name on a page that names nobody: %s", pg.body)
		}

		// Someone else's: never shareable, not revocable.
		if status, body := viewer.do(http.MethodPost, "/api/v1/conversations/"+conv+"/shares", `{}`); status != http.StatusNotFound ||
			gjson.Get(body, "error.code").Str != "not_found" {
			t.Fatalf("sharing someone else's conversation: %d %s", status, body)
		}
		if status, body := viewer.do(http.MethodDelete, "/api/v1/shares/"+token, ""); status != http.StatusNotFound ||
			gjson.Get(body, "error.message").Str == "" {
			t.Fatalf("revoking someone else's link: %d %s", status, body)
		}
		if pg := viewer.page("/s/" + token); pg.status != http.StatusOK {
			t.Fatalf("someone else's revoke ended the link: %d", pg.status)
		}

		// Unknown, revoked and expired: the same 404.
		unknown := viewer.page("/s/" + strings.Repeat("A", 22))
		if unknown.status != http.StatusNotFound {
			t.Fatalf("unknown link: %d", unknown.status)
		}
		checkSharedHeaders(t, "unknown link", unknown)
		if status, _ := p.do(http.MethodDelete, "/api/v1/shares/"+token, ""); status != http.StatusNoContent {
			t.Fatalf("revoke: %d", status)
		}
		if pg := viewer.page("/s/" + token); pg.status != http.StatusNotFound || pg.body != unknown.body {
			t.Fatalf("revoked link: %d %s", pg.status, pg.body)
		}
		if status, _ := p.do(http.MethodDelete, "/api/v1/shares/"+token, ""); status != http.StatusNotFound {
			t.Fatalf("revoking twice: %d", status)
		}
		expiring := p.share(conv, `{"expires_in":60}`)
		if pg := viewer.page("/s/" + expiring); pg.status != http.StatusOK {
			t.Fatalf("a link within its minute: %d", pg.status)
		}
		var row models.Share
		if err := e.DB.Where("token = ?", expiring).Take(&row).Error; err != nil || row.ExpiresAt == nil ||
			row.ExpiresAt.Sub(row.CreatedAt) != time.Minute {
			t.Fatalf("expiring row: %+v %v", row, err)
		}
		past := time.Now().Add(-time.Second)
		if err := e.DB.Model(&models.Share{}).Where("token = ?", expiring).Update("expires_at", past).Error; err != nil {
			t.Fatal(err)
		}
		if pg := viewer.page("/s/" + expiring); pg.status != http.StatusNotFound || pg.body != unknown.body {
			t.Fatalf("expired link: %d %s", pg.status, pg.body)
		}

		// The conversation deleted: its links end, and their rows go.
		if status, _ := p.do(http.MethodDelete, "/api/v1/conversations/"+conv, ""); status != http.StatusNoContent {
			t.Fatalf("delete conversation: %d", status)
		}
		var left int64
		e.DB.Model(&models.Share{}).Where("conversation_id = ?", conv).Count(&left)
		if pg := viewer.page("/s/" + named); pg.status != http.StatusNotFound || left != 0 {
			t.Fatalf("a deleted conversation's link: %d, %d rows left", pg.status, left)
		}
	})
}

// Tokens are 128 random bits in URL-safe base64, each one new: a stuck,
// short or repeated token fails.
func TestShareTokens(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/t.db")
	p := e.chatter("tokens@example.com")
	conv := p.answered("Share me.")
	const n = 48
	seen := map[string]bool{}
	ones := 0
	for range n {
		tok := p.share(conv, `{}`)
		raw, err := base64.RawURLEncoding.Strict().DecodeString(tok)
		if err != nil || len(raw) != 16 || len(tok) != 22 || seen[tok] {
			t.Fatalf("token %q: %d bytes, %v, seen before %v", tok, len(raw), err, seen[tok])
		}
		seen[tok] = true
		for _, b := range raw {
			for ; b != 0; b &= b - 1 {
				ones++
			}
		}
	}
	// n×128 fair bits: a half of them set, give or take 4% (over 5
	// standard deviations).
	if f := float64(ones) / (n * 128); f < 0.46 || f > 0.54 {
		t.Fatalf("%.3f of the tokens' bits are set", f)
	}
}

// Whether a signed-out visitor opens a link is configuration: by default
// they are sent to sign in and come back to it; with share.public they
// open it as anyone.
func TestShareSignedOut(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/o.db")
	p := e.chatter("private@example.com")
	token := p.share(p.answered("Only for people signed in."), `{}`)
	anon := &chatter{e: e, c: &http.Client{}}
	pg := anon.page("/s/" + token)
	if pg.status != http.StatusSeeOther || pg.header.Get("Location") != "/login?next="+url.QueryEscape("/s/"+token) ||
		strings.Contains(pg.body, "Only for people signed in") {
		t.Fatalf("signed out, not public: %d %v %s", pg.status, pg.header, pg.body)
	}
	// An unknown link is not told apart before the sign-in.
	if pg := anon.page("/s/" + strings.Repeat("B", 22)); pg.status != http.StatusSeeOther {
		t.Fatalf("signed out, unknown link: %d", pg.status)
	}
	e.addPerson("reader@example.com", false)
	b := browser(t)
	resp, body := e.signIn(b, "/s/"+token, "reader@example.com", testPassword)
	if resp.StatusCode != http.StatusOK || resp.Request.URL.Path != "/s/"+token || !strings.Contains(body, "Only for people signed in.") {
		t.Fatalf("after the sign-in: %d at %s", resp.StatusCode, resp.Request.URL)
	}

	pub := startEnv(t, "sqlite://"+t.TempDir()+"/p.db", func(c *config.Config) { c.Share.Public = true })
	p = pub.chatter("public@example.com")
	token = p.share(p.answered("For anyone with the link."), `{}`)
	anon = &chatter{e: pub, c: &http.Client{}}
	pg = anon.page("/s/" + token)
	if pg.status != http.StatusOK || !strings.Contains(pg.body, "For anyone with the link.") {
		t.Fatalf("signed out, public: %d %s", pg.status, pg.body)
	}
	checkSharedHeaders(t, "public page", pg)
	if strings.Contains(pg.body, "public@example.com") || strings.Contains(pg.body, "Log out") {
		t.Fatalf("the public page names someone: %s", pg.body)
	}
	if pg := anon.page("/s/" + strings.Repeat("C", 22)); pg.status != http.StatusNotFound {
		t.Fatalf("public, unknown link: %d", pg.status)
	}
}

// What a conversation holds cannot put script, an event handler or a
// javascript: link in the shared page: HTML in a message is shown as
// text, and the answer's Markdown goes through the sanitizing renderer.
func TestSharedPageRunsNothing(t *testing.T) {
	eachDatabase(t, func(t *testing.T, dbURL string) {
		e := startEnv(t, dbURL, func(c *config.Config) { c.Share.Public = true })
		p := e.chatter("hostile@example.com")
		hostile := `<script>alert(1)</script> <img src=x onerror=alert(2)> [click](javascript:alert(3)) <iframe src="https://evil.example"></iframe>` +
			"\n\n<svg onload=alert(4)>\n\n```html\n<script>alert(5)</script>\n```\n\n![x](https://evil.example/track.png)"
		token := p.share(p.answered(hostile), `{}`)
		for _, who := range []*chatter{p, {e: e, c: &http.Client{}}} {
			pg := who.page("/s/" + token)
			if pg.status != http.StatusOK || !strings.Contains(pg.body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
				t.Fatalf("hostile page: %d %s", pg.status, pg.body)
			}
			checkSharedHeaders(t, "hostile page", pg)
			if bad := activeMarkup(pg.body); bad != "" {
				t.Errorf("%s in the shared page:\n%s", bad, pg.body)
			}
		}
	})
}

// activeMarkup names the first element or attribute of page, as a browser
// parses it, that could run or fetch something: a script, an image, a
// frame, an svg, an event handler, a javascript: URL. "" when none.
func activeMarkup(page string) string {
	z := html.NewTokenizer(strings.NewReader(page))
	for {
		switch z.Next() {
		case html.ErrorToken:
			return ""
		case html.StartTagToken, html.SelfClosingTagToken:
			tok := z.Token()
			switch tok.Data {
			case "script", "img", "iframe", "svg", "object", "embed", "base", "form":
				return "<" + tok.Data + ">"
			}
			for _, a := range tok.Attr {
				v := strings.ToLower(strings.TrimSpace(a.Val))
				if strings.HasPrefix(a.Key, "on") || strings.HasPrefix(v, "javascript:") || a.Key == "style" {
					return "<" + tok.Data + " " + a.Key + "=" + a.Val + ">"
				}
			}
		}
	}
}

// Hostile requests get a 4xx in OpenAI's shape naming the field, and
// bogus tokens the shared page's 404; nothing is made.
func TestShareRefusesHostileInput(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/h.db")
	p := e.chatter("hostile-input@example.com")
	conv := p.answered("Share me, carefully.")
	path := "/api/v1/conversations/" + conv + "/shares"
	for body, param := range map[string]string{
		`{"expires_in":-1}`: "expires_in", `{"expires_in":0}`: "expires_in", `{"expires_in":59}`: "expires_in",
		`{"expires_in":31536001}`: "expires_in", `{"expires_in":1e300}`: "expires_in", `{"expires_in":"soon"}`: "expires_in",
		`{"expires_in":"-1h"}`: "expires_in", `{"expires_in":"876000h"}`: "expires_in", `{"expires_in":[60]}`: "expires_in",
		`{"expires_in":60,"expires_in":120}`: "expires_in", `{"show_author":"yes"}`: "show_author",
		`[{}]`: "", `"x"`: "", `{`: "", `{"a":` + strings.Repeat("[", 10000) + `}`: "",
	} {
		status, resp := p.do(http.MethodPost, path, body)
		if status != http.StatusBadRequest || gjson.Get(resp, "error.param").Str != param ||
			gjson.Get(resp, "error.type").Str != "invalid_request_error" || gjson.Get(resp, "error.message").Str == "" {
			t.Errorf("%.50s: %d %s, want 400 naming %q", body, status, resp, param)
		}
	}
	status, resp := p.do(http.MethodPost, path, `{"expires_in":"`+strings.Repeat("9", 70<<10)+`"}`)
	if status != http.StatusRequestEntityTooLarge || gjson.Get(resp, "error.code").Str != "request_too_large" {
		t.Errorf("a body over 64 KiB: %d %s", status, resp)
	}
	if status, resp := p.do(http.MethodPost, "/api/v1/conversations/c_nope/shares", `{}`); status != http.StatusNotFound {
		t.Errorf("an unknown conversation: %d %s", status, resp)
	}
	empty := p.newConversation()
	if status, resp := p.do(http.MethodPost, "/api/v1/conversations/"+empty+"/shares", `{}`); status != http.StatusBadRequest ||
		gjson.Get(resp, "error.code").Str != "nothing_to_share" {
		t.Errorf("an empty conversation: %d %s", status, resp)
	}
	// Without the CSRF header, a session is not enough.
	req, _ := http.NewRequest(http.MethodPost, e.URL+path, strings.NewReader(`{}`))
	if resp, err := p.c.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("without CSRF: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	var made int64
	e.DB.Model(&models.Share{}).Count(&made)
	if made != 0 {
		t.Fatalf("%d links made by refused requests", made)
	}

	gone := p.page("/s/" + strings.Repeat("A", 22)).body
	for _, tok := range []string{"x", "AAAAAAAAAAAAAAAAAAAAAB", "AAAAAAAAAAAAAAAAAAAAA", "AAAAAAAAAAAAAAAAAAAAAAA",
		"AAAAAAAAAAAAAAAAAAAA%2B%2F", "%27%20OR%201%3D1%20--", "..%2F..%2Fetc", strings.Repeat("A", 1000), "%00", "AAAAAAAAAAAAAAAAAAAA%0A"} {
		pg := p.page("/s/" + tok)
		if pg.status != http.StatusNotFound || pg.body != gone {
			t.Errorf("token %.40q: %d %.200s", tok, pg.status, pg.body)
		}
		if status, resp := p.do(http.MethodDelete, "/api/v1/shares/"+tok, ""); status != http.StatusNotFound ||
			gjson.Get(resp, "error.code").Str != "not_found" {
			t.Errorf("revoke %.40q: %d %s", tok, status, resp)
		}
	}
}

var shareURLField = regexp.MustCompile(`id="share-url" readonly value="([^"]+)"`)

// The chat page's Share button opens a panel that makes a link and shows
// it to copy; /shares lists the person's links with a Revoke each, which
// ends the link. Nobody else's panel, list or revoke.
func TestSharePanelAndList(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/l.db")
	p := e.chatter("lister@example.com")
	conv := p.answered("Share me from the page.")
	if pg := p.page("/c/" + conv); !strings.Contains(pg.body, `>Share</button>`) {
		t.Fatalf("no Share button on the conversation's page")
	}
	panel := p.page("/c/" + conv + "/share")
	for _, want := range []string{`<label for="share-expiry">Expires</label>`, `name="show_author"`, "Show my name (lister@example.com)",
		`>Create link</button>`, `href="/shares"`} {
		if panel.status != http.StatusOK || !strings.Contains(panel.body, want) {
			t.Fatalf("panel without %s: %d %s", want, panel.status, panel.body)
		}
	}
	made := p.form("/c/"+conv+"/share", url.Values{"expires_in": {"3600"}, "show_author": {"1"}}, true)
	m := shareURLField.FindStringSubmatch(made.body)
	if made.status != http.StatusOK || m == nil || !strings.HasPrefix(m[1], e.URL+"/s/") {
		t.Fatalf("create from the panel: %d %s", made.status, made.body)
	}
	token := strings.TrimPrefix(m[1], e.URL+"/s/")
	var row models.Share
	if err := e.DB.Where("token = ?", token).Take(&row).Error; err != nil || !row.ShowAuthor || row.ExpiresAt == nil ||
		row.ExpiresAt.Sub(row.CreatedAt) != time.Hour {
		t.Fatalf("the panel's link: %+v %v", row, err)
	}
	for _, bad := range []string{"-5", "abc", "59", "99999999999"} {
		if pg := p.form("/c/"+conv+"/share", url.Values{"expires_in": {bad}}, true); pg.status != http.StatusUnprocessableEntity ||
			!strings.Contains(pg.body, `role="alert"`) {
			t.Errorf("expires_in %q from the panel: %d", bad, pg.status)
		}
	}
	if pg := p.form("/c/"+conv+"/share", url.Values{"expires_in": {"0"}}, false); pg.status != http.StatusSeeOther ||
		pg.header.Get("Location") != "/shares" {
		t.Fatalf("a plain form: %d %v", pg.status, pg.header)
	}

	list := p.page("/shares")
	if list.status != http.StatusOK || strings.Count(list.body, `class="share-item"`) != 2 || !strings.Contains(list.body, m[1]) ||
		!strings.Contains(list.body, "Share me from the page.") || !strings.Contains(list.body, ">Revoke<") {
		t.Fatalf("shares page: %d %s", list.status, list.body)
	}

	other := e.chatter("other-lister@example.com")
	if pg := other.page("/c/" + conv + "/share"); pg.status != http.StatusNotFound {
		t.Errorf("another person's panel: %d", pg.status)
	}
	if pg := other.form("/c/"+conv+"/share", url.Values{"expires_in": {"0"}}, true); pg.status != http.StatusNotFound {
		t.Errorf("another person's create: %d", pg.status)
	}
	if pg := other.form("/shares/"+token+"/revoke", url.Values{}, true); pg.status != http.StatusNotFound {
		t.Errorf("another person's revoke: %d", pg.status)
	}
	if pg := other.page("/shares"); strings.Contains(pg.body, token) {
		t.Errorf("another person's list shows the link")
	}
	// A revoke without the CSRF token is refused.
	req, _ := http.NewRequest(http.MethodPost, e.URL+"/shares/"+token+"/revoke", strings.NewReader(""))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if pg := p.fetch(req); pg.status != http.StatusForbidden {
		t.Errorf("revoke without CSRF: %d", pg.status)
	}

	revoked := p.form("/shares/"+token+"/revoke", url.Values{"_csrf": {p.csrf}}, true)
	if revoked.status != http.StatusOK || strings.Contains(revoked.body, token) || !strings.Contains(revoked.body, "Revoked") {
		t.Fatalf("revoke: %d %s", revoked.status, revoked.body)
	}
	if pg := p.page("/s/" + token); pg.status != http.StatusNotFound {
		t.Fatalf("a revoked link: %d", pg.status)
	}
}
