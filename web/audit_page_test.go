package web_test

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"moonji/internal/audit"
	"moonji/models"
)

// seedAudit appends n events, one a minute from t0: key.create by
// a@example.com for even i, team.create by b@example.com for odd i, target
// "thing i". The last one's actor starts with "=" (a formula).
func seedAudit(t *testing.T, e *testEnv, n int, t0 time.Time) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < n; i++ {
		ev := models.AuditEvent{At: t0.Add(time.Duration(i) * time.Minute), ActorID: 1, Actor: "a@example.com",
			Action: audit.KeyCreate, Target: fmt.Sprintf("thing %d", i), Address: "10.0.0.1", Detail: "rpm 1"}
		if i%2 == 1 {
			ev.Actor, ev.Action = "b@example.com", audit.TeamCreate
		}
		if i == n-1 {
			ev.Actor, ev.Detail = `=HYPERLINK("http://evil")`, "+1-2"
		}
		if err := models.InsertAuditEvent(ctx, e.DB, &ev); err != nil {
			t.Fatal(err)
		}
	}
}

var (
	reAuditRow   = regexp.MustCompile(`<tr data-action="([a-z._]+)">`)
	reAuditOlder = regexp.MustCompile(`href="(/admin/audit\?[^"]*before=\d+[^"]*)" rel="next"`)
)

