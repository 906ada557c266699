package web_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidwall/gjson"

	"moonji/models"
)

// seedConversations stores n conversations of the person email, the i-th
// last used at t0 + i/2 seconds (two at a time share a moment), titled by
// title(i), pinned when pin(i); it returns their ids.
func (e *testEnv) seedConversations(email string, n int, t0 time.Time, title func(int) string, pin func(int) bool) []string {
	e.t.Helper()
	u, err := models.UserByEmail(context.Background(), e.DB, email)
	if err != nil {
		e.t.Fatal(err)
	}
	var ids []string
	for i := range n {
		at := t0.Add(time.Duration(i/2) * time.Second)
		c := &models.Conversation{ID: models.NewConversationID(), UserID: u.ID, Model: "m1", Title: title(i), Pinned: pin(i),
			CreatedAt: at, UpdatedAt: at}
		if err := models.CreateConversation(context.Background(), e.DB, c); err != nil {
			e.t.Fatal(err)
		}
		ids = append(ids, c.ID)
	}
	return ids
}

// apiList pages through GET /api/v1/conversations with query (q, folder)
// and returns every conversation in the order given.
func (p *chatter) apiList(query url.Values) []gjson.Result {
	p.e.t.Helper()
	var out []gjson.Result
	cursor := ""
	for pages := 0; ; pages++ {
		if pages > 20 {
			p.e.t.Fatal("the list does not end")
		}
		v := url.Values{}
		for k, vs := range query {
			v[k] = vs
		}
		if cursor != "" {
			v.Set("cursor", cursor)
		}
		status, body := p.do(http.MethodGet, "/api/v1/conversations?"+v.Encode(), "")
		if status != http.StatusOK {
			p.e.t.Fatalf("list %v: %d %s", v, status, body)
		}
		out = append(out, gjson.Get(body, "data").Array()...)
		if cursor = gjson.Get(body, "next_cursor").Str; cursor == "" {
			return out
		}
	}
}

func ids(rows []gjson.Result) []string {
	var out []string
	for _, r := range rows {
		out = append(out, r.Get("id").Str)
	}
	return out
}

// listOrder sorts conversations as every list shows them: pinned first,
// then last used first, ties by id (greater first).
func listOrder(rows []gjson.Result) []string {
	sorted := slices.Clone(rows)
	slices.SortStableFunc(sorted, func(a, b gjson.Result) int {
		if pa, pb := a.Get("pinned").Bool(), b.Get("pinned").Bool(); pa != pb {
			if pa {
				return -1
			}
			return 1
		}
		ta, tb := a.Get("updated_at").Time(), b.Get("updated_at").Time()
		if c := tb.Compare(ta); c != 0 {
			return c
		}
		return strings.Compare(b.Get("id").Str, a.Get("id").Str)
	})
	return ids(sorted)
}

