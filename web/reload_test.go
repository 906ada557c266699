package web_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"moonji/internal/audit"
	"moonji/internal/config"
	"moonji/internal/mockllm"
	"moonji/internal/reload"
	"moonji/models"
	"moonji/web"
)

// mockEngine is a mock engine on a port of its own.
func mockEngine(t *testing.T) (*mockllm.Server, string) {
	t.Helper()
	m := mockllm.New(mockllm.Options{Models: []string{"m1", "m2"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ts := httptest.NewServer(m)
	t.Cleanup(ts.Close)
	return m, ts.URL + "/v1"
}

// reloadEnv is a gateway started from a configuration file.
type reloadEnv struct {
	*testEnv
	path string
	head string // the file's first lines: listen, database_url
}

// startFromFile starts a gateway from a file holding head + body, as
// `moonji serve -config` does.
func startFromFile(t *testing.T, dbURL, body string) *reloadEnv {
	t.Helper()
	ln, err := netListen()
	if err != nil {
		t.Fatal(err)
	}
	head := fmt.Sprintf("listen: %q\ndatabase_url: %q\njournal_dir: %q\n", ln.Addr().String(), dbURL, t.TempDir())
	path := filepath.Join(t.TempDir(), "moonji.yaml")
	raw := []byte(head + body)
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse(raw, path)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := web.New(context.Background(), cfg, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	srv.UseConfigFile(path, raw)
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown(2 * time.Second) })
	e := &testEnv{t: t, srv: srv, URL: "http://" + ln.Addr().String(), DB: srv.DB}
	e.Key = e.newKey("owner@example.com", 0)
	return &reloadEnv{testEnv: e, path: path, head: head}
}

// write replaces the file's body.
func (r *reloadEnv) write(body string) {
	r.t.Helper()
	if err := os.WriteFile(r.path, []byte(r.head+body), 0o600); err != nil {
		r.t.Fatal(err)
	}
}

// readyVersion is /readyz's config_version.
func readyVersion(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/readyz")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var v struct {
		ConfigVersion string `json:"config_version"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&v)
	return v.ConfigVersion
}

func auditRows(t *testing.T, e *testEnv, action string) []models.AuditEvent {
	t.Helper()
	var rows []models.AuditEvent
	if err := e.DB.Where("action = ?", action).Order("id").Find(&rows).Error; err != nil {
		t.Fatal(err)
	}
	return rows
}

func backendsYAML(a, b string) string {
	return fmt.Sprintf(`rate_limit: {requests_per_minute: 100000}
backends:
  - {name: a, url: %q, max_concurrency: 8}
  - {name: b, url: %q, max_concurrency: 8}
`, a, b)
}

// TestReloadMovesModelKeepsStream: after a reload moves m1 from backend a
// to backend b, new requests reach b while a stream that started on a
// finishes there, with its one usage row; the version changes; the reload
// is audited.
func TestReloadMovesModelKeepsStream(t *testing.T) {
	eachDatabase(t, func(t *testing.T, dbURL string) {
		mockA, urlA := mockEngine(t)
		mockB, urlB := mockEngine(t)
		e := startFromFile(t, dbURL, `rate_limit: {requests_per_minute: 100000}
backends:
  - {name: a, url: "`+urlA+`", max_concurrency: 8}
models:
  - {name: m1, backend: a}
`)
		v1 := readyVersion(t, e.URL)
		if len(v1) != 12 {
			t.Fatalf("config_version %q, want 12 hex digits", v1)
		}
		// A stream that lasts: 10 tokens at 5 a second.
		resp := e.post(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}],"mock":{"tps":5,"tokens":10,"tag":"old"}}`)
		defer resp.Body.Close()
		id := resp.Header.Get("X-Inference-Id")
		br := bufio.NewReader(resp.Body)
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatalf("first frame: %v", err)
		}

		e.write(`rate_limit: {requests_per_minute: 100000}
backends:
  - {name: b, url: "` + urlB + `", max_concurrency: 8}
models:
  - {name: m1, backend: b}
`)
		res, err := e.srv.Reload(context.Background(), reload.By{Actor: "system"})
		if err != nil {
			t.Fatalf("reload: %v", err)
		}
		if res.New.ID == v1 || readyVersion(t, e.URL) != res.New.ID {
			t.Fatalf("version %s → %s, /readyz says %s", v1, res.New.ID, readyVersion(t, e.URL))
		}

		r2 := e.post(`{"model":"m1","messages":[{"role":"user","content":"hi"}],"mock":{"tag":"new"}}`)
		body := readAll(t, r2.Body)
		r2.Body.Close()
		if r2.StatusCode != http.StatusOK {
			t.Fatalf("after the reload: %d %s", r2.StatusCode, body)
		}
		if n := len(tagged(mockB, "new")); n != 1 {
			t.Fatalf("backend b saw %d requests tagged new, want 1", n)
		}
		if n := len(tagged(mockA, "new")); n != 0 {
			t.Fatalf("backend a saw %d new requests after the reload", n)
		}

		rest, err := io.ReadAll(br)
		if err != nil || !strings.Contains(string(rest), "[DONE]") {
			t.Fatalf("the old stream was cut: %v\n%s", err, rest)
		}
		row := e.final(id)
		if row.Backend != "a" || row.Outcome != models.OutcomeSuccess {
			t.Fatalf("old stream's row: backend %s outcome %s, want a, success", row.Backend, row.Outcome)
		}
		var n int64
		e.DB.Model(&models.Usage{}).Where("inference_id = ?", id).Count(&n)
		if n != 1 {
			t.Fatalf("%d rows for the old stream, want 1", n)
		}
		rows := auditRows(t, e.testEnv, audit.ConfigReload)
		if len(rows) != 1 || rows[0].Actor != "system" || rows[0].Target != e.path ||
			!strings.Contains(rows[0].Detail, v1+" → "+res.New.ID) || !strings.Contains(rows[0].Detail, "models changed: m1") {
			t.Fatalf("audit rows %+v", rows)
		}
		var rep models.Replica
		if err := e.DB.Where("config_version = ?", res.New.ID).Take(&rep).Error; err != nil {
			t.Fatalf("the replica row does not hold the new version: %v", err)
		}
	})
}

