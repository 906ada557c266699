package views

import (
	"net/url"
	"strconv"
	"time"
)

// AuditPage is /admin/audit: the audit log, newest first, filtered.
type AuditPage struct {
	Page
	Filter AuditFilter
	// Actions are the actions the filter offers.
	Actions []string
	Events  []AuditEvent
	// Older is the id the next page starts below (0: no older events).
	Older uint64
	// Error says why the filter was refused (400).
	Error string
}

// AuditFilter is the page's filter as its form shows it.
type AuditFilter struct {
	Action, Actor, Target string
	// From and To are dates, YYYY-MM-DD ("": unbounded); To inclusive.
	From, To string
	// Before is the page's cursor (0: the newest).
	Before uint64
}

// AuditEvent is one row of the audit log.
type AuditEvent struct {
	ID      uint64
	At      time.Time
	Action  string
	Actor   string
	Target  string
	Address string
	Detail  string
}

// query is the filter as a query string, with the cursor before (0: none).
func (f AuditFilter) query(before uint64) url.Values {
	v := url.Values{}
	for _, p := range [][2]string{{"action", f.Action}, {"actor", f.Actor}, {"target", f.Target}, {"from", f.From}, {"to", f.To}} {
		if p[1] != "" {
			v.Set(p[0], p[1])
		}
	}
	if before != 0 {
		v.Set("before", strconv.FormatUint(before, 10))
	}
	return v
}

// Any reports whether the filter narrows the log.
func (f AuditFilter) Any() bool { return len(f.query(0)) > 0 }

// auditURL is the page (path) with the filter and cursor before.
func auditURL(path string, f AuditFilter, before uint64, extra ...string) string {
	v := f.query(before)
	for i := 0; i+1 < len(extra); i += 2 {
		v.Set(extra[i], extra[i+1])
	}
	if len(v) == 0 {
		return path
	}
	return path + "?" + v.Encode()
}
