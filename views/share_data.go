package views

import (
	"strconv"
	"time"
)

// ShareExpiry is one choice of a new link's lifetime.
type ShareExpiry struct {
	Seconds int // 0: until revoked
	Label   string
}

// ShareExpiries are the lifetimes the Share panel offers (the API takes
// any from a minute to a year).
var ShareExpiries = []ShareExpiry{{0, "Never"}, {3600, "In 1 hour"}, {86400, "In 1 day"}, {7 * 86400, "In 7 days"},
	{30 * 86400, "In 30 days"}, {365 * 86400, "In 1 year"}}

// SharePanel is a conversation's Share panel: the form that makes a link,
// then the link to copy.
type SharePanel struct {
	ConversationID string
	CSRF           string
	// Author is what the page would name the person by, if they choose.
	Author string
	// Expiry and ShowAuthor echo the form.
	Expiry     int
	ShowAuthor bool
	// Public: anyone with the link opens it, not only signed-in people.
	Public bool
	// URL is the link just made, with when it Expires (nil: never).
	URL     string
	Expires *time.Time
	Error   string
}

// SharesPage is /shares: the person's links.
type SharesPage struct {
	Page
	Links  []ShareLink
	Public bool
	Max    int
	Notice string
	Error  string
}

// ShareLink is one of a person's links as their list shows it.
type ShareLink struct {
	Token          string
	URL            string
	ConversationID string
	Title          string
	ShowAuthor     bool
	Created        time.Time
	Expires        *time.Time
	Expired        bool
}

// SharedPage is the page a link opens (/s/{token}): a read-only copy.
type SharedPage struct {
	Title   string
	Created time.Time
	// Author names the person who shared, "" when they chose not to.
	Author   string
	Messages []SharedMessage
}

// SharedMessage is one message of a shared page.
type SharedMessage struct {
	Role   string // user or assistant
	Status string // done or stopped
	Model  string
	// Text is a person's message, shown escaped; HTML an answer rendered
	// from Markdown and sanitized, trusted as is.
	Text string
	HTML string
}

// ShareURL is the path of the share panel of conversation id.
func ShareURL(id string) string { return ConversationURL(id) + "/share" }

// RevokeShareURL is where the shares page's Revoke posts.
func RevokeShareURL(token string) string { return "/shares/" + token + "/revoke" }

func secondsValue(n int) string { return strconv.Itoa(n) }

// day is a date and time for a page read by anyone, in UTC.
func day(t time.Time) string { return t.UTC().Format("2 January 2006") }
