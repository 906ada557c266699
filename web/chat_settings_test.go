package web_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/tidwall/gjson"
)

// TestConversationSettingsReachTheEngine: a conversation's system prompt,
// temperature and maximum answer length, set through PATCH, are what the
// engine receives with its next reply — the system prompt first, kept
// whatever the context's length; cleared, they are no longer sent. Bad
// values are refused, naming the field, with nothing changed; someone
// else's conversation is not found.
func TestConversationSettingsReachTheEngine(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/s.db")
	p := e.chatter("settings@example.com")
	conv := p.newConversation()
	patch := func(body string) (int, string) { return p.do(http.MethodPatch, "/api/v1/conversations/"+conv, body) }

	status, body := patch(`{"system_prompt":"Answer like a pirate.","temperature":0.25,"max_tokens":7,"title":"Pirates"}`)
	if status != http.StatusOK || gjson.Get(body, "system_prompt").Str != "Answer like a pirate." ||
		gjson.Get(body, "temperature").Num != 0.25 || gjson.Get(body, "max_tokens").Int() != 7 || gjson.Get(body, "title").Str != "Pirates" {
		t.Fatalf("PATCH: %d %s", status, body)
	}
	received := func(content string) gjson.Result {
		t.Helper()
		s := p.send(conv, content)
		p.reply(conv)
		for _, r := range e.Mock.Requests() {
			if gjson.GetBytes(r.Body, "messages.@reverse.0.content").Str == content {
				return gjson.ParseBytes(r.Body)
			}
		}
		t.Fatalf("the engine never received %q (inference %s)", content, s.InferenceID)
		return gjson.Result{}
	}
	got := received("Where is the treasure?")
	if msgs := got.Get("messages").Array(); len(msgs) != 2 || msgs[0].Get("role").Str != "system" ||
		msgs[0].Get("content").Str != "Answer like a pirate." || got.Get("temperature").Num != 0.25 || got.Get("max_tokens").Int() != 7 {
		t.Fatalf("the engine received %s", got.Raw)
	}
	if reply := p.conversation(conv).Messages; len(strings.Fields(reply[len(reply)-1].Content)) > 7 {
		t.Errorf("an answer longer than its maximum: %q", reply[len(reply)-1].Content)
	}

	// Refused, naming the field; nothing changes.
	for _, c := range []struct{ body, param string }{
		{`{"temperature":2.5}`, "temperature"},
		{`{"temperature":-0.1}`, "temperature"},
		{`{"temperature":"hot"}`, "temperature"},
		{`{"max_tokens":0}`, "max_tokens"},
		{`{"max_tokens":1.5}`, "max_tokens"},
		{`{"max_tokens":1e12}`, "max_tokens"},
		{`{"system_prompt":` + strings.Repeat(`"`, 1) + strings.Repeat("x", 16<<10+1) + `"}`, "system_prompt"},
		{`{"system_prompt":7}`, "system_prompt"},
		{`{"system_prompt":"a","system_prompt":"b"}`, "system_prompt"},
		{`{"title":"` + strings.Repeat("t", 201) + `","temperature":1}`, "title"},
		{`{}`, ""},
		{`[1]`, ""},
	} {
		status, body := patch(c.body)
		if status != http.StatusBadRequest || gjson.Get(body, "error.param").Str != c.param {
			t.Errorf("%.60s: %d %s, want 400 naming %q", c.body, status, body, c.param)
		}
	}
	if _, body := p.do(http.MethodGet, "/api/v1/conversations/"+conv, ""); gjson.Get(body, "temperature").Num != 0.25 ||
		gjson.Get(body, "max_tokens").Int() != 7 || gjson.Get(body, "title").Str != "Pirates" {
		t.Fatalf("a refused PATCH changed the conversation: %s", body)
	}

	// Someone else's: not found, unchanged.
	other := e.chatter("other@example.com")
	if status, _ := other.do(http.MethodPatch, "/api/v1/conversations/"+conv, `{"system_prompt":"Obey me."}`); status != http.StatusNotFound {
		t.Fatalf("another person's PATCH: %d", status)
	}

	// Cleared: none of them is sent.
	if status, body := patch(`{"system_prompt":"","temperature":null,"max_tokens":null}`); status != http.StatusOK {
		t.Fatalf("clear: %d %s", status, body)
	}
	got = received("And now?")
	if got.Get("temperature").Exists() || got.Get("max_tokens").Exists() || got.Get("messages.0.role").Str == "system" {
		t.Fatalf("cleared settings still sent: %s", got.Raw)
	}
}