// TestAuditPage is /admin/audit over real HTTP: admins only, newest first,
// each filter, keyset pages that neither skip nor repeat an event, hostile
// filter values refused with 400, and the export's CSV and JSONL, whose
// formula-like cells are neutralised.
func TestAuditPage(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db string) {
		e := startEnv(t, db)
		t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		seedAudit(t, e, 130, t0)
		admin := e.signedIn("auditor@example.com", true)
		person := e.signedIn("person@example.com", false)

		// A non-admin gets what every admin page gives them: 403, nothing listed.
		for _, path := range []string{"/admin/audit", "/admin/audit/export?format=csv"} {
			resp, body := e.fetch(person, http.MethodGet, path, nil, nil)
			if resp.StatusCode != http.StatusForbidden || strings.Contains(body, "thing 1") {
				t.Fatalf("non-admin %s: %d\n%s", path, resp.StatusCode, body)
			}
		}

		// Newest first, 50 a page, every page once: 130 seeded + 2 sign-ins.
		resp, body := e.fetch(admin, http.MethodGet, "/admin/audit", nil, nil)
		if resp.StatusCode != http.StatusOK || !strings.Contains(body, `aria-current="page">Audit log`) ||
			!strings.Contains(body, "<label>") || !strings.Contains(body, `value="signin.failed"`) {
			t.Fatalf("page: %d\n%s", resp.StatusCode, body)
		}
		seen := map[string]bool{}
		pages := 0
		for {
			pages++
			rows := reAuditRow.FindAllStringSubmatch(body, -1)
			for _, m := range regexp.MustCompile(`thing \d+`).FindAllString(body, -1) {
				if seen[m] {
					t.Fatalf("%s on two pages", m)
				}
				seen[m] = true
			}
			if pages == 1 && (len(rows) != 50 || rows[0][1] != audit.SignIn) {
				t.Fatalf("first page: %d rows, first %v", len(rows), rows[0])
			}
			next := reAuditOlder.FindStringSubmatch(body)
			if next == nil {
				break
			}
			_, body = e.fetch(admin, http.MethodGet, strings.ReplaceAll(next[1], "&amp;", "&"), nil, nil)
		}
		if pages != 3 || len(seen) != 130 {
			t.Fatalf("%d pages, %d events seen", pages, len(seen))
		}

		// Filters: action, actor, target, dates, and all at once.
		count := func(q url.Values) int {
			t.Helper()
			q.Set("limit", "200")
			resp, body := e.fetch(admin, http.MethodGet, "/admin/audit?"+q.Encode(), nil, nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("filter %v: %d\n%s", q, resp.StatusCode, body)
			}
			return len(reAuditRow.FindAllString(body, -1))
		}
		for _, c := range []struct {
			q    url.Values
			want int
		}{
			{url.Values{"action": {audit.TeamCreate}}, 65},
			{url.Values{"actor": {"B@EXAMPLE"}}, 64}, // the last odd one is the formula's
			{url.Values{"actor": {"%"}}, 0},          // a wildcard is a character
			{url.Values{"target": {"thing 12"}}, 11}, // 12, 120…129
			{url.Values{"from": {"2026-03-01"}, "to": {"2026-03-01"}}, 130},
			{url.Values{"from": {"2026-03-02"}}, 2}, // the sign-ins, today
			{url.Values{"to": {"2026-02-28"}}, 0},
			{url.Values{"action": {audit.KeyCreate}, "actor": {"a@"}, "target": {"thing 1"}, "from": {"2026-03-01"}}, 20},
		} {
			if got := count(c.q); got != c.want {
				t.Errorf("filter %v: %d events, want %d", c.q, got, c.want)
			}
		}

		// Hostile values: 400 with a sentence, on the page and the export.
		for _, q := range []string{
			"action=drop+table", "action=" + strings.Repeat("a", 1000), "actor=" + strings.Repeat("x", 400),
			"target=" + strings.Repeat("%C3%A9", 400), "from=2026-13-01", "from=yesterday", "to=" + strings.Repeat("9", 100),
			"from=2026-03-02&to=2026-03-01", "before=-1", "before=99999999999999999999999", "before=abc", "limit=0", "limit=100000",
			"from=0001-01-01",
		} {
			resp, body := e.fetch(admin, http.MethodGet, "/admin/audit?"+q, nil, nil)
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, `role="alert"`) || strings.Contains(body, "thing 1") {
				t.Errorf("page ?%.60s: %d\n%.400s", q, resp.StatusCode, body)
			}
			if q == "limit=0" || q == "limit=100000" {
				continue // the export has no pages
			}
			resp, body = e.fetch(admin, http.MethodGet, "/admin/audit/export?format=csv&"+q, nil, nil)
			if resp.StatusCode != http.StatusBadRequest || strings.Contains(body, "thing") {
				t.Errorf("export ?%.60s: %d %.200s", q, resp.StatusCode, body)
			}
		}
		for _, f := range []string{"", "xml", "CSV", strings.Repeat("c", 1000)} {
			if resp, _ := e.fetch(admin, http.MethodGet, "/admin/audit/export?format="+f, nil, nil); resp.StatusCode != http.StatusBadRequest {
				t.Errorf("format %.20q: %d", f, resp.StatusCode)
			}
		}

		// CSV: a download, every event with the filter, formula cells quoted.
		resp, body = e.fetch(admin, http.MethodGet, "/admin/audit/export?format=csv&from=2026-03-01&to=2026-03-01", nil, nil)
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Disposition"), `attachment; filename="moonji-audit-`) ||
			!strings.HasPrefix(resp.Header.Get("Content-Type"), "text/csv") {
			t.Fatalf("csv: %d %v", resp.StatusCode, resp.Header)
		}
		recs, err := csv.NewReader(strings.NewReader(body)).ReadAll()
		if err != nil || len(recs) != 131 || strings.Join(recs[0], ",") != strings.Join(audit.Fields, ",") {
			t.Fatalf("csv: %v, %d records, header %v", err, len(recs), recs[0])
		}
		newest := recs[1]
		if newest[4] != `'=HYPERLINK("http://evil")` || newest[8] != "'+1-2" || newest[2] != audit.KeyCreate && newest[2] != audit.TeamCreate {
			t.Errorf("newest row, formulas not neutralised: %q", newest)
		}
		for _, r := range recs[1:] {
			for _, cell := range r {
				if cell != "" && strings.ContainsRune("=+-@", rune(cell[0])) {
					t.Errorf("cell %q starts a formula", cell)
				}
			}
		}

		// JSONL: one object a line, the filter applied, newest first.
		resp, body = e.fetch(admin, http.MethodGet, "/admin/audit/export?format=jsonl&action=team.create", nil, nil)
		if resp.StatusCode != http.StatusOK || !strings.Contains(resp.Header.Get("Content-Disposition"), ".jsonl") {
			t.Fatalf("jsonl: %d %v", resp.StatusCode, resp.Header)
		}
		var lines []audit.Row
		sc := bufio.NewScanner(strings.NewReader(body))
		for sc.Scan() {
			var r audit.Row
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				t.Fatalf("jsonl line %q: %v", sc.Text(), err)
			}
			lines = append(lines, r)
		}
		if len(lines) != 65 || lines[0].Actor != `=HYPERLINK("http://evil")` || lines[0].ID <= lines[1].ID || lines[64].Target != "thing 1" {
			t.Fatalf("jsonl: %d lines, first %+v", len(lines), lines[0])
		}
	})
}

// TestAuditAppendOnly: the database itself refuses to update an audit
// event (the trigger Migrate installs), and retention's delete removes
// only what is older than its cutoff, in batches.
func TestAuditAppendOnly(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db string) {
		e := startEnv(t, db)
		t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		seedAudit(t, e, 25, t0)
		if err := e.DB.Exec("UPDATE audit_events SET actor = 'someone else'").Error; err == nil ||
			!strings.Contains(err.Error(), "append-only") {
			t.Fatalf("update: %v, want refused", err)
		}
		if err := e.DB.Model(&models.AuditEvent{}).Where("id = 1").Update("detail", "x").Error; err == nil {
			t.Fatal("update by GORM passed")
		}
		n, err := models.DeleteAuditEventsBefore(context.Background(), e.DB, t0.Add(10*time.Minute), 3)
		if err != nil || n != 10 {
			t.Fatalf("retention deleted %d: %v", n, err)
		}
		var left int64
		e.DB.Model(&models.AuditEvent{}).Count(&left)
		if left != 15 {
			t.Fatalf("%d left, want 15", left)
		}
		// Migrate again (a restart): the trigger is found, not doubled.
		if err := models.Migrate(e.DB); err != nil {
			t.Fatal(err)
		}
	})
}
