package auth

import "testing"

func TestAdminRule(t *testing.T) {
	claims := map[string]any{
		"groups":                            []any{"staff", "moonji-admins"},
		"role":                              "admin",
		"realm_access":                      map[string]any{"roles": []any{"offline_access", "ops"}},
		"urn:zitadel:iam:org:project:roles": map[string]any{"owner": map[string]any{"123": "org"}},
		"https://example.com/roles":         []any{"boss"},
		"is_admin":                          true,
	}
	tests := []struct {
		name string
		rule AdminRule
		id   Identity
		want bool
	}{
		{"group in list", AdminRule{Claim: "groups", Value: "moonji-admins"}, Identity{Claims: claims}, true},
		{"group not in list", AdminRule{Claim: "groups", Value: "root"}, Identity{Claims: claims}, false},
		{"string claim", AdminRule{Claim: "role", Value: "admin"}, Identity{Claims: claims}, true},
		{"dotted path", AdminRule{Claim: "realm_access.roles", Value: "ops"}, Identity{Claims: claims}, true},
		{"object keys (Zitadel)", AdminRule{Claim: "urn:zitadel:iam:org:project:roles", Value: "owner"}, Identity{Claims: claims}, true},
		{"namespaced claim with dots", AdminRule{Claim: "https://example.com/roles", Value: "boss"}, Identity{Claims: claims}, true},
		{"boolean", AdminRule{Claim: "is_admin", Value: "true"}, Identity{Claims: claims}, true},
		{"missing claim", AdminRule{Claim: "nope", Value: "x"}, Identity{Claims: claims}, false},
		{"empty groups", AdminRule{Claim: "groups", Value: "moonji-admins"}, Identity{Claims: map[string]any{"groups": []any{}}}, false},
		{"verified admin email", AdminRule{Emails: []string{"Boss@Example.com"}}, Identity{Email: "boss@example.com", EmailVerified: true}, true},
		{"unverified admin email", AdminRule{Emails: []string{"boss@example.com"}}, Identity{Email: "boss@example.com"}, false},
		{"other email", AdminRule{Emails: []string{"boss@example.com"}}, Identity{Email: "me@example.com", EmailVerified: true}, false},
		{"no rule", AdminRule{}, Identity{Claims: claims, Email: "boss@example.com", EmailVerified: true}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.rule.IsAdmin(tc.id); got != tc.want {
				t.Errorf("IsAdmin = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{
		"":                     "/",
		"/keys":                "/keys",
		"/admin/keys?x=1":      "/admin/keys?x=1",
		"//evil.example.com":   "/",
		"https://evil.example": "/",
		"/\\evil.example":      "/",
		"keys":                 "/",
		"/a\r\nSet-Cookie: x":  "/",
	} {
		if got := SafeNext(in); got != want {
			t.Errorf("SafeNext(%q) = %q, want %q", in, got, want)
		}
	}
}