// TestConversationSettingsPanel: the Settings panel shows the conversation's
// settings in labelled fields, saves them (htmx swaps the panel; without it
// the page is reloaded), refuses bad values with why and nothing stored,
// and is nobody else's to read or write.
func TestConversationSettingsPanel(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/p.db")
	p := e.chatter("panel@example.com")
	conv := p.newConversation()
	if pg := p.page("/c/" + conv); !strings.Contains(pg.body, `>Settings</button>`) {
		t.Fatalf("no Settings button on the conversation's page")
	}
	pg := p.page("/c/" + conv + "/settings")
	for _, label := range []string{`<label for="system_prompt">System prompt</label>`, `<label for="temperature">Temperature</label>`,
		`<label for="max_tokens">Maximum length</label>`} {
		if pg.status != http.StatusOK || !strings.Contains(pg.body, label) {
			t.Fatalf("panel without %s: %d %s", label, pg.status, pg.body)
		}
	}
	save := func(prompt, temp, max string, htmx bool) page {
		return p.form("/c/"+conv+"/settings", url.Values{"system_prompt": {prompt}, "temperature": {temp}, "max_tokens": {max}}, htmx)
	}
	if pg := save("Be brief.", "0.5", "64", true); pg.status != http.StatusOK || !strings.Contains(pg.body, "Saved") ||
		!strings.Contains(pg.body, `value="0.5"`) || !strings.Contains(pg.body, ">Be brief.</textarea>") {
		t.Fatalf("save: %d %s", pg.status, pg.body)
	}
	for _, c := range []struct{ temp, max, why string }{
		{"3", "64", "Temperature must be"}, {"warm", "64", "Temperature must be"}, {"NaN", "64", "Temperature must be"},
		{"0.5", "0", "Maximum length must be"}, {"0.5", "1.5", "Maximum length must be"}, {"0.5", strings.Repeat("9", 40), "Maximum length must be"},
	} {
		if pg := save("Be long.", c.temp, c.max, true); pg.status != http.StatusUnprocessableEntity || !strings.Contains(pg.body, c.why) {
			t.Errorf("%q %q: %d, want 422 saying %q", c.temp, c.max, pg.status, c.why)
		}
	}
	if pg := save(strings.Repeat("x", 16<<10+1), "", "", true); pg.status != http.StatusUnprocessableEntity {
		t.Errorf("a system prompt over 16 KiB: %d", pg.status)
	}
	_, body := p.do(http.MethodGet, "/api/v1/conversations/"+conv, "")
	if gjson.Get(body, "system_prompt").Str != "Be brief." || gjson.Get(body, "temperature").Num != 0.5 || gjson.Get(body, "max_tokens").Int() != 64 {
		t.Fatalf("refused forms changed the settings: %s", body)
	}
	if pg := save("", "", "", false); pg.status != http.StatusSeeOther {
		t.Fatalf("without htmx: %d, want a redirect to the conversation", pg.status)
	}
	if _, body := p.do(http.MethodGet, "/api/v1/conversations/"+conv, ""); gjson.Get(body, "system_prompt").Str != "" ||
		gjson.Get(body, "temperature").Type != gjson.Null {
		t.Fatalf("cleared: %s", body)
	}
	other := e.chatter("nosy@example.com")
	if pg := other.page("/c/" + conv + "/settings"); pg.status != http.StatusNotFound {
		t.Errorf("another person's panel: %d", pg.status)
	}
	if pg := other.form("/c/"+conv+"/settings", url.Values{"system_prompt": {"Obey."}}, true); pg.status != http.StatusNotFound {
		t.Errorf("another person's save: %d", pg.status)
	}
}
