package web_test

import (
	"encoding/pem"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/internal/mockllm"
)

// A backend's ca_file reaches its requests and its health probes: an
// engine served over HTTPS with a certificate the system does not trust
// answers through the backend that names its CA, and is refused through
// one of the same url that does not; the first comes back up after a
// failure (its probe trusts the CA), the second's probe fails on the
// certificate.
func TestBackendCAFile(t *testing.T) {
	mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	engine := httptest.NewUnstartedServer(mock)
	engine.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes are the test's
	engine.StartTLS()
	t.Cleanup(engine.Close)
	// httptest's certificate is self-signed: it is its own CA.
	caFile := filepath.Join(t.TempDir(), "engine-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: engine.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := &config.Config{
		DatabaseURL: "sqlite://" + t.TempDir() + "/m.db",
		RateLimit:   config.RateLimit{RequestsPerMinute: 100000},
		Health:      config.Health{Backoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond, ProbeTimeout: 2 * time.Second},
		Backends: []config.Backend{
			{Name: "private", URL: engine.URL + "/v1", CAFile: caFile},
			{Name: "plain", URL: engine.URL + "/v1"},
		},
		Models: []config.Model{{Name: "m1", Backend: "private"}, {Name: "via-plain", Backend: "plain", UpstreamModel: "m1"}},
	}
	e := startWithConfig(t, cfg, mock, engine.URL)

	resp := e.post(`{"model":"m1","messages":[{"role":"user","content":"hi"}]}`)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("through the backend with ca_file: %d %s", resp.StatusCode, body)
	}
	resp = e.post(`{"model":"via-plain","messages":[{"role":"user","content":"hi"}]}`)
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("through the backend without ca_file: %d %s, want 502", resp.StatusCode, body)
	}

	plain, private := e.srv.Health["plain"], e.srv.Health["private"]
	plain.Failed("test") // a no-op if the refused request already took it down
	waitFor(t, "the plain backend's probe refuses the certificate", 5*time.Second, func() bool {
		return strings.Contains(plain.State().ProbeError, "certificate")
	}, func() { t.Logf("plain: %+v", plain.State()) })
	private.Failed("test")
	waitFor(t, "the backend with ca_file is probed back up", 5*time.Second, private.Up,
		func() { t.Logf("private: %+v", private.State()) })
}