func tagged(m *mockllm.Server, tag string) []mockllm.Record {
	var out []mockllm.Record
	for _, r := range m.Requests() {
		if r.Tag == tag {
			out = append(out, r)
		}
	}
	return out
}

// TestReloadBadFileChangesNothing: a YAML error, an unknown backend, an
// unreadable file: each is refused with its reason, counted and audited,
// and the gateway serves on as before.
func TestReloadBadFileChangesNothing(t *testing.T) {
	_, urlA := mockEngine(t)
	e := startFromFile(t, "sqlite://"+t.TempDir()+"/m.db", `backends:
  - {name: a, url: "`+urlA+`"}
models:
  - {name: m1, backend: a}
`)
	v1 := readyVersion(t, e.URL)
	for _, c := range []struct{ body, want string }{
		{"backends: [oops\n", "yaml"},
		{"backends:\n  - {name: a, url: \"" + urlA + "\"}\nmodels:\n  - {name: m1, backend: ghost}\n", `unknown backend "ghost"`},
		{"backends:\n  - {name: a, url: \"" + urlA + "\", max_concurrency: -3}\nmodels:\n  - {name: m1, backend: a}\n", "max_concurrency"},
	} {
		e.write(c.body)
		_, err := e.srv.Reload(context.Background(), reload.By{Actor: "system"})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("reload of %q: %v, want an error naming %q", c.body, err, c.want)
		}
	}
	if err := os.Remove(e.path); err != nil {
		t.Fatal(err)
	}
	if _, err := e.srv.Reload(context.Background(), reload.By{Actor: "system"}); err == nil || !strings.Contains(err.Error(), "read the configuration") {
		t.Fatalf("reload of a missing file: %v", err)
	}
	if v := readyVersion(t, e.URL); v != v1 {
		t.Fatalf("version changed to %s after refused reloads", v)
	}
	resp := e.post(`{"model":"m1","messages":[{"role":"user","content":"hi"}]}`)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("after refused reloads: %d", resp.StatusCode)
	}
	if rows := auditRows(t, e.testEnv, audit.ConfigRejected); len(rows) != 4 || !strings.Contains(rows[1].Detail, "ghost") {
		t.Fatalf("rejection audit rows: %+v", rows)
	}
	mresp, err := http.Get(e.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics := readAll(t, mresp.Body)
	mresp.Body.Close()
	if !strings.Contains(metrics, `moonji_config_reloads_total{result="rejected"} 4`) {
		t.Fatalf("metrics do not count 4 rejected reloads")
	}
}

// TestReloadLimitAndRestartOnly: a lower max_concurrency applies at once
// (the dashboard's limit), a raised one serves the requests that queued
// under the old one, and a changed listen address is named as needing a
// restart while the rest applies.
func TestReloadLimitAndRestartOnly(t *testing.T) {
	_, urlA := mockEngine(t)
	e := startFromFile(t, "sqlite://"+t.TempDir()+"/m.db", `rate_limit: {requests_per_minute: 100000}
backends:
  - {name: a, url: "`+urlA+`", max_concurrency: 1, max_queue: 4}
models:
  - {name: m1, backend: a}
`)
	// One stream holds the only slot; a second request queues behind it.
	long := e.post(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"hi"}],"mock":{"tps":2,"tokens":40}}`)
	defer long.Body.Close()
	done := make(chan int, 1)
	go func() {
		r := e.post(`{"model":"m1","messages":[{"role":"user","content":"hi"}]}`)
		r.Body.Close()
		done <- r.StatusCode
	}()
	waitFor(t, "a request queued", 5*time.Second, func() bool { return e.srv.Scheduler.Snapshot("a").Queued == 1 })
	e.write(`rate_limit: {requests_per_minute: 100000}
