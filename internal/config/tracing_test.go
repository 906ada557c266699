package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func loadYAML(t *testing.T, yaml string) (*Config, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "m.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return Load(path)
}

func TestTracingConfig(t *testing.T) {
	c, err := loadYAML(t, "listen: 127.0.0.1:9000\n")
	if err != nil {
		t.Fatal(err)
	}
	if c.Tracing.Enabled() || c.Tracing.Ratio() != 1 {
		t.Errorf("default tracing = %+v (enabled %v, ratio %v); want off, ratio 1", c.Tracing, c.Tracing.Enabled(), c.Tracing.Ratio())
	}
	c, err = loadYAML(t, "tracing: {otlp_endpoint: \"http://127.0.0.1:4318\", sample_ratio: 0.25}\n")
	if err != nil {
		t.Fatal(err)
	}
	if !c.Tracing.Enabled() || c.Tracing.OTLPEndpoint != "http://127.0.0.1:4318" || c.Tracing.Ratio() != 0.25 {
		t.Errorf("tracing = %+v", c.Tracing)
	}
	c, err = loadYAML(t, "tracing: {otlp_endpoint: \"https://collector.example:4318/otlp\", sample_ratio: 0}\n")
	if err != nil || c.Tracing.Ratio() != 0 {
		t.Errorf("an explicit ratio of 0 (only sampled parents traced) must load as 0: %v, %+v", err, c)
	}

	// Hostile and wrong values are refused, naming the key; a password in
	// the URL is never echoed.
	for yaml, want := range map[string]string{
		"tracing: {otlp_endpoint: 127.0.0.1:4318}":                       "tracing.otlp_endpoint: want an absolute http(s) URL",
		"tracing: {otlp_endpoint: \"grpc://127.0.0.1:4317\"}":            "tracing.otlp_endpoint: want an absolute http(s) URL",
		"tracing: {otlp_endpoint: \"http://\"}":                          "tracing.otlp_endpoint: want an absolute http(s) URL",
		"tracing: {otlp_endpoint: \"http://u:hunter2@collector\"}":       "tracing.otlp_endpoint: want an absolute http(s) URL",
		"tracing: {otlp_endpoint: \"http://collector:4318/?a=b\"}":       "tracing.otlp_endpoint: want a base URL without query",
		"tracing: {otlp_endpoint: \"http://c:4318\", sample_ratio: 1.5}": "tracing.sample_ratio: must be between 0 and 1",
		"tracing: {sample_ratio: -0.1}":                                  "tracing.sample_ratio: must be between 0 and 1",
		"tracing: {sample_ratio: .nan}":                                  "tracing.sample_ratio: must be between 0 and 1",
		"tracing: {otlp_endpont: \"http://c:4318\"}":                     "otlp_endpont",
	} {
		_, err := loadYAML(t, yaml)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: err = %v, want it to contain %q", yaml, err, want)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("%q: the error shows the password: %v", yaml, err)
		}
	}
}
