package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestEmbeddedDefault(t *testing.T) {
	for _, k := range []string{"MOONJI_LISTEN", "MOONJI_DATABASE_URL", "MOONJI_REDIS_URL", "MOONJI_PUBLIC_URL"} {
		t.Setenv(k, "")
		os.Unsetenv(k)
	}
	c, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:8080" || c.DatabaseURL != "sqlite://data/moonji.db" || c.RedisURL != "" ||
		c.RateLimit.RequestsPerMinute != 60 || c.OIDC != nil {
		t.Errorf("default = %+v", c)
	}
	if len(c.Models) != 1 || c.Models[0].Name != DemoModel || c.Backends[0].Kind != KindBuiltin || c.Backends[0].TokensPerSecond != 30 {
		t.Errorf("default models/backends = %+v / %+v", c.Models, c.Backends)
	}
}

func TestFileAndEnvironment(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.yaml")
	os.WriteFile(path, []byte(`listen: 127.0.0.1:9000
database_url: postgres://u@db/moonji
rate_limit: {requests_per_minute: 10, tokens_per_minute: 5000}
backends:
  - {name: vllm, kind: openai, url: http://127.0.0.1:8000/v1, max_concurrency: 16, max_queue: 32, queue_timeout: 30s}
  - {name: ollama, url: http://127.0.0.1:11434/v1, max_concurrency: 1, max_queue: 16}
models:
  - {name: qwen3-8b, backend: vllm, upstream_model: Qwen/Qwen3-8B}
  - {name: llama, backend: ollama}
`), 0o600)
	t.Setenv("MOONJI_LISTEN", "127.0.0.1:9100")
	t.Setenv("MOONJI_REDIS_URL", "redis://127.0.0.1:6379/2")
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != "127.0.0.1:9100" || c.RedisURL != "redis://127.0.0.1:6379/2" || c.DatabaseURL != "postgres://u@db/moonji" {
		t.Errorf("env overrides: %+v", c)
	}
	b := c.Backends[1]
	if b.Kind != KindOpenAI || b.MaxConcurrency != 1 || b.MaxQueue != 16 || b.QueueTimeout != 30*time.Second {
		t.Errorf("ollama backend = %+v", b)
	}
	if c.Models[0].UpstreamModel != "Qwen/Qwen3-8B" || c.RateLimit.TokensPerMinute != 5000 {
		t.Errorf("models = %+v", c.Models)
	}
	if c.PublicURL != "http://127.0.0.1:9100" || !strings.HasSuffix(c.ReplicaID, "/127.0.0.1:9100") {
		t.Errorf("derived: public %q replica %q", c.PublicURL, c.ReplicaID)
	}
}

func TestValidationNamesTheKey(t *testing.T) {
	cases := map[string]string{
		"listen: nowhere":                       "listen: want host:port",
		"database_url: mysql://x":               "database_url: want sqlite://PATH or postgres://",
		"redis_url: localhost:6379":             "redis_url: want redis://",
		"rate_limit: {requests_per_minute: -1}": "rate_limit.requests_per_minute: must not be negative",
		"backends: [{name: a, url: ftp://x}]\nmodels: [{name: m, backend: a}]":                            "backends[0].url: want an absolute http(s) URL",
		"backends: [{name: a, kind: magic}]\nmodels: [{name: m, backend: a}]":                             `backends[0].kind: unknown kind "magic"`,
		"backends: [{name: a, url: http://x/v1}, {name: a, url: http://y/v1}]":                            `backends[1].name: duplicate backend "a"`,
		"backends: [{name: a, url: http://x/v1}]\nmodels: [{name: m, backend: a}, {name: m, backend: a}]": `models[1].name: duplicate model "m"`,
		"backends: [{name: a, url: http://x/v1, max_concurrency: -2}]":                                    "backends[0].max_concurrency: must be at least 1",
		"listen: 0.0.0.0:8080":            "dev_idp: the embedded development login provider refuses",
		"oidc: {client_id: x}":            "oidc.issuer: is required",
		"stop: {ttl: 1m}\nunknown_key: 1": "unknown_key",
	}
	for yaml, want := range cases {
		path := filepath.Join(t.TempDir(), "m.yaml")
		os.WriteFile(path, []byte(yaml), 0o600)
		_, err := Load(path)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: err = %v, want it to contain %q", yaml, err, want)
		}
	}
	// Deliberately allowed.
	path := filepath.Join(t.TempDir(), "ok.yaml")
	os.WriteFile(path, []byte("listen: 0.0.0.0:8080\ndev_idp: {allow_non_loopback: true}\n"), 0o600)
	if _, err := Load(path); err != nil {
		t.Errorf("allow_non_loopback: %v", err)
	}
}