backends:
  - {name: a, url: "` + urlA + `", max_concurrency: 2, max_queue: 4}
models:
  - {name: m1, backend: a}
`)
	if _, err := e.srv.Reload(context.Background(), reload.By{Actor: "system"}); err != nil {
		t.Fatal(err)
	}
	if code := <-done; code != http.StatusOK {
		t.Fatalf("the queued request, served under the new limit: %d", code)
	}
	if got := e.srv.Scheduler.Snapshot("a").MaxConcurrency; got != 2 {
		t.Fatalf("max_concurrency %d after the reload, want 2", got)
	}
	e.head = strings.Replace(e.head, "listen: ", "listen: \"127.0.0.1:1\"\n# was: ", 1)
	e.write(`rate_limit: {requests_per_minute: 100000}
backends:
  - {name: a, url: "` + urlA + `", max_concurrency: 3, max_queue: 4}
models:
  - {name: m1, backend: a}
`)
	res, err := e.srv.Reload(context.Background(), reload.By{Actor: "system"})
	if err != nil {
		t.Fatal(err)
	}
	// replica_id and public_url default from listen: they change with it.
	if strings.Join(res.Changes.Restart, ",") != "listen,replica_id,public_url" || e.srv.Scheduler.Snapshot("a").MaxConcurrency != 3 {
		t.Fatalf("restart-only %v, max_concurrency %d: want listen (and what follows it) and 3 applied", res.Changes.Restart,
			e.srv.Scheduler.Snapshot("a").MaxConcurrency)
	}
}

// TestReloadAdminButton: an admin's POST /admin/reload reloads and says
// what changed, audited with their email and address; a refused file is
// shown as an error (422); a non-admin and a form without its CSRF token
// reload nothing.
func TestReloadAdminButton(t *testing.T) {
	_, urlA := mockEngine(t)
	_, urlB := mockEngine(t)
	e := startFromFile(t, "sqlite://"+t.TempDir()+"/m.db", backendsYAML(urlA, urlB)+"models:\n  - {name: m1, backend: a}\n")
	v1 := readyVersion(t, e.URL)
	e.write(backendsYAML(urlA, urlB) + "models:\n  - {name: m1, backend: a}\n  - {name: m2, backend: b}\n")

	person := e.signedIn("someone@example.com", false)
	_, m := e.me(person)
	resp, _ := e.fetch(person, http.MethodPost, "/admin/reload", url.Values{"_csrf": {m.CSRFToken}}, nil)
	if resp.StatusCode != http.StatusForbidden || readyVersion(t, e.URL) != v1 {
		t.Fatalf("a non-admin's reload: %d, version %s", resp.StatusCode, readyVersion(t, e.URL))
	}
	admin := e.signedIn("boss@example.com", true)
	resp, _ = e.fetch(admin, http.MethodPost, "/admin/reload", url.Values{}, nil)
	if resp.StatusCode != http.StatusForbidden || readyVersion(t, e.URL) != v1 {
		t.Fatalf("a reload without the CSRF token: %d", resp.StatusCode)
	}
	_, m = e.me(admin)
	resp, page := e.fetch(admin, http.MethodPost, "/admin/reload", url.Values{"_csrf": {m.CSRFToken}}, nil)
	v2 := readyVersion(t, e.URL)
	if resp.StatusCode != http.StatusOK || v2 == v1 || !strings.Contains(page, "models added: m2") || !strings.Contains(page, v2) {
		t.Fatalf("the admin's reload: %d, version %s → %s\n%s", resp.StatusCode, v1, v2, page)
	}
	rows := auditRows(t, e.testEnv, audit.ConfigReload)
	if len(rows) != 1 || rows[0].Actor != "boss@example.com" || rows[0].ActorID == 0 || rows[0].Address == "" {
		t.Fatalf("audit rows %+v", rows)
	}
	r := e.post(`{"model":"m2","messages":[{"role":"user","content":"hi"}]}`)
	r.Body.Close()
	if r.StatusCode != http.StatusOK {
		t.Fatalf("the model the reload added: %d", r.StatusCode)
	}

	e.write("models: [\n")
	resp, page = e.fetch(admin, http.MethodPost, "/admin/reload", url.Values{"_csrf": {m.CSRFToken}}, nil)
	if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(page, "yaml") || readyVersion(t, e.URL) != v2 {
		t.Fatalf("a bad file from the button: %d\n%s", resp.StatusCode, page)
	}
	_, page = e.fetch(admin, http.MethodGet, "/admin", nil, nil)
	if !strings.Contains(page, `id="replica-versions"`) || !strings.Contains(page, v2) {
		t.Fatalf("/admin does not list the replicas' versions:\n%s", page)
	}
}