// TestPinsAndFoldersAPI: PATCH pins a conversation (first in the list,
// its place among the others kept) and puts it in a folder or out of it;
// pages of the list cross the pinned/unpinned boundary with every
// conversation exactly once, in order; ?folder= keeps one folder's, with a
// search too. Hostile values are refused in OpenAI's error shape, naming
// the field, with nothing stored; someone else's conversation is not
// found, their folders not listed.
func TestPinsAndFoldersAPI(t *testing.T) {
	eachDatabase(t, func(t *testing.T, dbURL string) {
		e := startEnv(t, dbURL)
		p := e.chatter("pins@example.com")
		t0 := time.Now().UTC().Add(-time.Hour).Truncate(time.Second)
		// 70 conversations, the 54 oldest pinned: the first page (50) is
		// pinned only, and its cursor is a pinned one.
		all := e.seedConversations("pins@example.com", 70, t0, func(i int) string {
			if i%5 == 0 {
				return fmt.Sprintf("Trip to Busan %d", i)
			}
			return fmt.Sprintf("Notes %d", i)
		}, func(i int) bool { return i < 54 })
		patch := func(id, body string) (int, string) { return p.do(http.MethodPatch, "/api/v1/conversations/"+id, body) }

		// Pin one more, the newest: it was first among the unpinned, it
		// becomes first of all, with its updated_at unchanged.
		newest := all[69]
		before := p.conversationJSON(newest)
		status, body := patch(newest, `{"pinned":true}`)
		if status != http.StatusOK || !gjson.Get(body, "pinned").Bool() || gjson.Get(body, "updated_at").Str != before.Get("updated_at").Str {
			t.Fatalf("pin: %d %s (before %s)", status, body, before.Raw)
		}
		listed := p.apiList(nil)
		got := ids(listed)
		if len(got) != 70 || got[0] != newest || !slices.Equal(got, listOrder(listed)) {
			t.Fatalf("the list after the pin (%d): %q\nwant in order %q", len(got), got, listOrder(listed))
		}
		seen := map[string]int{}
		for _, id := range got {
			seen[id]++
		}
		for _, id := range all {
			if seen[id] != 1 {
				t.Fatalf("%s listed %d times across the pages", id, seen[id])
			}
		}
		if n := len(slices.DeleteFunc(slices.Clone(listed), func(r gjson.Result) bool { return !r.Get("pinned").Bool() })); n != 55 {
			t.Fatalf("%d pinned, want 55", n)
		}

		// Folders: set (trimmed), listed by ?folder=, searched within,
		// cleared by "" and by null.
		work := []string{all[0], all[5], all[6], all[60], all[65]}
		for _, id := range work {
			if status, body := patch(id, `{"folder":"  Work  "}`); status != http.StatusOK || gjson.Get(body, "folder").Str != "Work" {
				t.Fatalf("move to Work: %d %s", status, body)
			}
		}
		inWork := p.apiList(url.Values{"folder": {"Work"}})
		if !sameSet(ids(inWork), work) || !slices.Equal(ids(inWork), listOrder(inWork)) {
			t.Fatalf("folder Work lists %q, want %q in list order", ids(inWork), work)
		}
		// Trip to Busan: 0, 5, 60, 65 are in Work (6 is "Notes 6").
		trips := p.apiList(url.Values{"folder": {"Work"}, "q": {"busan"}})
		if !sameSet(ids(trips), []string{all[0], all[5], all[60], all[65]}) {
			t.Fatalf("search busan in Work: %q", ids(trips))
		}
		if everywhere := p.apiList(url.Values{"q": {"busan"}}); len(everywhere) != 14 {
			t.Fatalf("search busan everywhere: %d", len(everywhere))
		}
		if status, body := patch(all[5], `{"folder":""}`); status != http.StatusOK || gjson.Get(body, "folder").Str != "" {
			t.Fatalf("out of the folder: %d %s", status, body)
		}
		if status, body := patch(all[6], `{"folder":null,"pinned":false}`); status != http.StatusOK || gjson.Get(body, "folder").Str != "" ||
			gjson.Get(body, "pinned").Bool() {
			t.Fatalf("out of the folder by null, unpinned: %d %s", status, body)
		}
		if inWork := p.apiList(url.Values{"folder": {"Work"}}); !sameSet(ids(inWork), []string{all[0], all[60], all[65]}) {
			t.Fatalf("folder Work after two left: %q", ids(inWork))
		}

		// Hostile values: 400 in OpenAI's shape naming the field, nothing
		// stored (neither the pin beside a refused folder).
		target := all[60] // pinned: no, in Work
		want := p.conversationJSON(target)
		for _, c := range []struct{ body, param string }{
			{`{"folder":"` + strings.Repeat("x", 65) + `"}`, "folder"},
			{`{"folder":"` + strings.Repeat("é", 65) + `","pinned":true}`, "folder"},
			{`{"folder":"a\u0000b","pinned":true}`, "folder"},
			{`{"folder":"a\nb"}`, "folder"},
			{`{"folder":"\u001b[31mred"}`, "folder"},
			{`{"folder":"\u202eevil"}`, "folder"},
			{`{"folder":"a\u0085b"}`, "folder"},
			{"{\"folder\":\"\xff\"}", "folder"},
			{`{"folder":7}`, "folder"},
			{`{"folder":["Work"]}`, "folder"},
			{`{"folder":{"name":"Work"}}`, "folder"},
			{`{"folder":true}`, "folder"},
			{`{"folder":"a","folder":"b"}`, "folder"},
			{`{"pinned":"true"}`, "pinned"},
			{`{"pinned":1}`, "pinned"},
			{`{"pinned":null}`, "pinned"},
			{`{"pinned":[true]}`, "pinned"},
			{`{"pinned":true,"pinned":false}`, "pinned"},
			{`{"pinned":true,"temperature":9}`, "temperature"},
			{`{"pinned":true,"title":"` + strings.Repeat("t", 201) + `"}`, "title"},
		} {
			status, body := patch(target, c.body)
			if status != http.StatusBadRequest || gjson.Get(body, "error.param").Str != c.param ||
				gjson.Get(body, "error.type").Str != "invalid_request_error" || gjson.Get(body, "error.message").Str == "" {
				t.Errorf("%.70q: %d %s, want 400 naming %q", c.body, status, body, c.param)
			}
		}
		if got := p.conversationJSON(target); got.Get("pinned").Bool() || got.Get("folder").Str != "Work" ||
			got.Get("updated_at").Str != want.Get("updated_at").Str || got.Get("temperature").Type != gjson.Null {
			t.Fatalf("refused PATCHes changed the conversation: %s, was %s", got.Raw, want.Raw)
		}
		for _, q := range []string{strings.Repeat("f", 65), "a\x01b"} {
			status, body := p.do(http.MethodGet, "/api/v1/conversations?"+url.Values{"folder": {q}}.Encode(), "")
			if status != http.StatusBadRequest || gjson.Get(body, "error.param").Str != "folder" {
				t.Errorf("list folder %q: %d %s", q, status, body)
			}
		}

		// Someone else's: not found, unchanged; their list has no folder of
		// mine.
		other := e.chatter("nosy@example.com")
		for _, b := range []string{`{"pinned":false}`, `{"folder":"Mine now"}`} {
			if status, _ := other.do(http.MethodPatch, "/api/v1/conversations/"+newest, b); status != http.StatusNotFound {
				t.Fatalf("another person's PATCH %s: %d", b, status)
			}
		}
		if got := p.conversationJSON(newest); !got.Get("pinned").Bool() || got.Get("folder").Str != "" {
			t.Fatalf("another person's PATCH changed it: %s", got.Raw)
		}
		if theirs := other.apiList(url.Values{"folder": {"Work"}}); len(theirs) != 0 {
			t.Fatalf("another person sees %d conversations in Work", len(theirs))
		}

		// At most chat.MaxFolders (100) folders: a 101st is refused, an
		// existing one is not.
		for i, id := range all[:40] {
			if err := setFolder(e, id, fmt.Sprintf("f%02d", i)); err != nil {
				t.Fatal(err)
			}
		}
		more := e.seedConversations("pins@example.com", 60, t0, func(int) string { return "" }, func(int) bool { return false })
		for i, id := range more[:59] {
			if err := setFolder(e, id, fmt.Sprintf("g%02d", i)); err != nil {
				t.Fatal(err)
			}
		}
		// Now: f00…f39, g00…g58 and Work = 100 folders.
		if status, body := patch(more[59], `{"folder":"One too many"}`); status != http.StatusBadRequest ||
			gjson.Get(body, "error.code").Str != "too_many_folders" || gjson.Get(body, "error.param").Str != "folder" {
			t.Fatalf("a 101st folder: %d %s", status, body)
		}
		if status, body := patch(more[59], `{"folder":"g07"}`); status != http.StatusOK {
			t.Fatalf("an existing folder at the bound: %d %s", status, body)
		}
	})
}

