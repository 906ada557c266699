package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/models"
)

// tableOf is the HTML of the table with this id (its whole element).
func tableOf(t *testing.T, body, id string) string {
	t.Helper()
	i := strings.Index(body, `<table class="numbers" id="`+id+`"`)
	if i < 0 {
		i = strings.Index(body, `<table id="`+id+`"`)
	}
	if i < 0 {
		t.Fatalf("no table %q in the page", id)
	}
	j := strings.Index(body[i:], "</table>")
	return body[i : i+j]
}

// rowOf is the row of table whose tr carries attr="value" (value as the
// page would escape it); "" when there is none.
func rowOf(table, attr, value string) string {
	re := regexp.MustCompile(`(?s)<tr ` + regexp.QuoteMeta(attr+`="`+html.EscapeString(value)+`"`) + `[^>]*>(.*?)</tr>`)
	m := re.FindStringSubmatch(table)
	if m == nil {
		return ""
	}
	return m[1]
}

// cellValue is the data-value of the row's cell carrying attr="value".
func cellValue(t *testing.T, row, attr, value string) int64 {
	t.Helper()
	re := regexp.MustCompile(regexp.QuoteMeta(attr+`="`+value+`"`) + ` data-value="(-?\d+)"`)
	m := re.FindStringSubmatch(row)
	if m == nil {
		t.Fatalf("no cell %s=%q in row:\n%s", attr, value, row)
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n
}

// adminPage fetches path in browser c and fails unless it answers 200.
func (e *testEnv) adminPage(c *http.Client, path string) string {
	e.t.Helper()
	resp, body := e.fetch(noRedirects(c), http.MethodGet, path, nil, nil)
	if resp.StatusCode != http.StatusOK {
		e.t.Fatalf("GET %s: %d\n%s", path, resp.StatusCode, body)
	}
	return body
}

// sendAs sends a chat request with key and returns its inference id, the
// response read to its end.
func (e *testEnv) sendAs(key, body string, want int) string {
	e.t.Helper()
	resp := e.postWith(context.Background(), key, body)
	defer resp.Body.Close()
	text := readAll(e.t, resp.Body)
	if resp.StatusCode != want {
		e.t.Fatalf("POST %s: %d, want %d\n%s", body, resp.StatusCode, want, text)
	}
	return resp.Header.Get("X-Inference-Id")
}

// downBackend adds model "dead" on a backend nothing listens on.
func downBackend(c *config.Config) {
	c.Backends = append(c.Backends, backendDown())
	c.Models = append(c.Models, modelOn("dead", "down"))
}

// The dashboard shows the requests just made: by model and outcome, in the
// current hour's bucket, per person and key, and the rejected and failed
// ones with their reasons and key prefix. Expected numbers come from what
// was sent, or from the ledger's rows, never from the page itself.
func TestAdminDashboardCounts(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db", downBackend)
	admin := e.signedIn("ada@example.com", true)

	var ids []string
	for range 2 {
		ids = append(ids, e.sendAs(e.Key, chatBody, http.StatusOK))
	}
	ids = append(ids, e.sendAs(e.Key, `{"model":"m1","stream":true,"max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`, http.StatusOK))
	notFound := e.sendAs(e.Key, `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, http.StatusNotFound)
	unauthorized := e.sendAs("mj-not-a-key", chatBody, http.StatusUnauthorized)
	failed := e.sendAs(e.Key, `{"model":"dead","messages":[{"role":"user","content":"hi"}]}`, http.StatusBadGateway)
	ids = append(ids, notFound, unauthorized, failed)
	var rows []*models.Usage
	for _, id := range ids {
		rows = append(rows, e.final(id))
	}
	var prompt, completion, ttft, owned int64
	for _, r := range rows {
		if r.Model == "m1" {
			prompt += int64(r.PromptTokens)
			completion += int64(r.CompletionTokens)
			if r.TTFTMs != nil {
				ttft++
			}
		}
		if r.UserID != nil {
			owned++
		}
	}
	if prompt == 0 || completion == 0 || ttft == 0 {
		t.Fatalf("the requests left no tokens or TTFT: %d %d %d", prompt, completion, ttft)
	}

	body := e.adminPage(admin, "/admin")
	totals := tableOf(t, body, "model-totals")
	m1 := rowOf(totals, "data-model", "m1")
	if got := cellValue(t, m1, "data-outcome", "success"); got != 3 {
		t.Errorf("m1 successes = %d, want 3", got)
	}
	if got := cellValue(t, m1, "data-field", "prompt_tokens"); got != prompt {
		t.Errorf("m1 prompt tokens = %d, want %d (the ledger's)", got, prompt)
	}
	if got := cellValue(t, m1, "data-field", "completion_tokens"); got != completion {
		t.Errorf("m1 completion tokens = %d, want %d", got, completion)
	}
	if got := cellValue(t, rowOf(totals, "data-model", models.UnknownModel), "data-outcome", "rejected"); got != 1 {
		t.Errorf("rejected requests for an unknown model = %d, want 1", got)
	}
	if got := cellValue(t, rowOf(totals, "data-model", ""), "data-outcome", "rejected"); got != 1 {
		t.Errorf("rejected requests without a model (bad key) = %d, want 1", got)
	}
	if got := cellValue(t, rowOf(totals, "data-model", "dead"), "data-outcome", "error"); got != 1 {
		t.Errorf("errors on the dead backend = %d, want 1", got)
	}
	if got := cellValue(t, rowOf(totals, "data-total", "true"), "data-field", "requests"); got != int64(len(ids)) {
		t.Errorf("total requests = %d, want %d", got, len(ids))
	}

	// The current hour's bucket holds them all.
	hour := rows[0].CreatedAt.UTC().Truncate(time.Hour).Format(time.RFC3339)
	bucket := rowOf(tableOf(t, body, "requests-table"), "data-bucket", hour)
	if got := cellValue(t, bucket, "data-outcome", "success"); got != 3 {
		t.Errorf("successes in the %s bucket = %d, want 3", hour, got)
	}
	if got := cellValue(t, bucket, "data-outcome", "rejected"); got != 2 {
		t.Errorf("rejections in the %s bucket = %d, want 2", hour, got)
	}
	if n := strings.Count(tableOf(t, body, "requests-table"), "<tr data-bucket="); n != 24 {
		t.Errorf("the 24 h chart's table has %d rows, want 24", n)
	}
	if got := cellValue(t, rowOf(tableOf(t, body, "tokens-table"), "data-bucket", hour), "data-model", "m1"); got != prompt+completion {
		t.Errorf("m1 tokens in the bucket = %d, want %d", got, prompt+completion)
	}

	// The charts' JSON carries the same numbers.
	var charts struct {
		Labels []string
		Charts []struct {
			Canvas string
			Series []struct {
				Key  string
				Data []int64
			}
		}
	}
	js := regexp.MustCompile(`(?s)<script id="usage-chart-data" type="application/json">(.*?)</script>`).FindStringSubmatch(body)
	if js == nil || json.Unmarshal([]byte(js[1]), &charts) != nil || len(charts.Labels) != 24 || len(charts.Charts) != 2 {
		t.Fatalf("chart data: %v", js)
	}
	var successes int64
	for _, s := range charts.Charts[0].Series {
		if s.Key == "success" {
			for _, v := range s.Data {
				successes += v
			}
		}
	}
	if successes != 3 {
		t.Errorf("the requests chart counts %d successes, want 3", successes)
	}

	// Latencies: every m1 request reached admission; the stream had a TTFT.
	lat := rowOf(tableOf(t, body, "latencies"), "data-model", "m1")
	if got := cellValue(t, lat, "data-field", "queue_count"); got != 3 {
		t.Errorf("m1 queue waits counted = %d, want 3", got)
	}
	if got := cellValue(t, lat, "data-field", "ttft_count"); got != ttft {
		t.Errorf("m1 TTFTs counted = %d, want %d", got, ttft)
	}

	// Top people and keys: the key's owner made every request with a user.
	if got := cellValue(t, rowOf(tableOf(t, body, "top-users"), "data-user", "owner@example.com"), "data-field", "requests"); got != owned {
		t.Errorf("owner's requests = %d, want %d", got, owned)
	}
	key := keyOf(t, e, "owner@example.com")
	keyRow := rowOf(tableOf(t, body, "key-totals"), "data-key", strconv.FormatUint(uint64(key.ID), 10))
	if !strings.Contains(keyRow, key.Prefix+"…") || !strings.Contains(keyRow, "owner@example.com") {
		t.Errorf("top keys row lacks the prefix or owner:\n%s", keyRow)
	}
	if got := cellValue(t, keyRow, "data-field", "requests"); got != owned {
		t.Errorf("key's requests = %d, want %d", got, owned)
	}

	// Recent rejections and errors, with reason, status and key prefix.
	rej := tableOf(t, body, "rejected")
	for id, want := range map[string][]string{
		notFound:     {`data-reason="model_not_found" data-status="404"`, key.Prefix + "…", "owner@example.com"},
		unauthorized: {`data-reason="unauthorized" data-status="401"`, "(unknown)"},
	} {
		row := regexp.MustCompile(`(?s)<tr data-inference-id="` + id + `"[^>]*>.*?</tr>`).FindString(rej)
		for _, w := range want {
			if !strings.Contains(row, w) {
				t.Errorf("rejection %s lacks %q:\n%s", id, w, row)
			}
		}
	}
	errs := tableOf(t, body, "errors")
	if !strings.Contains(errs, `data-inference-id="`+failed+`" data-reason="`+rows[len(rows)-1].Reason+`"`) || rows[len(rows)-1].Reason == "" {
		t.Errorf("the failed request is not among the errors with its reason %q:\n%s", rows[len(rows)-1].Reason, errs)
	}

	// The 30-day range: 30 daily buckets, today's holding the same requests.
	body = e.adminPage(admin, "/admin?range=30d")
	day := rows[0].CreatedAt.UTC().Truncate(24 * time.Hour).Format(time.RFC3339)
	reqs := tableOf(t, body, "requests-table")
	if n := strings.Count(reqs, "<tr data-bucket="); n != 30 {
		t.Errorf("the 30 d table has %d rows, want 30", n)
	}
	if got := cellValue(t, rowOf(reqs, "data-bucket", day), "data-outcome", "success"); got != 3 {
		t.Errorf("successes today = %d, want 3", got)
	}
	if !strings.Contains(body, `href="/admin?range=30d" aria-current="page"`) {
		t.Error("the 30 days link is not marked current")
	}
}

func keyOf(t *testing.T, e *testEnv, email string) models.APIKey {
	t.Helper()
	u, err := models.UserByEmail(context.Background(), e.DB, email)
	if err != nil {
		t.Fatal(err)
	}
	var k models.APIKey
	if err := e.DB.Where("user_id = ?", u.ID).Order("id").First(&k).Error; err != nil {
		t.Fatal(err)
	}
	return k
}

// A range the page does not know is the default, never an error, and
// nothing of it is echoed; model names a caller chose are escaped in the
// tables and in the charts' JSON, and however many there are, the page
// shows a bounded number of them.
func TestAdminDashboardHostileInput(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	admin := e.signedIn("ada@example.com", true)
	for _, r := range []string{"", "7d", "<script>alert(1)</script>", "30d%00", "24h'--", strings.Repeat("x", 2000), "%ZZ", "30D"} {
		body := e.adminPage(admin, "/admin?range="+url.QueryEscape(r))
		if n := strings.Count(tableOf(t, body, "requests-table"), "<tr data-bucket="); n != 24 {
			t.Errorf("range %.40q: %d rows, want the default 24", r, n)
		}
		if strings.Contains(body, "alert(1)") || strings.Contains(body, strings.Repeat("x", 100)) {
			t.Errorf("range %.40q is echoed in the page", r)
		}
		// Nothing used yet: the token chart has no series, as a list.
		if strings.Contains(body, `"series":null`) || !strings.Contains(body, `"series":[]`) {
			t.Errorf("an empty chart's series are not an empty list")
		}
	}
	// A repeated parameter is read once.
	body := e.adminPage(admin, "/admin?range=30d&range=24h")
	if n := strings.Count(tableOf(t, body, "requests-table"), "<tr data-bucket="); n != 30 && n != 24 {
		t.Errorf("repeated range: %d rows", n)
	}

	hostile := []string{`<img src=x onerror=alert(1)>`, `</script><script>alert(2)</script>`, `"><svg onload=alert(3)>`}
	var names []string
	names = append(names, hostile...)
	for i := range 10 {
		names = append(names, fmt.Sprintf("unknown-%02d", i))
	}
	var last string
	for _, m := range names {
		b, _ := json.Marshal(map[string]any{"model": m, "messages": []map[string]string{{"role": "user", "content": "x"}}})
		last = e.sendAs(e.Key, string(b), http.StatusNotFound)
	}
	e.final(last)
	body = e.adminPage(admin, "/admin")
	for _, bad := range []string{"<img src=x", "<script>alert(2)", "<svg onload"} {
		if strings.Contains(body, bad) {
			t.Errorf("the page carries %q unescaped", bad)
		}
	}
	if !strings.Contains(body, "&lt;img src=x onerror=alert(1)&gt;") {
		t.Error("the hostile model name is not shown, escaped")
	}
	// Invented model names are one row, whatever their number: the
	// rollups count them under models.UnknownModel.
	totals := tableOf(t, body, "model-totals")
	if n := strings.Count(totals, "<tr data-model="); n != 1 {
		t.Errorf("%d models listed, want the one for unknown models", n)
	}
	if got := cellValue(t, rowOf(totals, "data-model", models.UnknownModel), "data-outcome", "rejected"); got != int64(len(names)) {
		t.Errorf("unknown models' rejections = %d, want %d", got, len(names))
	}
	if got := cellValue(t, rowOf(totals, "data-total", "true"), "data-field", "requests"); got != int64(len(names)) {
		t.Errorf("total = %d, want %d", got, len(names))
	}
	// The recent rejections are bounded too, newest first.
	if n := strings.Count(tableOf(t, body, "rejected"), "<tr data-inference-id="); n != len(names) {
		t.Errorf("%d recent rejections listed, want %d", n, len(names))
	}
	for range 10 {
		last = e.sendAs(e.Key, `{"model":"again","messages":[{"role":"user","content":"x"}]}`, http.StatusNotFound)
	}
	e.final(last)
	rej := tableOf(t, e.adminPage(admin, "/admin"), "rejected")
	if n := strings.Count(rej, "<tr data-inference-id="); n != 20 {
		t.Errorf("%d recent rejections listed, want the newest 20", n)
	}
	if first := regexp.MustCompile(`<tr data-inference-id="([^"]+)"`).FindStringSubmatch(rej); first == nil || first[1] != last {
		t.Error("the newest rejection is not first")
	}
}

// Only admins see the dashboard and its live fragment; nobody signed out does.
func TestAdminDashboardGuards(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	person := e.signedIn("pat@example.com", false)
	for _, path := range []string{"/admin", "/admin/backends", "/admin?range=30d"} {
		if resp, _ := e.fetch(noRedirects(person), http.MethodGet, path, nil, nil); resp.StatusCode != http.StatusForbidden {
			t.Errorf("a non-admin got %d on %s, want 403", resp.StatusCode, path)
		}
		resp, body := e.fetch(noRedirects(browser(t)), http.MethodGet, path, nil, map[string]string{"Authorization": "Bearer " + e.Key})
		if resp.StatusCode == http.StatusOK || strings.Contains(body, "backends") {
			t.Errorf("a key opened %s: %d", path, resp.StatusCode)
		}
	}
}

// The live fragment shows a backend's slots and queue as they fill: with
// one slot and slow answers, the second and third requests wait.
func TestAdminBackendsLive(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db", limits(1, 4, 30*time.Second), downBackend)
	admin := e.signedIn("ada@example.com", true)
	// Every backend, in configuration order, with its kind and models.
	first := e.adminPage(admin, "/admin/backends")
	mock, down := strings.Index(first, `data-backend="mock"`), strings.Index(first, `data-backend="down"`)
	if mock < 0 || down < mock || !strings.Contains(first[mock:down], "m1, renamed") || !strings.Contains(first[down:], "openai") {
		t.Fatalf("backends not listed in order with kinds and models:\n%s", first)
	}
	backend := func() string {
		t.Helper()
		body := e.adminPage(admin, "/admin/backends")
		if !strings.HasPrefix(body, `<div id="backends"`) || strings.Contains(body, "<html") ||
			!strings.Contains(body, `hx-get="/admin/backends" hx-trigger="every 2s" hx-swap="outerHTML"`) {
			t.Fatalf("not a fragment that polls and replaces itself:\n%s", body)
		}
		return regexp.MustCompile(`<tr data-backend="mock"[^>]*>`).FindString(body)
	}
	if row := backend(); !strings.Contains(row, `data-in-flight="0" data-max-concurrency="1" data-queued="0" data-max-queue="4" data-oldest-wait-ms="0"`) {
		t.Fatalf("idle backend: %s", row)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"x"}],"mock":{"tag":"w%d","tokens":2000,"tps":5}}`, i)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.URL+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+e.Key)
			req.Header.Set("Content-Type", "application/json")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = readAllQuiet(resp)
			}
		}()
	}
	waitRow := func(what string, ok func(string) bool) string {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			row := backend()
			if ok(row) {
				return row
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the fragment still shows %s", what, row)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitRow("one running, two queued", func(r string) bool {
		return strings.Contains(r, `data-in-flight="1" data-max-concurrency="1" data-queued="2" data-max-queue="4"`)
	})
	// Both waiters were queued before that answer; 20 ms on, the oldest
	// has waited at least that long (the answers take minutes to finish).
	time.Sleep(20 * time.Millisecond)
	row := backend()
	m := regexp.MustCompile(`data-queued="(\d+)" data-max-queue="4" data-oldest-wait-ms="(\d+)"`).FindStringSubmatch(row)
	if m == nil || m[1] != "2" {
		t.Fatalf("the queue changed on its own: %s", row)
	}
	if waited, _ := strconv.Atoi(m[2]); waited < 20 {
		t.Errorf("the oldest request has waited %d ms, want at least 20: %s", waited, row)
	}
	if body := e.adminPage(admin, "/admin"); !strings.Contains(body, `data-queued="2"`) {
		t.Error("the dashboard's first drawing of the fragment does not show the queue")
	}
	cancel()
	wg.Wait()
	waitRow("the clients left", func(r string) bool {
		return strings.Contains(r, `data-in-flight="0"`) && strings.Contains(r, `data-queued="0"`)
	})
}

func readAllQuiet(resp *http.Response) ([]byte, error) {
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return []byte(b.String()), err
		}
	}
}
