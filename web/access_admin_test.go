package web_test

import (
	"context"
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
)

// TestAdminAccessTable is who may reach the admin and usage pages: nobody
// without a session (an API key opens no page), no person who is not an
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

		type caller struct {
			name   string
			client *http.Client
			hdr    map[string]string
		}
		callers := []caller{
			{"anonymous", browser(t), nil},
			{"anonymous htmx", browser(t), map[string]string{"HX-Request": "true"}},
			{"API key", browser(t), map[string]string{"Authorization": "Bearer " + key}},
			{"person", person, nil},
			{"admin", admin, nil},
		}
		routes := []struct {
			method, path string
			want         []int // per caller, in callers' order
			location     string
		}{
			{"GET", "/admin", []int{toSignIn, hxSignIn, toSignIn, 403, letThrough}, ""},
			{"GET", "/admin/backends", []int{toSignIn, hxSignIn, toSignIn, 403, letThrough}, ""},
			{"GET", "/admin/keys", []int{toSignIn, hxSignIn, toSignIn, 403, 200}, ""},
			{"POST", "/admin/keys/1/revoke", []int{toSignIn, hxSignIn, toSignIn, 403, 303}, "/admin/keys"},
			{"GET", "/admin/people", []int{toSignIn, hxSignIn, toSignIn, 403, 200}, ""},
			{"POST", "/admin/people/1/disable", []int{toSignIn, hxSignIn, toSignIn, 403, 303}, "/admin/people?done=disabled"},
			{"POST", "/admin/people/1/enable", []int{toSignIn, hxSignIn, toSignIn, 403, 303}, "/admin/people?done=enabled"},
			{"GET", "/usage", []int{toSignIn, hxSignIn, toSignIn, letThrough, letThrough}, ""},
			{"GET", "/usage/export", []int{toSignIn, hxSignIn, toSignIn, letThrough, letThrough}, ""},
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