// setFolder puts conversation id in folder straight in the database.
func setFolder(e *testEnv, id, folder string) error {
	return e.DB.Model(&models.Conversation{}).Where("id = ?", id).UpdateColumn("folder", folder).Error
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// conversationJSON is GET /api/v1/conversations/{id}.
func (p *chatter) conversationJSON(id string) gjson.Result {
	p.e.t.Helper()
	status, body := p.do(http.MethodGet, "/api/v1/conversations/"+id, "")
	if status != http.StatusOK {
		p.e.t.Fatalf("get %s: %d %s", id, status, body)
	}
	return gjson.Parse(body)
}

// TestSidebarPinsAndFolders: the sidebar lists pinned conversations first
// with a pin mark, then each folder's (a place to drop one), then the
// others; each has a menu with Pin or Unpin and Move to folder, whose forms
// answer htmx with the sidebar again (the menu open; a refusal says why,
// nothing stored), the history with the list again. The history filters by
// folder beside its search. Nobody else's conversation can be pinned or
// moved.
func TestSidebarPinsAndFolders(t *testing.T) {
	eachDatabase(t, func(t *testing.T, dbURL string) {
		e := startEnv(t, dbURL)
		p := e.chatter("sidebar@example.com")
		t0 := time.Now().UTC().Add(-time.Hour)
		convs := e.seedConversations("sidebar@example.com", 6, t0, func(i int) string { return fmt.Sprintf("Chat %d", i) },
			func(int) bool { return false })
		pg := p.form("/c/"+convs[0]+"/pin", url.Values{"pinned": {"1"}, "current": {convs[3]}}, true)
		if pg.status != http.StatusOK || !strings.Contains(pg.body, `id="sidebar"`) || !strings.Contains(pg.body, `hx-swap-oob="true"`) {
			t.Fatalf("pin: %d %s", pg.status, pg.body)
		}
		pinned := section(t, pg.body, `aria-label="Pinned"`)
		if !strings.Contains(pinned, "Chat 0") || strings.Contains(pinned, "Chat 1") || !strings.Contains(pinned, `<span class="visually-hidden">Pinned: </span>`) {
			t.Fatalf("pinned group: %s", pinned)
		}
		if !strings.Contains(pg.body, `<details class="conv-menu" open>`) || !strings.Contains(pg.body, `aria-label="Unpin Chat 0">Unpin</button>`) ||
			!strings.Contains(pg.body, `href="/c/`+convs[3]+`" draggable="true" aria-current="page"`) {
			t.Fatalf("after a pin, the menu open with Unpin, the current one marked: %s", pg.body)
		}
		if i, j := strings.Index(pg.body, "Chat 0"), strings.Index(pg.body, "Chat 5"); i < 0 || j < i {
			t.Fatalf("the pinned conversation is not first: %s", pg.body)
		}

		pg = p.form("/c/"+convs[1]+"/folder", url.Values{"folder": {" Travel "}, "current": {convs[3]}}, true)
		travel := section(t, pg.body, `data-drop-folder="Travel"`)
		if pg.status != http.StatusOK || !strings.Contains(travel, "Chat 1") || !strings.Contains(travel, `href="/history?folder=Travel"`) ||
			!strings.Contains(pg.body, `<option value="Travel"></option>`) || !strings.Contains(pg.body, `value="Travel" placeholder="No folder"`) {
			t.Fatalf("move to Travel: %d %s", pg.status, pg.body)
		}
		if nofolder := section(t, pg.body, `data-drop-folder=""`); !strings.Contains(nofolder, "Chat 2") || strings.Contains(nofolder, "Chat 1") {
			t.Fatalf("no folder group: %s", nofolder)
		}

		// Refused: the sidebar says why, in the open menu; nothing stored.
		for _, bad := range []string{strings.Repeat("x", 65), "tab\there", "\u202eevil"} {
			pg = p.form("/c/"+convs[2]+"/folder", url.Values{"folder": {bad}, "current": {convs[3]}}, true)
			if pg.status != http.StatusOK || !strings.Contains(pg.body, `role="alert">A folder&#39;s name must be`) {
				t.Fatalf("refused folder %q: %d %s", bad, pg.status, pg.body)
			}
		}
		if got := p.conversationJSON(convs[2]); got.Get("folder").Str != "" {
			t.Fatalf("a refused folder was stored: %s", got.Raw)
		}

		// The whole page: the same sidebar; GET /sidebar alone.
		home := p.page("/c/" + convs[3])
		if !strings.Contains(home.body, `aria-label="Options for Chat 4"`) || !strings.Contains(home.body, `data-drop-pin`) {
			t.Fatalf("the chat page's sidebar: %s", home.body)
		}
		if sb := p.page("/sidebar?current=" + convs[3]); sb.status != http.StatusOK || !strings.HasPrefix(strings.TrimSpace(sb.body), `<nav id="sidebar"`) {
			t.Fatalf("GET /sidebar: %d %s", sb.status, sb.body)
		}

		// From the history: back to the same search and folder, with what
		// was done; a refusal is a page saying why.
		back := url.Values{"from": {"history"}, "q": {"chat"}, "folder_filter": {"Travel"}}
		pg = p.form("/c/"+convs[4]+"/folder", withValue(back, "folder", "Travel"), false)
		if pg.status != http.StatusSeeOther || pg.header.Get("Location") != "/history?done=moved&folder=Travel&q=chat" {
			t.Fatalf("move from the history: %d %q", pg.status, pg.header.Get("Location"))
		}
		pg = p.form("/c/"+convs[4]+"/pin", withValue(back, "pinned", "1"), false)
		if pg.status != http.StatusSeeOther || !strings.Contains(pg.header.Get("Location"), "done=pinned") {
			t.Fatalf("pin from the history: %d %q", pg.status, pg.header.Get("Location"))
		}
		if pg = p.form("/c/"+convs[4]+"/folder", withValue(back, "folder", "bad\x01"), false); pg.status != http.StatusBadRequest ||
			!strings.Contains(pg.body, "without control characters") {
			t.Fatalf("a refused move from the history: %d %s", pg.status, pg.body)
		}
		h := p.page("/history?folder=Travel&q=chat&done=pinned")
		if h.status != http.StatusOK || !strings.Contains(h.body, `<option value="Travel" selected>Travel</option>`) ||
			!strings.Contains(h.body, "Chat 1") || !strings.Contains(h.body, "Chat 4") || strings.Contains(h.body, "Chat 2") ||
			!strings.Contains(h.body, "Pinned.") || !strings.Contains(h.body, `aria-label="Unpin Chat 4"`) {
			t.Fatalf("history of Travel: %d %s", h.status, h.body)
		}
		if i, j := strings.Index(h.body, "Chat 4"), strings.Index(h.body, "Chat 1"); i > j {
			t.Fatal("the pinned conversation is not first in the history")
		}
		if h := p.page("/history?folder=" + strings.Repeat("x", 65)); h.status != http.StatusBadRequest {
			t.Fatalf("history of an impossible folder: %d", h.status)
		}

		// Someone else's conversation: not found, unchanged.
		other := e.chatter("other@example.com")
		for _, path := range []string{"/c/" + convs[5] + "/pin", "/c/" + convs[5] + "/folder"} {
			if pg := other.form(path, url.Values{"pinned": {"1"}, "folder": {"Mine"}}, true); pg.status != http.StatusNotFound {
				t.Fatalf("another person's %s: %d", path, pg.status)
			}
		}
		if got := p.conversationJSON(convs[5]); got.Get("pinned").Bool() || got.Get("folder").Str != "" {
			t.Fatalf("another person changed it: %s", got.Raw)
		}
		if sb := other.page("/sidebar"); strings.Contains(sb.body, "Travel") || strings.Contains(sb.body, "Chat ") {
			t.Fatalf("another person's sidebar: %s", sb.body)
		}
	})
}

func withValue(v url.Values, key, value string) url.Values {
	out := url.Values{key: {value}}
	for k, vs := range v {
		out[k] = vs
	}
	return out
}

// section returns the <section> of the sidebar whose start tag holds attr.
func section(t *testing.T, body, attr string) string {
	t.Helper()
	i := strings.Index(body, attr)
	if i < 0 {
		t.Fatalf("no section with %s in %s", attr, body)
	}
	start := strings.LastIndex(body[:i], "<section")
	end := strings.Index(body[i:], "</section>")
	return body[start : i+end]
}

// TestDefaultSystemPrompt: a person's default system prompt, saved on the
// settings page, is what the engine receives first for a conversation
// without a system prompt of its own; a conversation's own wins; cleared,
// none is sent. Another person's conversations never get it. A prompt
// too long or not UTF-8 is refused with why, nothing stored.
func TestDefaultSystemPrompt(t *testing.T) {
	eachDatabase(t, func(t *testing.T, dbURL string) {
		e := startEnv(t, dbURL)
		p := e.chatter("prompt@example.com")
		pg := p.page("/settings")
		if pg.status != http.StatusOK || !strings.Contains(pg.body, `<label for="default_system_prompt">Default system prompt</label>`) ||
			!strings.Contains(pg.body, `<button type="submit">Save</button>`) {
			t.Fatalf("settings page: %d %s", pg.status, pg.body)
		}
		save := func(prompt string) page {
			return p.form("/settings", url.Values{"default_system_prompt": {prompt}}, false)
		}
		if pg := save("  Answer in French.\n"); pg.status != http.StatusSeeOther || pg.header.Get("Location") != "/settings?done=saved" {
			t.Fatalf("save: %d %s", pg.status, pg.body)
		}
		if pg := p.page("/settings?done=saved"); !strings.Contains(pg.body, ">Answer in French.</textarea>") || !strings.Contains(pg.body, "Saved") {
			t.Fatalf("after saving: %s", pg.body)
		}
		received := func(who *chatter, conv, content string) gjson.Result {
			t.Helper()
			who.send(conv, content)
			who.reply(conv)
			for _, r := range e.Mock.Requests() {
				if gjson.GetBytes(r.Body, "messages.@reverse.0.content").Str == content {
					return gjson.ParseBytes(r.Body)
				}
			}
			t.Fatalf("the engine never received %q", content)
			return gjson.Result{}
		}
		plain := p.newConversation()
		if got := received(p, plain, "Bonjour?"); got.Get("messages.0.role").Str != "system" ||
			got.Get("messages.0.content").Str != "Answer in French." || len(got.Get("messages").Array()) != 2 {
			t.Fatalf("without a prompt of its own, the engine received %s", got.Raw)
		}
		own := p.newConversation()
		if status, body := p.do(http.MethodPatch, "/api/v1/conversations/"+own, `{"system_prompt":"Answer in Korean."}`); status != http.StatusOK {
			t.Fatalf("own prompt: %d %s", status, body)
		}
		if got := received(p, own, "Annyeong?"); got.Get("messages.0.content").Str != "Answer in Korean." ||
			strings.Contains(got.Raw, "French") {
			t.Fatalf("with a prompt of its own, the engine received %s", got.Raw)
		}
		other := e.chatter("someone@example.com")
		theirs := other.newConversation()
		if got := received(other, theirs, "Hello?"); got.Get("messages.0.role").Str == "system" {
			t.Fatalf("another person's conversation got a system prompt: %s", got.Raw)
		}

		// Refused: why, the text kept when it fits; nothing stored.
		for _, c := range []struct{ prompt, why string }{
			{strings.Repeat("x", 16<<10+1), "at most 16 KiB"},
			{"bad \xff byte", "valid UTF-8"},
		} {
			if pg := save(c.prompt); pg.status != http.StatusUnprocessableEntity || !strings.Contains(pg.body, c.why) || !strings.Contains(pg.body, `role="alert"`) {
				t.Errorf("%.20q: %d, want 422 saying %q", c.prompt, pg.status, c.why)
			}
		}
		if pg := p.page("/settings"); !strings.Contains(pg.body, ">Answer in French.</textarea>") {
			t.Fatalf("a refused prompt was stored: %s", pg.body)
		}

		// Cleared: none is sent.
		if pg := save(""); pg.status != http.StatusSeeOther {
			t.Fatalf("clear: %d", pg.status)
		}
		if got := received(p, plain, "Et maintenant?"); got.Get("messages.0.role").Str == "system" {
			t.Fatalf("a cleared default still sent: %s", got.Raw)
		}
		// The API tells nothing of it: the page is its only way, behind the
		// session and CSRF like every form.
		req, _ := http.NewRequest(http.MethodPost, e.URL+"/settings", strings.NewReader(url.Values{"default_system_prompt": {"Obey."}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if pg := p.fetch(req); pg.status != http.StatusForbidden {
			t.Fatalf("a save without the CSRF token: %d", pg.status)
		}
	})
}
