package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"moonji/internal/apikey"
	"moonji/models"
)

// Expected answers in the access table.
const (
	toSignIn   = -1 // 303 to /login?next=…: a page's refusal without a session
	hxSignIn   = -2 // 401 with HX-Redirect to the sign-in: the same, to htmx
	letThrough = -3 // anything but 401, 403, 302 or 303: the guards let it pass
	keyRefused = -4 // 401 in OpenAI's error shape with WWW-Authenticate: Bearer: a program's refusal
)

// TestAdminAccessTable is who may reach the admin and usage pages: nobody
// without a session (an API key opens no page: a program that sends one is
// answered 401, a browser is sent to sign in), no person who is not an
// admin on /admin, every signed-in person on /usage. Cells whose answer is
// another handler's business (the dashboard, usage) only check that the
// guards let the request through.
func TestAdminAccessTable(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db string) {
		e := startEnv(t, db)
		ctx := context.Background()
		person := e.signedIn("person@example.com", false)
		admin := e.signedIn("boss@example.com", true)
		key := e.newKey("keyholder@example.com", 0)
		// The paths name user 1 and key 1: make sure they exist and are not
		// the admin's own (disabling oneself is a 400 of its own).
		u1, err := models.UserByID(ctx, e.DB, 1)
		if err != nil || u1.Email == "boss@example.com" {
			t.Fatalf("user 1 = %+v, %v", u1, err)
		}
		if _, err := models.APIKeyByID(ctx, e.DB, 1); err != nil {
			t.Fatalf("key 1: %v", err)
		}

		team, err := models.CreateTeam(ctx, e.DB, "access", models.Limits{})
		if err != nil {
			t.Fatal(err)
		}

		type caller struct {
			name   string
			client *http.Client
			hdr    map[string]string
		}
		callers := []caller{
			{"anonymous", browser(t), nil},
			{"anonymous htmx", browser(t), map[string]string{"HX-Request": "true"}},
			{"API key", browser(t), map[string]string{"Authorization": "Bearer " + key}},
			{"API key, lower-case scheme", browser(t), map[string]string{"Authorization": "bearer " + key}},
			{"API key, htmx", browser(t), map[string]string{"Authorization": "BEARER " + key, "HX-Request": "true"}},
			{"person", person, nil},
			{"admin", admin, nil},
			// A key beside a valid session changes nothing: the session decides.
			{"admin with a key", admin, map[string]string{"Authorization": "Bearer " + key}},
		}
		const k = keyRefused
		routes := []struct {
			method, path string
			want         []int // per caller, in callers' order
			location     string
		}{
			{"GET", "/admin", []int{toSignIn, hxSignIn, k, k, k, 403, letThrough, letThrough}, ""},
			{"GET", "/admin/backends", []int{toSignIn, hxSignIn, k, k, k, 403, letThrough, letThrough}, ""},
			{"GET", "/admin/keys", []int{toSignIn, hxSignIn, k, k, k, 403, 200, 200}, ""},
			{"POST", "/admin/keys/1/revoke", []int{toSignIn, hxSignIn, k, k, k, 403, 303, 303}, "/admin/keys"},
			{"GET", "/admin/people", []int{toSignIn, hxSignIn, k, k, k, 403, 200, 200}, ""},
			{"POST", "/admin/people/1/disable", []int{toSignIn, hxSignIn, k, k, k, 403, 303, 303}, "/admin/people?done=disabled"},
			{"POST", "/admin/people/1/enable", []int{toSignIn, hxSignIn, k, k, k, 403, 303, 303}, "/admin/people?done=enabled"},
			// Budgets, model lists and teams (an empty form: no budget, every model).
			{"POST", "/admin/people/1/budget", []int{toSignIn, hxSignIn, k, k, k, 403, 303, 303}, "/admin/people?done=budget"},
			{"POST", "/admin/keys/1/budget", []int{toSignIn, hxSignIn, k, k, k, 403, 303, 303}, "/admin/keys?done=budget"},
			{"POST", "/admin/keys/1/models", []int{toSignIn, hxSignIn, k, k, k, 403, 303, 303}, "/admin/keys?done=models"},
			{"GET", "/admin/teams", []int{toSignIn, hxSignIn, k, k, k, 403, 200, 200}, ""},
			{"GET", fmt.Sprintf("/admin/teams/%d", team.ID), []int{toSignIn, hxSignIn, k, k, k, 403, 200, 200}, ""},
			{"POST", "/admin/teams", []int{toSignIn, hxSignIn, k, k, k, 403, 422, 422}, ""},
			{"POST", fmt.Sprintf("/admin/teams/%d/budget", team.ID), []int{toSignIn, hxSignIn, k, k, k, 403, 303, 303},
				fmt.Sprintf("/admin/teams/%d?done=budget", team.ID)},
			// Key 1 is nobody's here but the keyholder's: not found.
			{"POST", "/keys/1/budget", []int{toSignIn, hxSignIn, k, k, k, 404, 404, 404}, ""},
			{"GET", "/usage", []int{toSignIn, hxSignIn, k, k, k, letThrough, letThrough, letThrough}, ""},
			{"GET", "/usage/export", []int{toSignIn, hxSignIn, k, k, k, letThrough, letThrough, letThrough}, ""},
		}
		for _, rt := range routes {
			for i, cl := range callers {
				t.Run(fmt.Sprintf("%s %s/%s", rt.method, rt.path, cl.name), func(t *testing.T) {
					var form url.Values
					hdr := map[string]string{}
					for k, v := range cl.hdr {
						hdr[k] = v
					}
					if rt.method == http.MethodPost {
						form = url.Values{}
						if cl.client == person || cl.client == admin {
							// A signed-in person's forms carry their token: the
							// refusal tested is the admin guard's, not CSRF's.
							form.Set("_csrf", mustMe(e, cl.client).CSRFToken)
						}
					}
					resp, body := e.fetch(noRedirects(cl.client), rt.method, rt.path, form, hdr)
					got, loc := resp.StatusCode, resp.Header.Get("Location")
					switch want := rt.want[i]; want {
					case toSignIn:
						if got != http.StatusSeeOther || !strings.HasPrefix(loc, "/login?next=") {
							t.Errorf("%d → %q, want 303 to the sign-in", got, loc)
						}
					case keyRefused:
						var e struct {
							Error struct{ Message, Type, Code string }
						}
						if got != http.StatusUnauthorized || loc != "" || resp.Header.Get("HX-Redirect") != "" {
							t.Errorf("%d (→ %q, HX-Redirect %q), want 401 without a redirect", got, loc, resp.Header.Get("HX-Redirect"))
						}
						if h := resp.Header.Get("WWW-Authenticate"); h != "Bearer" {
							t.Errorf("WWW-Authenticate %q, want Bearer", h)
						}
						if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
							t.Errorf("Content-Type %q, want application/json", ct)
						}
						if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Message == "" ||
							e.Error.Type != "invalid_request_error" || e.Error.Code != "invalid_api_key" {
							t.Errorf("body %s (%v), want an OpenAI-shaped error", body, err)
						}
					case hxSignIn:
						if got != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("HX-Redirect"), "/login?next=") {
							t.Errorf("%d (HX-Redirect %q), want 401 with HX-Redirect to the sign-in", got, resp.Header.Get("HX-Redirect"))
						}
					case letThrough:
						switch got {
						case http.StatusUnauthorized, http.StatusForbidden, http.StatusFound, http.StatusSeeOther:
							t.Errorf("%d (→ %q): the guards refused it\n%s", got, loc, body)
						}
					default:
						if got != want {
							t.Errorf("%d (→ %q), want %d\n%s", got, loc, want, body)
						}
						if want == http.StatusSeeOther && loc != rt.location {
							t.Errorf("redirect to %q, want %q", loc, rt.location)
						}
					}
				})
			}
		}
		// The key opened nothing and changed nothing: it still works on /v1,
		// where keys belong.
		if resp, body := haDo(t, e, nil, http.MethodGet, "/v1/models", "", haBearer(key)); resp.StatusCode != 200 {
			t.Errorf("the caller's key on /v1 afterwards: %d %s", resp.StatusCode, body)
		}
		if k, _ := models.APIKeyByHash(ctx, e.DB, apikey.Hash(key)); k == nil || k.RevokedAt != nil {
			t.Errorf("the caller's key: %+v", k)
		}
	})
}
