package web_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"moonji/internal/testdb"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"moonji/internal/apikey"
	"moonji/internal/config"
	"moonji/internal/mockllm"
	"moonji/models"
	"moonji/web"
)

// fixtures holds raw recordings of a real engine (Ollama 0.17.4), copied
// from shared/fixtures.
const fixtures = "../testdata/ollama-0.17.4"

// testEnv is one gateway in front of one mock engine, over real HTTP.
type testEnv struct {
	t       testing.TB
	srv     *web.Server
	URL     string
	Mock    *mockllm.Server
	MockURL string
	Key     string
	DB      *gorm.DB
}

type envOption func(*config.Config)

// serverHooks holds, by configuration, what withHook asks to run on the
// server before it serves.
var serverHooks sync.Map // *config.Config → []func(*web.Server)

// withHook runs h on the server after it is assembled and before it
// serves (a test adds a route of its own).
func withHook(h func(*web.Server)) envOption {
	return func(c *config.Config) {
		var hooks []func(*web.Server)
		if v, ok := serverHooks.Load(c); ok {
			hooks = v.([]func(*web.Server))
		}
		serverHooks.Store(c, append(hooks, h))
	}
}

// databases lists the database URLs every gateway test runs against:
// SQLite always, PostgreSQL too when MOONJI_TEST_POSTGRES_DSN is set.
func databases(t *testing.T) map[string]func(t *testing.T) string {
	dbs := map[string]func(t *testing.T) string{
		"sqlite": func(t *testing.T) string { return "sqlite://" + t.TempDir() + "/moonji.db" },
	}
	if dsn := os.Getenv("MOONJI_TEST_POSTGRES_DSN"); dsn != "" {
		dbs["postgres"] = func(t *testing.T) string { return freshPostgresSchema(t, dsn) }
	}
	return dbs
}

// freshPostgresSchema creates a schema of its own for one test and returns a
// URL whose search_path points at it.
func freshPostgresSchema(t *testing.T, dsn string) string {
	t.Helper()
	return testdb.PostgresSchema(t, dsn)
}

// eachDatabase runs fn once per database.
//
// The databases' runs go side by side: each has a gateway, a mock engine and
// a database of its own, and most of a run is waiting, so two at once take
// about the time of one. A test that measures the whole process (its heap,
// its goroutines) uses eachDatabaseInTurn instead.
func eachDatabase(t *testing.T, fn func(t *testing.T, dbURL string)) {
	for name, mk := range databases(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, mk(t))
		})
	}
}

// eachDatabaseInTurn runs fn once per database, one run after the other.
func eachDatabaseInTurn(t *testing.T, fn func(t *testing.T, dbURL string)) {
	for name, mk := range databases(t) {
		t.Run(name, func(t *testing.T) { fn(t, mk(t)) })
	}
}

func startEnv(t *testing.T, dbURL string, opts ...envOption) *testEnv {
	t.Helper()
	return startEnvReplaying(t, dbURL, fixtures, opts...)
}

