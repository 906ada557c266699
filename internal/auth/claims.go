package auth

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"moonji/models"
)

// Identity is who the provider says signed in.
type Identity struct {
	Issuer        string
	Subject       string
	Email         string
	EmailVerified bool
	Name          string
	// Claims are all claims of the ID token, merged with userinfo's.
	Claims map[string]any
	// userinfoFailed: userinfo was needed but failed, so a claim the ID
	// token lacks may be missing rather than empty.
	userinfoFailed bool
}

// IsAdmin applies the rule to a signed-in identity. An email grants admin
// only when the provider vouches for it (email_verified), since some
// providers let people type any address.
func (r AdminRule) IsAdmin(id Identity) bool {
	if r.Claim != "" && r.Value != "" {
		if v, ok := lookupClaim(id.Claims, r.Claim); ok && claimHas(v, r.Value) {
			return true
		}
	}
	if id.EmailVerified && id.Email != "" {
		email := models.NormalizeEmail(id.Email)
		return slices.ContainsFunc(r.Emails, func(e string) bool { return models.NormalizeEmail(e) == email })
	}
	return false
}

// lookupClaim finds a claim by name, or by a dotted path into nested objects
// (Keycloak's realm_access.roles). The whole name is tried first, because
// namespaced claims (Auth0's https://example.com/roles) contain dots.
func lookupClaim(claims map[string]any, name string) (any, bool) {
	if v, ok := claims[name]; ok {
		return v, true
	}
	var cur any = claims
	for part := range strings.SplitSeq(name, ".") {
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, false
		}
		if cur, ok = m[part]; !ok {
			return nil, false
		}
	}
	return cur, true
}

// claimHas reports whether a claim's value is or contains want: a string, a
// list of strings (groups, roles), an object whose keys are roles (Zitadel),
// or a boolean or number compared as text.
func claimHas(v any, want string) bool {
	switch v := v.(type) {
	case string:
		return v == want
	case []any:
		return slices.ContainsFunc(v, func(e any) bool { return claimHas(e, want) })
	case []string:
		return slices.Contains(v, want)
	case map[string]any:
		_, ok := v[want]
		return ok
	case bool, float64, int, int64:
		return fmt.Sprint(v) == want
	}
	return false
}

// claimStrings reads a claim's value as names: a string is one, a list
// gives its strings (other elements are skipped), an object its keys
// (Zitadel's roles), in order; anything else gives none.
func claimStrings(v any) []string {
	switch v := v.(type) {
	case string:
		return []string{v}
	case []string:
		return v
	case []any:
		out := make([]string, 0, len(v))
		for _, e := range v {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
		return out
	case map[string]any:
		return slices.Sorted(maps.Keys(v))
	}
	return nil
}

// mergeClaims adds to dst the claims it lacks from src (userinfo adds to the
// ID token; the ID token, being signed, wins where both speak).
func mergeClaims(dst, src map[string]any) map[string]any {
	if dst == nil {
		dst = map[string]any{}
	}
	for k, v := range src {
		if _, ok := dst[k]; !ok {
			dst[k] = v
		}
	}
	return dst
}