func TestDatabaseDriverHidesPasswords(t *testing.T) {
	_, _, err := DatabaseDriver("mysql://root:hunter2@db/x")
	if err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("err = %v", err)
	}
}

func TestMaxQueueZeroMeansNoQueue(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.yaml")
	os.WriteFile(path, []byte("backends:\n  - {name: a, url: http://x/v1, max_queue: 0}\n  - {name: b, url: http://y/v1}\nmodels: [{name: m, backend: a}]\n"), 0o600)
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Backends[0].MaxQueue != 0 || c.Backends[1].MaxQueue != 32 {
		t.Errorf("max_queue: explicit 0 → %d, missing → %d; want 0 and 32", c.Backends[0].MaxQueue, c.Backends[1].MaxQueue)
	}
	os.WriteFile(path, []byte("backends:\n  - {name: a, url: http://x/v1, max_queu: 3}\n"), 0o600)
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), "max_queu") {
		t.Errorf("a misspelt backend key must be refused: %v", err)
	}
}

// The shipped example loads, and documents every key the code knows.
func TestExampleDocumentsEveryKey(t *testing.T) {
	const example = "../../moonji.example.yaml"
	if _, err := Load(example); err != nil {
		t.Fatalf("the example does not load: %v", err)
	}
	raw, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range yamlKeys(reflect.TypeOf(Config{})) {
		if !strings.Contains(string(raw), key+":") {
			t.Errorf("moonji.example.yaml does not mention %q", key)
		}
	}
}

func yamlKeys(t reflect.Type) []string {
	var keys []string
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name := strings.Split(f.Tag.Get("yaml"), ",")[0]
		if name == "" || name == "-" {
			continue
		}
		keys = append(keys, name)
		ft := f.Type
		for ft.Kind() == reflect.Pointer || ft.Kind() == reflect.Slice {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct && ft != reflect.TypeOf(time.Time{}) {
			keys = append(keys, yamlKeys(ft)...)
		}
	}
	return keys
}

// engine.token comes from the file, and MOONJI_ENGINE_TOKEN overrides it.
func TestEngineToken(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.yaml")
	os.WriteFile(path, []byte("engine: {token: from-file}\n"), 0o600)
	t.Setenv("MOONJI_ENGINE_TOKEN", "")
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Engine.Token != "from-file" {
		t.Errorf("engine.token = %q, want from-file", c.Engine.Token)
	}
	t.Setenv("MOONJI_ENGINE_TOKEN", "from-env")
	if c, err = Load(path); err != nil {
		t.Fatal(err)
	}
	if c.Engine.Token != "from-env" {
		t.Errorf("with MOONJI_ENGINE_TOKEN: engine.token = %q, want from-env", c.Engine.Token)
	}
}

