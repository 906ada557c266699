package web_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"testing"

	"moonji/models"
)

// TestAdminKeysAPIHostileBodies: every body a stranger could send is
// refused with 400 in OpenAI's shape naming the field, and changes nothing;
// a body over the size limit is 413.
func TestAdminKeysAPIHostileBodies(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db string) {
		e := startEnv(t, db)
		secret, _ := e.adminKeyOf("boss@example.com")
		a := adminClient{t, e, secret}
		e.addPerson("worker@example.com", false)
		keyPath := fmt.Sprintf("/api/v1/admin/keys/%d", uint(a.must(http.StatusCreated, http.MethodPost, "/api/v1/admin/keys",
			`{"owner":"worker@example.com","name":"target"}`)["id"].(float64)))
		var before int64
		e.DB.Model(&models.APIKey{}).Count(&before)
		ok := `"owner":"worker@example.com","name":"x"`
		long := strings.Repeat("n", 10_000)
		for _, c := range []struct{ body, param string }{
			{``, ""},
			{`[]`, ""},
			{`null`, ""},
			{`"x"`, ""},
			{`{`, ""},
			{strings.Repeat("[", 200) + strings.Repeat("]", 200), ""},
			{`{"name":"x"}`, "owner"},
			{`{"owner":"worker@example.com"}`, "name"},
			{`{"owner":"nobody@example.com","name":"x"}`, "owner"},
			{`{"owner":"` + long + `","name":"x"}`, "owner"},
			{`{"owner":"worker@example.com","name":"` + long + `"}`, "name"},
			{`{"owner":"worker@example.com","name":"   "}`, "name"},
			{`{"owner":"worker@example.com","name":"a\u202eb"}`, "name"},
			{`{"owner":"worker@example.com","name":7}`, "name"},
			{`{` + ok + `,"name":"y"}`, "name"},
			{`{` + ok + `,"NAME":"y"}`, "name"},
			{`{` + ok + `,"admin":true}`, "admin"},
			{`{` + ok + `,"scope":"root"}`, "scope"},
			{`{` + ok + `,"rpm":-1}`, "rpm"},
			{`{` + ok + `,"rpm":1.5}`, "rpm"},
			{`{` + ok + `,"rpm":99999999999999999999999}`, "rpm"},
			{`{` + ok + `,"rpm":1000001}`, "rpm"},
			{`{` + ok + `,"rpm":"5"}`, "rpm"},
			{`{` + ok + `,"budget":-5}`, "budget"},
			{`{` + ok + `,"budget":"1e9"}`, "budget"},
			{`{` + ok + `,"budget":1e400}`, "budget"},
			{`{` + ok + `,"budget":"99999999999999999999999"}`, "budget"},
			{`{` + ok + `,"budget":"0.0000000001"}`, "budget"},
			{`{` + ok + `,"budget":true}`, "budget"},
			{`{` + ok + `,"budget_period":"week","budget":"1"}`, "budget_period"},
			{`{` + ok + `,"budget_period":"day"}`, "budget_period"},
			{`{` + ok + `,"expires_in":-1}`, "expires_in"},
			{`{` + ok + `,"expires_in":"forever"}`, "expires_in"},
			{`{` + ok + `,"expires_in":"99999d"}`, "expires_in"},
			{`{` + ok + `,"expires_in":9223372036854775807}`, "expires_in"},
			{`{` + ok + `,"models":["nope"]}`, "models"},
			{`{` + ok + `,"models":"m1"}`, "models"},
			{`{` + ok + `,"models":["m1,renamed"]}`, "models"},
			{`{` + ok + `,"models":["` + strings.Repeat("m", 201) + `"]}`, "models"},
			{`{` + ok + `,"models":[` + strings.Repeat(`"m1",`, 120) + `"m1"]}`, "models"},
		} {
			status, obj, text := a.call(http.MethodPost, "/api/v1/admin/keys", c.body)
			wantError(t, "POST "+clipText(c.body), status, obj, text, http.StatusBadRequest, "invalid_request", c.param)
		}
		for _, c := range []struct{ body, param string }{
			{`{}`, ""},
			{`{"owner":"boss@example.com"}`, "owner"},
			{`{"scope":"admin"}`, "scope"},
			{`{"expires_in":"1d"}`, "expires_in"},
			{`{"name":null}`, "name"},
			{`{"name":"` + long + `"}`, "name"},
			{`{"rpm":-3}`, "rpm"},
			{`{"budget_period":"day"}`, "budget_period"},
			{`{"models":["nope"]}`, "models"},
		} {
			status, obj, text := a.call(http.MethodPatch, keyPath, c.body)
			wantError(t, "PATCH "+clipText(c.body), status, obj, text, http.StatusBadRequest, "invalid_request", c.param)
		}
		for _, q := range []string{"limit=0", "limit=501", "limit=x", "after=-1", "after=99999999999999999999", "scope=root",
			"status=gone", "owner=" + strings.Repeat("o", 2000)} {
			status, obj, text := a.call(http.MethodGet, "/api/v1/admin/keys?"+q, "")
			wantError(t, "GET ?"+clipText(q), status, obj, text, http.StatusBadRequest, "invalid_request", "")
		}
		huge := `{"owner":"worker@example.com","name":"` + strings.Repeat("x", 70<<10) + `"}`
		if status, _, text := a.call(http.MethodPost, "/api/v1/admin/keys", huge); status != http.StatusRequestEntityTooLarge ||
			!strings.Contains(text, `"error"`) {
			t.Errorf("a 70 KiB body: %d %s", status, clipText(text))
		}
		var after int64
		e.DB.Model(&models.APIKey{}).Count(&after)
		if after != before {
			t.Errorf("refused bodies made %d keys", after-before)
		}
		if got := a.must(http.StatusOK, http.MethodGet, keyPath, ""); got["name"] != "target" || got["rpm"] != 0.0 {
			t.Errorf("refused patches changed the key: %v", got)
		}
	})
}

