package audit

import (
	"fmt"
	"strings"
	"time"

	"moonji/internal/money"
)

// How events name their targets and values, the same from the pages and
// the command line, so that a filter on "key 42" or "team 3" finds both.

// KeyTarget names a key: `key 42 "laptop" of a@b.c`. Never its secret,
// nor its prefix: the id is what every page and command names it by.
func KeyTarget(id uint, name, owner string) string {
	return fmt.Sprintf("key %d %q of %s", id, name, owner)
}

// PersonTarget names a person: "person a@b.c".
func PersonTarget(email string) string { return "person " + email }

// TeamTarget names a team: `team 3 "Research"`.
func TeamTarget(id uint, name string) string { return fmt.Sprintf("team %d %q", id, name) }

// ShareTarget names a share link by its conversation, never by its token
// (the token is the link: whoever reads it may open the conversation).
func ShareTarget(conversationID, title string) string {
	return fmt.Sprintf("share of conversation %s %q", conversationID, title)
}

// Budget is a budget as details show it: "5.00 USD/month", "none".
func Budget(amount *int64, period, currency string) string {
	if amount == nil {
		return "none"
	}
	return strings.TrimSpace(money.FormatShort(*amount)+" "+currency) + "/" + period
}

// Models is a model list as details show it: "all" for none.
func Models(list string) string {
	if list == "" {
		return "all"
	}
	return list
}

// RPM is a key's requests per minute: "default" for 0.
func RPM(n int) string {
	if n == 0 {
		return "default"
	}
	return fmt.Sprint(n)
}

// KeyCreated is a new key's limits, as its event's detail.
func KeyCreated(rpm int, expires *time.Time, budget *int64, period, models, currency string) string {
	var ch Changes
	ch.Note("rpm %s", RPM(rpm))
	if expires != nil {
		ch.Note("expires %s", expires.UTC().Format(time.RFC3339))
	} else {
		ch.Note("expires never")
	}
	if budget != nil {
		ch.Note("budget %s", Budget(budget, period, currency))
	}
	if models != "" {
		ch.Note("models %s", models)
	}
	return ch.String()
}
