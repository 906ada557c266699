// Package reload tells what a configuration reload changes: the version of
// a configuration file, and what differs between the running configuration
// and a new one — what the gateway applies while it runs (backends, models,
// prices, limits) and what only a restart can change (listen address,
// database, Redis, sign-in, …).
//
// It decides nothing about how a change is applied: the gateway's assembly
// (web.Server.Reload) swaps its routing table and admission limits.
package reload

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"moonji/internal/config"
)

// Version names one loaded configuration: the first 12 hex digits of the
// SHA-256 of the file's bytes (the same file gives the same id on every
// replica) and when this replica loaded it.
type Version struct {
	ID       string
	LoadedAt time.Time
}

// NewVersion is the version of the file bytes raw, loaded at at.
func NewVersion(raw []byte, at time.Time) Version {
	sum := sha256.Sum256(raw)
	return Version{ID: hex.EncodeToString(sum[:])[:12], LoadedAt: at.UTC()}
}

// String is "id (loaded RFC 3339 time)".
func (v Version) String() string {
	return v.ID + " (loaded " + v.LoadedAt.Format(time.RFC3339) + ")"
}

// Changes is what differs between two configurations.
type Changes struct {
	BackendsAdded, BackendsRemoved, BackendsChanged []string
	ModelsAdded, ModelsRemoved, ModelsChanged       []string
	// RateLimit tells that the default per-key requests or tokens per
	// minute changed.
	RateLimit bool
	// Restart names the settings (their YAML keys) that differ but take
	// effect only when the gateway restarts.
	Restart []string
}

// Applied tells whether anything the running gateway applies changed.
func (c Changes) Applied() bool {
	return len(c.BackendsAdded)+len(c.BackendsRemoved)+len(c.BackendsChanged)+
		len(c.ModelsAdded)+len(c.ModelsRemoved)+len(c.ModelsChanged) > 0 || c.RateLimit
}

// Summary says what changed in one line, e.g. "backends +1 −0 (added: b2);
// models changed: llama3; needs a restart: listen".
func (c Changes) Summary() string {
	var parts []string
	if n := len(c.BackendsAdded) + len(c.BackendsRemoved) + len(c.BackendsChanged); n > 0 {
		p := fmt.Sprintf("backends +%d −%d", len(c.BackendsAdded), len(c.BackendsRemoved))
		var names []string
		for _, l := range []struct {
			what  string
			names []string
		}{{"added", c.BackendsAdded}, {"removed", c.BackendsRemoved}, {"changed", c.BackendsChanged}} {
			if len(l.names) > 0 {
				names = append(names, l.what+": "+strings.Join(l.names, ", "))
			}
		}
		parts = append(parts, p+" ("+strings.Join(names, "; ")+")")
	}
	for _, l := range []struct {
		what  string
		names []string
	}{{"models added", c.ModelsAdded}, {"models removed", c.ModelsRemoved}, {"models changed", c.ModelsChanged}} {
		if len(l.names) > 0 {
			parts = append(parts, l.what+": "+strings.Join(l.names, ", "))
		}
	}
	if c.RateLimit {
		parts = append(parts, "rate limit changed")
	}
	if len(parts) == 0 {
		parts = append(parts, "nothing to apply")
	}
	if len(c.Restart) > 0 {
		parts = append(parts, "needs a restart (not applied): "+strings.Join(c.Restart, ", "))
	}
	return strings.Join(parts, "; ")
}

