package web_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// The JSON API's refusals name the field at fault in param, as OpenAI's
// do: the body's field, or the query parameter; null when the body as a
// whole is at fault.
func TestAPIErrorsNameTheParam(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/moonji.db")
	p := e.chatter("param@example.com")
	conv := p.newConversation()
	long := strings.Repeat("t", 201)
	cases := []struct {
		name, method, path, body string
		status                   int
		param                    string // "" for null
	}{
		{"create: model missing", http.MethodPost, "/api/v1/conversations", `{}`, 400, "model"},
		{"create: model not a string", http.MethodPost, "/api/v1/conversations", `{"model":1}`, 400, "model"},
		{"create: unknown model", http.MethodPost, "/api/v1/conversations", `{"model":"nope"}`, 400, "model"},
		{"create: model repeated", http.MethodPost, "/api/v1/conversations", `{"model":"m1","Model":"nope"}`, 400, "model"},
		{"create: not an object", http.MethodPost, "/api/v1/conversations", `["m1"]`, 400, ""},
		{"create: not JSON", http.MethodPost, "/api/v1/conversations", `{"model":`, 400, ""},
		{"rename: title not a string", http.MethodPatch, "/api/v1/conversations/" + conv, `{"title":5}`, 400, "title"},
		{"rename: title too long", http.MethodPatch, "/api/v1/conversations/" + conv, `{"title":"` + long + `"}`, 400, "title"},
		{"send: content null", http.MethodPost, "/api/v1/conversations/" + conv + "/messages", `{"content":null}`, 400, "content"},
		{"send: content empty", http.MethodPost, "/api/v1/conversations/" + conv + "/messages", `{"content":"  "}`, 400, "content"},
		{"send: content too large", http.MethodPost, "/api/v1/conversations/" + conv + "/messages", `{"content":"` + strings.Repeat("x", 33<<10) + `"}`, 413, "content"},
		{"list: bad cursor", http.MethodGet, "/api/v1/conversations?cursor=nope", ``, 400, "cursor"},
		{"list: search too long", http.MethodGet, "/api/v1/conversations?q=" + long, ``, 400, "q"},
		{"export: bad format", http.MethodGet, "/api/v1/conversations/" + conv + "/export?format=pdf", ``, 400, "format"},
		{"events: bad last_event_id", http.MethodGet, "/api/v1/generations/inf_x/events?last_event_id=x", ``, 400, "last_event_id"},
		{"stop: inference_id missing", http.MethodPost, "/api/v1/inference/stop", `{"seen":1}`, 400, "inference_id"},
		{"stop: inference_id empty", http.MethodPost, "/api/v1/inference/stop", `{"inference_id":""}`, 400, "inference_id"},
		{"stop: seen negative", http.MethodPost, "/api/v1/inference/stop", `{"inference_id":"inf_x","seen":-1}`, 400, "seen"},
		{"stop: seen fractional", http.MethodPost, "/api/v1/inference/stop", `{"inference_id":"inf_x","seen":1.5}`, 400, "seen"},
		{"stop: seen a string", http.MethodPost, "/api/v1/inference/stop", `{"inference_id":"inf_x","seen":"4"}`, 400, "seen"},
		{"stop: seen repeated", http.MethodPost, "/api/v1/inference/stop", `{"inference_id":"inf_x","seen":1,"seen":0}`, 400, "seen"},
		{"stop: not an object", http.MethodPost, "/api/v1/inference/stop", `"inf_x"`, 400, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, body := p.do(c.method, c.path, c.body)
			var got struct {
				Error *struct {
					Message string  `json:"message"`
					Type    string  `json:"type"`
					Param   *string `json:"param"`
					Code    *string `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal([]byte(body), &got); err != nil || got.Error == nil || got.Error.Message == "" {
				t.Fatalf("%d, not OpenAI's error shape: %.300s", status, body)
			}
			param := ""
			if got.Error.Param != nil {
				param = *got.Error.Param
				if param == "" {
					t.Errorf("param is an empty string; want null or a name")
				}
			}
			if status != c.status || param != c.param || got.Error.Type != "invalid_request_error" || got.Error.Code == nil {
				t.Errorf("%d %s; want %d with param %q", status, body, c.status, c.param)
			}
		})
	}
}
