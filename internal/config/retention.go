package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Retention says how long the usage ledger and conversations are kept
// (internal/retention). Each 0 (or unset) keeps them forever: deleting a
// deployment's history is something an operator asks for, never a default.
type Retention struct {
	// Usage: ledger rows whose request was created longer ago than this
	// are deleted (the dashboards' and budgets' rollups stay). Later, the
	// audit log too.
	Usage Age `yaml:"usage"`
	// Conversations: conversations whose last message is older than this
	// are deleted with their messages, attachments and share links.
	Conversations Age `yaml:"conversations"`
	// Share is the most of its time a run spends deleting: after a batch
	// that took d it rests d×(1/Share−1). Unset: 0.05 (a twentieth), what
	// kept the p99 of requests served beside a run within 1.5× on SQLite;
	// raise it to clear a backlog sooner at their expense.
	Share float64 `yaml:"share"`
}

// Bounds of retention.share: a run that works less than a hundredth of
// the time would take a week over a backlog a default run clears in hours.
const (
	MinRetentionShare = 0.01
	MaxRetentionShare = 1
)

// Bounds of a retention age: under a day is a typo ("400" meant 400d) that
// would empty the ledger; a hundred years is forever already, and bounds
// the arithmetic.
const (
	MinRetention = 24 * time.Hour
	MaxRetention = 100 * 366 * 24 * time.Hour
)

// Age is a duration written as whole days ("400d") or as a Go duration
// ("720h"); 0 is forever.
type Age time.Duration

// Duration is a as a time.Duration.
func (a Age) Duration() time.Duration { return time.Duration(a) }

// UnmarshalYAML reads 0, "0", "400d" or "720h".
func (a *Age) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		return fmt.Errorf("line %d: want a duration such as 400d or 720h, or 0 for forever", n.Line)
	}
	d, err := ParseAge(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %w", n.Line, err)
	}
	*a = Age(d)
	return nil
}

// ParseAge reads a retention age: "0" (forever), whole days ("400d") or a
// Go duration ("720h"). Its range is checked by Validate.
func ParseAge(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if s == "0" {
		return 0, nil
	}
	bad := fmt.Errorf("want a duration such as 400d or 720h, or 0 for forever, got %q", s)
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseInt(days, 10, 64)
		if err != nil || n < 0 || n > int64(MaxRetention/(24*time.Hour))+1 {
			return 0, bad
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, bad
	}
	return d, nil
}

// validate names what is wrong with r.
func (r Retention) validate(bad func(key, format string, args ...any)) {
	for _, f := range []struct {
		key string
		age Age
	}{{"retention.usage", r.Usage}, {"retention.conversations", r.Conversations}} {
		d := f.age.Duration()
		switch {
		case d == 0:
		case d < 0:
			bad(f.key, "must not be negative (0 keeps forever)")
		case d < MinRetention:
			bad(f.key, "must be at least 1d (0 keeps forever), got %s", d)
		case d > MaxRetention:
			bad(f.key, "must be at most 36600d (0 keeps forever), got %s", d)
		}
	}
	// Written so that NaN fails too.
	if r.Share != 0 && !(r.Share >= MinRetentionShare && r.Share <= MaxRetentionShare) {
		bad("retention.share", "must be between %g and %g (unset: 0.05), got %g", MinRetentionShare, float64(MaxRetentionShare), r.Share)
	}
}
