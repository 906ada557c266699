package handlers

import (
	"strings"
	"testing"
	"unicode/utf8"

	"moonji/models"
)

// FuzzParseKeyBody: the admin API's key bodies never panic the parser; a
// refusal is a *bodyError naming a field or nothing; what is accepted is
// within every bound (name and owner length, rpm, budget, expiry, models).
//
//	go test ./handlers -run '^$' -fuzz FuzzParseKeyBody -fuzztime 60s
func FuzzParseKeyBody(f *testing.F) {
	for _, b := range []string{
		`{"owner":"a@b.c","name":"ci"}`,
		`{"owner":"a@b.c","name":"ci","scope":"admin","expires_in":"30d","rpm":60,"budget":"2.50","budget_period":"day","models":["m1"]}`,
		`{"owner":"a@b.c","name":"ci","expires_in":3600,"budget":2.5,"models":null,"rpm":null}`,
		`{"name":"x","name":"y"}`, `{"NAME":"x"}`, `{"rpm":1e3}`, `{"budget":-1}`, `{"budget":"1e9"}`, `{"expires_in":"-5h"}`,
		`{"models":["a,b"]}`, `{"models":[1]}`, `{"x":` + strings.Repeat("[", 200) + `}`, `[]`, `null`, ``, `{"budget":null}`,
		`{"name":"a\u202eb"}`, `{"owner":"` + strings.Repeat("é", 400) + `"}`,
	} {
		f.Add([]byte(b), true)
		f.Add([]byte(b), false)
	}
	f.Fuzz(func(t *testing.T, body []byte, create bool) {
		parse := parseKeyPatch
		if create {
			parse = parseKeyCreate
		}
		k, err := parse(body, adminMaxRPM)
		if err != nil {
			refusal(t, err, body, append(keyFields, func() []string {
				// An unknown member is named (cut to 64 characters).
				if m := unknownName(err); m != "" {
					return []string{m}
				}
				return nil
			}()...)...)
			return
		}
		for _, s := range []*string{k.Owner, k.Name} {
			if s != nil && (*s == "" || utf8.RuneCountInString(*s) > maxOwnerChars || hasControlChar(*s)) {
				t.Fatalf("accepted %q from %q", *s, body)
			}
		}
		if k.Name != nil && utf8.RuneCountInString(*k.Name) > maxKeyNameChars {
			t.Fatalf("accepted a name of %d characters", utf8.RuneCountInString(*k.Name))
		}
		if k.RPM != nil && (*k.RPM < 0 || *k.RPM > adminMaxRPM) || k.Expires < 0 || k.Expires > maxExpiresIn ||
			k.Budget != nil && *k.Budget < 0 || len(k.Models) > models.MaxModelNames {
			t.Fatalf("accepted out of bounds: %+v from %q", k, body)
		}
		if k.Period != nil && !models.ValidBudgetPeriod(*k.Period) || k.Scope != nil && !models.ValidScope(*k.Scope) {
			t.Fatalf("accepted %+v from %q", k, body)
		}
		if create && (k.Owner == nil || k.Name == nil || (k.Budget == nil) != (k.Period == nil)) {
			t.Fatalf("create accepted %+v from %q", k, body)
		}
	})
}

// unknownName is the member an "unknown member" refusal names.
func unknownName(err error) string {
	if b, ok := err.(*bodyError); ok && strings.HasPrefix(b.Message, "unknown member") {
		return b.Param
	}
	return ""
}
