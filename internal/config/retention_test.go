package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestRetention(t *testing.T) {
	load := func(t *testing.T, body string) (*Config, error) {
		path := filepath.Join(t.TempDir(), "m.yaml")
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return Load(path)
	}
	c, err := load(t, "listen: 127.0.0.1:9000\n")
	if err != nil {
		t.Fatal(err)
	}
	if c.Retention.Usage != 0 || c.Retention.Conversations != 0 {
		t.Errorf("unset retention must keep forever: %+v", c.Retention)
	}
	for body, want := range map[string]Retention{
		"retention: {usage: 400d, conversations: 0}":       {Usage: Age(400 * 24 * time.Hour)},
		"retention: {usage: 720h, conversations: 30d}":     {Usage: Age(720 * time.Hour), Conversations: Age(30 * 24 * time.Hour)},
		"retention: {usage: \"0\", conversations: 36600d}": {Conversations: Age(36600 * 24 * time.Hour)},
		"retention:\n  usage: 1d\n":                        {Usage: Age(24 * time.Hour)},
		"retention: {usage: 30d, share: 0.2}":              {Usage: Age(30 * 24 * time.Hour), Share: 0.2},
		"retention: {usage: 30d, share: 1}":                {Usage: Age(30 * 24 * time.Hour), Share: 1},
	} {
		c, err := load(t, body)
		if err != nil {
			t.Errorf("%q: %v", body, err)
			continue
		}
		if c.Retention != want {
			t.Errorf("%q: %+v, want %+v", body, c.Retention, want)
		}
	}
	for body, want := range map[string]string{
		"retention: {usage: 400}":                   `want a duration such as 400d`,
		"retention: {usage: 12h}":                   "retention.usage: must be at least 1d",
		"retention: {conversations: -1d}":           `want a duration such as 400d`,
		"retention: {conversations: -48h}":          "retention.conversations: must not be negative",
		"retention: {usage: 99999999999999999999d}": `want a duration such as 400d`,
		"retention: {usage: 36601d}":                "retention.usage: must be at most 36600d",
		"retention: {usage: 1y}":                    `got "1y"`,
		"retention: {usage: [1d]}":                  "want a duration",
		"retention: {usage: 1d, logs: 2d}":          "logs",
		"retention: {share: 0.001}":                 "retention.share: must be between 0.01 and 1",
		"retention: {share: 1.5}":                   "retention.share: must be between 0.01 and 1",
		"retention: {share: -0.1}":                  "retention.share: must be between 0.01 and 1",
		"retention: {share: .nan}":                  "retention.share: must be between 0.01 and 1",
		"retention: {share: .inf}":                  "retention.share: must be between 0.01 and 1",
		"retention: {share: 5%}":                    "cannot unmarshal !!str `5%`",
		"retention: {share: [0.1]}":                 "cannot unmarshal !!seq",
	} {
		if _, err := load(t, body); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: err = %v, want it to contain %q", body, err, want)
		}
	}
}