// TestSeveralBackendsPerModel: the backends form, weights, and the errors
// that name the key.
func TestSeveralBackendsPerModel(t *testing.T) {
	load := func(body string) (*Config, error) {
		path := filepath.Join(t.TempDir(), "m.yaml")
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return Load(path)
	}
	const backends = `backends:
  - {name: a, url: http://127.0.0.1:8000/v1}
  - {name: b, url: http://127.0.0.1:8001/v1, weight: 2.5}
`
	c, err := load(backends + "models:\n  - {name: m, backends: [a, b]}\n  - {name: n, backend: a}\n")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Models[0].BackendNames(); !reflect.DeepEqual(got, []string{"a", "b"}) {
		t.Errorf("backends form = %v", got)
	}
	if got := c.Models[1].BackendNames(); !reflect.DeepEqual(got, []string{"a"}) {
		t.Errorf("backend form = %v", got)
	}
	if c.Backends[0].Weight != 1 || c.Backends[1].Weight != 2.5 {
		t.Errorf("weights = %v, %v", c.Backends[0].Weight, c.Backends[1].Weight)
	}
	if c.LeaseTTL != 10*time.Second || c.Health.Backoff != time.Second || c.Health.MaxBackoff != 30*time.Second {
		t.Errorf("defaults: lease_ttl %s health %+v", c.LeaseTTL, c.Health)
	}
	if got := c.ServedBy("b"); !reflect.DeepEqual(got, []string{"m"}) {
		t.Errorf("ServedBy(b) = %v", got)
	}
	for _, tc := range []struct{ models, want string }{
		{"  - {name: m, backend: a, backends: [a, b]}", "models[0]: give backend or backends, not both"},
		{"  - {name: m, backends: [a, c]}", `models[0].backends[1]: unknown backend "c"`},
		{"  - {name: m, backends: [a, a]}", `models[0].backends[1]: backend "a" listed twice`},
		{"  - {name: m}", `models[0].backend: unknown backend ""`},
	} {
		_, err := load(backends + "models:\n" + tc.models + "\n")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.models, err, tc.want)
		}
	}
	for _, tc := range []struct{ extra, want string }{
		{"  - {name: w, url: http://127.0.0.1:1/v1, weight: -1}\n", "backends[2].weight: must be above 0"},
		{"  - {name: w, url: http://127.0.0.1:1/v1, weight: 1e9}\n", "backends[2].weight: must be above 0 and at most 1000"},
	} {
		_, err := load(backends + tc.extra + "models:\n  - {name: m, backend: a}\n")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: err = %v, want %q", tc.extra, err, tc.want)
		}
	}
	_, err = load("lease_ttl: 100ms\n" + backends + "models:\n  - {name: m, backend: a}\n")
	if err == nil || !strings.Contains(err.Error(), "lease_ttl") {
		t.Errorf("lease_ttl 100ms: err = %v", err)
	}
}

// A backend's ca_file must be a readable file holding a PEM certificate,
// on an openai backend whose url is https.
func TestCAFile(t *testing.T) {
	dir := t.TempDir()
	// A real certificate, so that the check parses it as the client will.
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "ca"}, IsCA: true,
		BasicConstraintsValid: true, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	good := filepath.Join(dir, "ca.pem")
	os.WriteFile(good, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	notPEM := filepath.Join(dir, "ca.der")
	os.WriteFile(notPEM, der, 0o600)

	load := func(backend string) (*Config, error) {
		path := filepath.Join(t.TempDir(), "m.yaml")
		os.WriteFile(path, []byte("backends:\n  - "+backend+"\nmodels: [{name: m, backend: a}]\n"), 0o600)
		return Load(path)
	}
	c, err := load("{name: a, url: https://engine.internal/v1, ca_file: " + good + "}")
	if err != nil {
		t.Fatal(err)
	}
	if c.Backends[0].CAFile != good {
		t.Errorf("ca_file = %q", c.Backends[0].CAFile)
	}
	for _, tc := range []struct{ backend, want string }{
		{"{name: a, url: https://engine.internal/v1, ca_file: " + filepath.Join(dir, "missing.pem") + "}", "backends[0].ca_file: open "},
		{"{name: a, url: https://engine.internal/v1, ca_file: " + notPEM + "}", "backends[0].ca_file: " + notPEM + " holds no PEM certificate"},
		{"{name: a, url: http://engine.internal/v1, ca_file: " + good + "}", "backends[0].ca_file: is for an openai backend whose url is https"},
		{"{name: a, kind: engine, url: wss://engine.internal/engine, ca_file: " + good + "}", "backends[0].ca_file: is for an openai backend"},
	} {
		if _, err := load(tc.backend); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.backend, err, tc.want)
		}
	}
}