// openAPIDoc is the part of the served OpenAPI description the test reads.
type openAPIDoc struct {
	OpenAPI string                                `json:"openapi"`
	Paths   map[string]map[string]json.RawMessage `json:"paths"`
}

type openAPIOperation struct {
	Responses map[string]struct {
		Content map[string]struct {
			Example map[string]any `json:"example"`
		} `json:"content"`
	} `json:"responses"`
}

// TestAdminOpenAPIDescribesRoutes: the served description is OpenAPI 3.1,
// names every route mounted under /api/v1/admin, and the fields of its
// examples are the fields of the real answers, and the other way round.
func TestAdminOpenAPIDescribesRoutes(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	resp, body := haDo(t, e, nil, http.MethodGet, "/api/v1/admin/openapi.json", "", nil)
	var doc openAPIDoc
	if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(body), &doc) != nil || !strings.HasPrefix(doc.OpenAPI, "3.1") {
		t.Fatalf("openapi.json: %d %s", resp.StatusCode, clipText(body))
	}
	param := regexp.MustCompile(`:(\w+)`)
	described := 0
	for _, r := range e.srv.App.GetRoutes(true) {
		if !strings.HasPrefix(r.Path, "/api/v1/admin") || strings.HasSuffix(r.Path, "/*") || r.Method == http.MethodHead {
			continue
		}
		path := param.ReplaceAllString(r.Path, "{$1}")
		if _, ok := doc.Paths[path][strings.ToLower(r.Method)]; !ok {
			t.Errorf("%s %s is not described in openapi.json", r.Method, path)
		}
		described++
	}
	if described < 6 {
		t.Errorf("only %d admin routes found", described)
	}

	secret, _ := e.adminKeyOf("boss@example.com")
	a := adminClient{t, e, secret}
	e.addPerson("worker@example.com", false)
	real := map[string]map[string]any{}
	real["post /api/v1/admin/keys 201"] = a.must(http.StatusCreated, http.MethodPost, "/api/v1/admin/keys",
		`{"owner":"worker@example.com","name":"ci","budget":"1","models":["m1"],"expires_in":3600}`)
	path := fmt.Sprintf("/api/v1/admin/keys/%d", uint(real["post /api/v1/admin/keys 201"]["id"].(float64)))
	real["get /api/v1/admin/keys 200"] = a.must(http.StatusOK, http.MethodGet, "/api/v1/admin/keys", "")
	real["get /api/v1/admin/keys/{id} 200"] = a.must(http.StatusOK, http.MethodGet, path, "")
	real["patch /api/v1/admin/keys/{id} 200"] = a.must(http.StatusOK, http.MethodPatch, path, `{"rpm":5}`)
	real["delete /api/v1/admin/keys/{id} 200"] = a.must(http.StatusOK, http.MethodDelete, path, "")
	_, real["get /api/v1/admin/keys/{id} 404"], _ = a.call(http.MethodGet, "/api/v1/admin/keys/99999", "")
	_, real["get /api/v1/admin/keys 401"], _ = adminClient{t, e, ""}.call(http.MethodGet, "/api/v1/admin/keys", "")
	_, real["get /api/v1/admin/keys 403"], _ = adminClient{t, e, e.Key}.call(http.MethodGet, "/api/v1/admin/keys", "")
	_, real["post /api/v1/admin/keys 400"], _ = a.call(http.MethodPost, "/api/v1/admin/keys", `{"rpm":-1}`)

	components := map[string]map[string]any{}
	var all struct {
		Components struct {
			Responses map[string]struct {
				Content map[string]struct {
					Example map[string]any `json:"example"`
				} `json:"content"`
			} `json:"responses"`
		} `json:"components"`
	}
	_ = json.Unmarshal([]byte(body), &all)
	for name, r := range all.Components.Responses {
		components[name] = r.Content["application/json"].Example
	}
	refs := map[string]string{"400": "BadRequest", "401": "Unauthorized", "403": "Forbidden", "404": "NotFound"}
	for what, got := range real {
		f := strings.Fields(what)
		var op openAPIOperation
		if err := json.Unmarshal(doc.Paths[f[1]][f[0]], &op); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		example := op.Responses[f[2]].Content["application/json"].Example
		if example == nil {
			example = components[refs[f[2]]]
		}
		if example == nil {
			t.Errorf("%s: no example", what)
			continue
		}
		if a, b := fieldsOf(example, ""), fieldsOf(got, ""); a != b {
			t.Errorf("%s: the example's fields\n  %s\nare not the answer's\n  %s", what, a, b)
		}
	}
}

// fieldsOf lists the member names of obj, of its objects and of its
// arrays' first objects, as "a b c.d".
func fieldsOf(obj map[string]any, prefix string) string {
	var names []string
	for k, v := range obj {
		names = append(names, prefix+k)
		switch v := v.(type) {
		case map[string]any:
			names = append(names, fieldsOf(v, prefix+k+"."))
		case []any:
			if len(v) > 0 {
				if m, ok := v[0].(map[string]any); ok {
					names = append(names, fieldsOf(m, prefix+k+"[]."))
				}
			}
		}
	}
	sort.Strings(names)
	return strings.Join(names, " ")
}