// startEnvReplaying is startEnv with the mock engine replaying the
// recordings of dir ("mock": {"replay": name}).
func startEnvReplaying(t *testing.T, dbURL, dir string, opts ...envOption) *testEnv {
	t.Helper()
	mock := mockllm.New(mockllm.Options{Models: []string{"m1", "mock", "upstream-name"}, ReplayDir: dir,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ms := httptest.NewServer(mock)
	t.Cleanup(ms.Close)
	cfg := &config.Config{
		Listen:      "127.0.0.1:0",
		DatabaseURL: dbURL,
		RateLimit:   config.RateLimit{RequestsPerMinute: 100000},
		Backends: []config.Backend{{Name: "mock", URL: ms.URL + "/v1", MaxConcurrency: 64, MaxQueue: 64,
			QueueTimeout: 5 * time.Second}},
		Models: []config.Model{{Name: "m1", Backend: "mock"}, {Name: "renamed", Backend: "mock", UpstreamModel: "upstream-name"}},
	}
	for _, o := range opts {
		o(cfg)
	}
	return startWithConfig(t, cfg, mock, ms.URL)
}

// recordings writes made-up engine recordings (name → bytes) into a
// directory of their own, for startEnvReplaying.
func recordings(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func startWithConfig(t testing.TB, cfg *config.Config, mock *mockllm.Server, mockURL string) *testEnv {
	t.Helper()
	ln, err := netListen()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Listen = ln.Addr().String()
	cfg.PublicURL = "http://" + cfg.Listen
	if cfg.JournalDir == "" && !strings.HasPrefix(cfg.DatabaseURL, "sqlite://") {
		cfg.JournalDir = t.TempDir() // not data/journal under web/
	}
	if err := loadDefaults(cfg); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	srv, err := web.New(context.Background(), cfg, log)
	if err != nil {
		t.Fatalf("start gateway: %v", err)
	}
	if hooks, ok := serverHooks.LoadAndDelete(cfg); ok {
		for _, h := range hooks.([]func(*web.Server)) {
			h(srv)
		}
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Shutdown(2 * time.Second) })
	e := &testEnv{t: t, srv: srv, URL: "http://" + ln.Addr().String(), Mock: mock, MockURL: mockURL, DB: srv.DB}
	e.Key = e.newKey("owner@example.com", 0)
	return e
}

// newKey issues a key for email with an optional rpm override.
func (e *testEnv) newKey(email string, rpm int) string {
	e.t.Helper()
	u, err := models.EnsureUser(context.Background(), e.DB, email)
	if err != nil {
		e.t.Fatal(err)
	}
	secret, _, err := apikey.Create(context.Background(), e.DB, u.ID, "test", 0, rpm)
	if err != nil {
		e.t.Fatal(err)
	}
	return secret
}

// post sends a chat completion request with the env's key.
func (e *testEnv) post(body string) *http.Response {
	e.t.Helper()
	return e.postWith(context.Background(), e.Key, body)
}

func (e *testEnv) postWith(ctx context.Context, key, body string) *http.Response {
	e.t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.URL+"/v1/chat/completions", stringsReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatalf("POST /v1/chat/completions: %v", err)
	}
	return resp
}

// row waits until the ledger row of id satisfies done (the final write of a
// stream lands just after the client has read its end).
func (e *testEnv) row(id string, done func(*models.Usage) bool) *models.Usage {
	e.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_ = e.srv.Ledger.Flush(context.Background())
		u, err := models.UsageByID(context.Background(), e.DB, id)
		if err == nil && (done == nil || done(u)) {
			return u
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("usage row %s: not as expected after 5s (last: %+v, err %v)", id, u, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// final waits for the row of id to leave the pending state.
func (e *testEnv) final(id string) *models.Usage {
	return e.row(id, func(u *models.Usage) bool { return u.Outcome != models.OutcomePending })
}

func (e *testEnv) countRows() int64 {
	_ = e.srv.Ledger.Flush(context.Background())
	var n int64
	if err := e.DB.Model(&models.Usage{}).Count(&n).Error; err != nil {
		e.t.Fatal(err)
	}
	return n
}

func readAll(t testing.TB, r io.Reader) string {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return string(b)
}

func mustFixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(fixtures + "/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func netListen() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }

func loadDefaults(c *config.Config) error { return c.Complete() }

func stringsReader(s string) io.Reader { return strings.NewReader(s) }

// backendDown is a backend nothing listens on.
func backendDown() config.Backend {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	return config.Backend{Name: "down", URL: "http://" + addr + "/v1"}
}

func modelOn(name, backend string) config.Model { return config.Model{Name: name, Backend: backend} }

func revokeAll(t *testing.T, e *testEnv, email string) {
	t.Helper()
	u, err := models.UserByEmail(context.Background(), e.DB, email)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.DB.Model(&models.APIKey{}).Where("user_id = ?", u.ID).Update("revoked_at", time.Now()).Error; err != nil {
		t.Fatal(err)
	}
}

// envInt reads a positive integer from the environment variable name, or
// returns def (the chaos test's size knobs, the bench harnesses').
func envInt(name string, def int) int {
	var n int
	if _, err := fmt.Sscan(os.Getenv(name), &n); err == nil && n > 0 {
		return n
	}
	return def
}

// quietLog is a logger that drops everything.
func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
