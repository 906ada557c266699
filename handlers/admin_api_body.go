package handlers

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"moonji/internal/jsonguard"
	"moonji/internal/money"
	"moonji/models"
)

// The JSON bodies of the admin API's keys (POST and PATCH
// /api/v1/admin/keys) are read here, apart from the handlers, as pure
// functions: every refusal is a *bodyError naming the field at fault, and
// nothing a stranger sends reaches the database unchecked. Members not
// listed are refused, so that a typo ("budget_perod") is not silently
// ignored; a repeated member is refused (jsonguard).

// Bounds of the admin API's key fields.
const (
	maxKeyNameChars = 200        // the name column's size
	maxOwnerChars   = 320        // the email column's size
	maxExpiresIn    = 3650 * day // as the /keys form's longest choice
	day             = 24 * time.Hour
)

// keyFields are the members a key's body may have; createOnly those a
// PATCH may not change.
var (
	keyFields  = []string{"owner", "name", "scope", "expires_in", "rpm", "budget", "budget_period", "models"}
	createOnly = []string{"owner", "scope", "expires_in"}
	keyWatch   = func() jsonguard.Watch {
		w := make(jsonguard.Watch, len(keyFields))
		for i, f := range keyFields {
			w[i] = jsonguard.Field{Name: f}
		}
		return w
	}()
)

// keyBody is a key's body as read: each field set when its member was
// present (HasX for those where null means something).
type keyBody struct {
	Owner, Name, Scope *string
	Expires            time.Duration // 0: never
	RPM                *int
	HasBudget          bool   // budget was present: Budget nil is no budget
	Budget             *int64 // nano-units
	Period             *string
	HasModels          bool
	Models             []string // nil: every model
}

// parseKeyCreate reads POST /api/v1/admin/keys's body: owner and name
// required, the rest optional. A budget without a period is per month, as
// in the CLI.
func parseKeyCreate(body []byte, maxRPM int) (keyBody, error) {
	k, err := parseKeyBody(body, maxRPM, true)
	if err != nil {
		return k, err
	}
	if k.Owner == nil {
		return k, &bodyError{Message: "owner is required: the email of the key's owner", Param: "owner"}
	}
	if k.Name == nil {
		return k, &bodyError{Message: "name is required", Param: "name"}
	}
	if k.Budget == nil && k.Period != nil {
		return k, &bodyError{Message: "budget_period needs a budget", Param: "budget_period"}
	}
	if k.Budget != nil && k.Period == nil {
		p := models.BudgetMonth
		k.Period = &p
	}
	return k, nil
}

// parseKeyPatch reads PATCH /api/v1/admin/keys/{id}'s body: a JSON merge
// patch (RFC 7386) of name, rpm, budget, budget_period and models — an
// absent member leaves its field as it is, null clears it (rpm: the
// configured default; budget: none; models: every model). At least one.
func parseKeyPatch(body []byte, maxRPM int) (keyBody, error) {
	k, err := parseKeyBody(body, maxRPM, false)
	if err != nil {
		return k, err
	}
	if k.Name == nil && k.RPM == nil && !k.HasBudget && k.Period == nil && !k.HasModels {
		return k, &bodyError{Message: "give at least one of name, rpm, budget, budget_period, models"}
	}
	return k, nil
}

func parseKeyBody(body []byte, maxRPM int, create bool) (keyBody, error) {
	var k keyBody
	if err := jsonguard.Validate(body, keyWatch); err != nil {
		return k, guardRefusal(err)
	}
	var members map[string]json.RawMessage
	if len(bytes.TrimSpace(body)) == 0 || bytes.TrimSpace(body)[0] != '{' || json.Unmarshal(body, &members) != nil {
		return k, &bodyError{Message: "the request body must be a JSON object"}
	}
	// In a fixed order, so that the first problem named does not vary.
	names := make([]string, 0, len(members))
	for name := range members {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if !slices.Contains(keyFields, name) {
			return k, &bodyError{Message: fmt.Sprintf("unknown member %q; a key has %s", clip(name, 64), strings.Join(keyFields, ", ")), Param: clip(name, 64)}
		}
		if !create && slices.Contains(createOnly, name) {
			return k, &bodyError{Message: name + " is set when a key is created and cannot be changed", Param: name}
		}
	}
	var err error
	for _, f := range []struct {
		name string
		max  int
		to   **string
	}{{"owner", maxOwnerChars, &k.Owner}, {"name", maxKeyNameChars, &k.Name}, {"scope", 16, &k.Scope}} {
		if raw, ok := members[f.name]; ok {
			if *f.to, err = textMember(f.name, raw, f.max); err != nil {
				return k, err
			}
		}
	}
	if k.Scope != nil && !models.ValidScope(*k.Scope) {
		return k, &bodyError{Message: fmt.Sprintf("scope must be %q or %q", models.ScopeInference, models.ScopeAdmin), Param: "scope"}
	}
	if raw, ok := members["expires_in"]; ok {
		if k.Expires, err = expiresMember(raw); err != nil {
			return k, err
		}
	}
	if raw, ok := members["rpm"]; ok {
		if k.RPM, err = rpmMember(raw, maxRPM); err != nil {
			return k, err
		}
	}
	if raw, ok := members["budget"]; ok {
		k.HasBudget = true
		if k.Budget, err = budgetMember(raw); err != nil {
			return k, err
		}
	}
	if raw, ok := members["budget_period"]; ok && !isNull(raw) {
		var p string
		if json.Unmarshal(raw, &p) != nil || !models.ValidBudgetPeriod(p) {
			return k, &bodyError{Message: fmt.Sprintf("budget_period must be %q, %q or %q", models.BudgetDay, models.BudgetMonth, models.BudgetTotal),
				Param: "budget_period"}
		}
		k.Period = &p
	}
	if raw, ok := members["models"]; ok {
		k.HasModels = true
		if k.Models, err = modelsMember(raw); err != nil {
			return k, err
		}
	}
	return k, nil
}