// Compare tells what changes from old to new.
func Compare(old, new *config.Config) Changes {
	var c Changes
	oldB, newB := map[string]config.Backend{}, map[string]config.Backend{}
	for _, b := range old.Backends {
		oldB[b.Name] = b
	}
	for _, b := range new.Backends {
		newB[b.Name] = b
		if o, ok := oldB[b.Name]; !ok {
			c.BackendsAdded = append(c.BackendsAdded, b.Name)
		} else if !SameBackend(o, b) || !slices.Equal(old.ServedBy(b.Name), new.ServedBy(b.Name)) && b.Kind == config.KindBuiltin {
			c.BackendsChanged = append(c.BackendsChanged, b.Name)
		}
	}
	for _, b := range old.Backends {
		if _, ok := newB[b.Name]; !ok {
			c.BackendsRemoved = append(c.BackendsRemoved, b.Name)
		}
	}
	oldM := map[string]config.Model{}
	for _, m := range old.Models {
		oldM[m.Name] = m
	}
	newM := map[string]bool{}
	for _, m := range new.Models {
		newM[m.Name] = true
		if o, ok := oldM[m.Name]; !ok {
			c.ModelsAdded = append(c.ModelsAdded, m.Name)
		} else if !reflect.DeepEqual(o, m) {
			c.ModelsChanged = append(c.ModelsChanged, m.Name)
		}
	}
	for _, m := range old.Models {
		if !newM[m.Name] {
			c.ModelsRemoved = append(c.ModelsRemoved, m.Name)
		}
	}
	c.RateLimit = old.RateLimit.RequestsPerMinute != new.RateLimit.RequestsPerMinute ||
		old.RateLimit.TokensPerMinute != new.RateLimit.TokensPerMinute
	c.Restart = restartOnly(old, new)
	return c
}

// SameBackend tells whether two backends of one name are the same engine
// reached the same way, limits aside: the running one then stays, its
// connections and health with it, and only its limits change.
func SameBackend(a, b config.Backend) bool {
	return a.Kind == b.Kind && a.URL == b.URL && a.APIKey == b.APIKey && a.CAFile == b.CAFile &&
		slices.Equal(a.APIs, b.APIs) && a.TokensPerSecond == b.TokensPerSecond && a.Link == b.Link &&
		a.MaxConcurrency == b.MaxConcurrency && a.MaxQueue == b.MaxQueue && a.QueueTimeout == b.QueueTimeout &&
		a.Timeout == b.Timeout && a.Weight == b.Weight
}

// SameEngine is SameBackend without the limits.
func SameEngine(a, b config.Backend) bool {
	a.MaxConcurrency, a.MaxQueue, a.QueueTimeout, a.Timeout, a.Weight = b.MaxConcurrency, b.MaxQueue, b.QueueTimeout, b.Timeout, b.Weight
	return SameBackend(a, b)
}

// applied are the top-level keys a reload applies; engine is `moonji
// engine`'s, which the gateway ignores.
var applied = map[string]bool{"backends": true, "models": true, "engine": true}

// restartOnly names the top-level settings (and rate_limit's and keys'
// fields) that differ and that the gateway reads only at start.
func restartOnly(old, new *config.Config) []string {
	a, b := *old, *new
	// The default per-key limits apply; the unauthenticated one, read by
	// the sign-in's limiter at start, does not. keys.max_rpm defaults to
	// requests_per_minute: a default that follows it is no change.
	a.RateLimit.RequestsPerMinute, a.RateLimit.TokensPerMinute = 0, 0
	b.RateLimit.RequestsPerMinute, b.RateLimit.TokensPerMinute = 0, 0
	if old.Keys.MaxRPM == old.RateLimit.RequestsPerMinute && new.Keys.MaxRPM == new.RateLimit.RequestsPerMinute {
		a.Keys.MaxRPM, b.Keys.MaxRPM = 0, 0
	}
	var out []string
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	t := va.Type()
	for i := range t.NumField() {
		key := strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0]
		if key == "" || applied[key] {
			continue
		}
		if !reflect.DeepEqual(va.Field(i).Interface(), vb.Field(i).Interface()) {
			out = append(out, key)
		}
	}
	return out
}

// By is who asked for a reload: "system" for SIGHUP, or an admin (email,
// id and client address) for the admin page's button.
type By struct {
	Actor   string
	ActorID uint
	Address string
}

// Result is what a reload did: the version before and after (the same
// when it was refused) and what changed.
type Result struct {
	Old, New Version
	Changes  Changes
}