func isNull(raw json.RawMessage) bool { return string(raw) == "null" }

// textMember reads a required string member: trimmed, not empty, at most
// max characters, no control or invisible formatting characters (it is
// shown in lists and the audit log).
func textMember(name string, raw json.RawMessage, max int) (*string, error) {
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return nil, &bodyError{Message: name + " must be a string", Param: name}
	}
	s = strings.TrimSpace(s)
	switch {
	case s == "":
		return nil, &bodyError{Message: name + " must not be empty", Param: name}
	case utf8.RuneCountInString(s) > max:
		return nil, &bodyError{Message: fmt.Sprintf("%s is too long (at most %d characters)", name, max), Param: name}
	case hasControlChar(s):
		return nil, &bodyError{Message: name + " must not contain control characters", Param: name}
	}
	return &s, nil
}

// expiresMember reads expires_in: seconds (an integer), or a duration
// such as "720h" or "30d"; null is no expiry. At most ten years.
func expiresMember(raw json.RawMessage) (time.Duration, error) {
	bad := &bodyError{Message: `expires_in must be a number of seconds or a duration such as "720h" or "30d", ` +
		"more than 0 and at most 3650 days (null: never)", Param: "expires_in"}
	if isNull(raw) {
		return 0, nil
	}
	var d time.Duration
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if days, ok := strings.CutSuffix(s, "d"); ok {
			n, err := strconv.Atoi(days)
			if err != nil || n <= 0 || n > 3650 {
				return 0, bad
			}
			d = time.Duration(n) * day
		} else {
			var err error
			if d, err = time.ParseDuration(s); err != nil {
				return 0, bad
			}
		}
	} else {
		n, err := strconv.ParseInt(string(raw), 10, 64)
		if err != nil || n <= 0 || n > int64(maxExpiresIn/time.Second) {
			return 0, bad
		}
		d = time.Duration(n) * time.Second
	}
	if d <= 0 || d > maxExpiresIn {
		return 0, bad
	}
	return d, nil
}

// rpmMember reads rpm: an integer from 0 to maxRPM (0 and null: the
// configured default).
func rpmMember(raw json.RawMessage, maxRPM int) (*int, error) {
	n := 0
	if !isNull(raw) {
		v, err := strconv.ParseInt(string(raw), 10, 64)
		if err != nil || v < 0 || v > int64(maxRPM) {
			return nil, &bodyError{Message: fmt.Sprintf("rpm must be a whole number from 0 (the configured default) to %d", maxRPM), Param: "rpm"}
		}
		n = int(v)
	}
	return &n, nil
}

// budgetMember reads budget: an amount in currency units, as a string
// ("25.50") or a number (25.5) written as plain decimals, at most nine
// of them, no exponent, not negative; null is no budget. The text is read,
// never a float, so the amount is exact.
func budgetMember(raw json.RawMessage) (*int64, error) {
	if isNull(raw) {
		return nil, nil
	}
	text := string(raw)
	var s string
	if json.Unmarshal(raw, &s) == nil {
		text = s
	} else if len(raw) == 0 || (raw[0] != '-' && (raw[0] < '0' || raw[0] > '9')) {
		text = "" // not a number either: refused below
	}
	if text == "" || len(text) > maxAmountChars {
		return nil, &bodyError{Message: amountProblemAPI, Param: "budget"}
	}
	n, err := money.Parse(text)
	if err != nil {
		return nil, &bodyError{Message: amountProblemAPI, Param: "budget"}
	}
	return &n, nil
}

const amountProblemAPI = `budget must be an amount in the currency such as "25" or "2.50" (a string or a number): ` +
	"digits with at most 9 decimals, not negative, no exponent; null for no budget"

// modelsMember reads models: an array of model names; null or [] is every
// model. The names are checked as every model list is
// (models.ParseModelList), that they exist by the handler.
func modelsMember(raw json.RawMessage) ([]string, error) {
	if isNull(raw) {
		return nil, nil
	}
	var names []string
	if json.Unmarshal(raw, &names) != nil {
		return nil, &bodyError{Message: "models must be an array of model names (null or [] for every model)", Param: "models"}
	}
	if len(names) == 0 {
		return nil, nil
	}
	if len(names) > models.MaxModelNames {
		return nil, &bodyError{Message: fmt.Sprintf("models names more than %d models", models.MaxModelNames), Param: "models"}
	}
	for _, n := range names {
		if strings.Contains(n, ",") || strings.TrimSpace(n) == "" {
			return nil, &bodyError{Message: "a model name must not be empty nor contain a comma", Param: "models"}
		}
	}
	parsed, err := models.ParseModelList(strings.Join(names, ","))
	if err != nil {
		reason := strings.TrimPrefix(err.Error(), models.ErrInvalid.Error()+" model list: ")
		return nil, &bodyError{Message: "models refused: " + clip(reason, 200), Param: "models"}
	}
	return parsed, nil
}

// clip cuts s to at most n characters, marking the cut.
func clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n]) + "…"
}

// hasControlChar reports a control or invisible formatting character (a
// bidirectional override would make a name in a list read as another).
func hasControlChar(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) })
}
