package web_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"moonji/internal/apikey"
	"moonji/internal/config"
	"moonji/internal/mockllm"
	"moonji/models"
	"moonji/web"
)

// crashChildEnv names the config file of a gateway that TestCrashChild
// serves until it is killed.
const crashChildEnv = "MOONJI_CRASH_CHILD_CONFIG"

// TestCrashChild is the gateway process TestCrashKeepsEveryRow kills: this
// test binary again, serving the given configuration until SIGKILL.
func TestCrashChild(t *testing.T) {
	path := os.Getenv(crashChildEnv)
	if path == "" {
		t.Skip("the process TestCrashKeepsEveryRow starts and kills")
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := web.New(context.Background(), cfg, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		t.Fatal(err)
	}
	_ = srv.Serve(ln) // until killed
}

// startChildGateway starts this test binary as a gateway process
// (TestCrashChild) serving the configuration at cfgPath, which listens on
// addr and keeps its rows in dbURL; it issues a key there first and waits
// until the process listens. The process writes its log to stderr and is
// killed when the test ends, if the test has not.
func startChildGateway(t *testing.T, cfgPath, addr, dbURL string, stderr io.Writer) (*exec.Cmd, string) {
	t.Helper()
	db, err := models.Open(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer models.Close(db)
	u, err := models.EnsureUser(context.Background(), db, "child@example.com")
	if err != nil {
		t.Fatal(err)
	}
	key, _, err := apikey.Create(context.Background(), db, u.ID, "child", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command(exe, "-test.run=^TestCrashChild$", "-test.count=1", "-test.timeout=0")
	child.Env = append(os.Environ(), crashChildEnv+"="+cfgPath)
	child.Stderr, child.Stdout = stderr, io.Discard
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill() })
	waitFor(t, "the gateway process to listen", 20*time.Second, func() bool {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return child, key
}

// A gateway process killed with SIGKILL while it serves leaves every
// request whose inference id a client saw with exactly one row once it
// starts again: finished requests as they ended, running ones as
// gateway_restart — those whose pending row was written, and those younger
// than pendingAfter that only the journal knew.
func TestCrashKeepsEveryRow(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills a gateway process")
	}
	eachDatabase(t, func(t *testing.T, dbURL string) {
		mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		ms := httptest.NewServer(mock)
		defer ms.Close()
		dir := t.TempDir()
		ln, err := netListen()
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		cfgPath := filepath.Join(dir, "moonji.yaml")
		yaml := fmt.Sprintf(`listen: %s
replica_id: crashy
database_url: %q
journal_dir: %s
rate_limit: {requests_per_minute: 100000}
backends: [{name: mock, url: %s/v1, max_concurrency: 64, max_queue: 64}]
models: [{name: m1, backend: mock}]
`, addr, dbURL, filepath.Join(dir, "journal"), ms.URL)
		if err := os.WriteFile(cfgPath, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Load(cfgPath)
		if err != nil {
			t.Fatal(err)
		}
		// One goroutine of exec's copies into logs, read only after Wait.
		var logs strings.Builder
		child, key := startChildGateway(t, cfgPath, addr, dbURL, &logs)
		db, err := models.Open(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer models.Close(db)
		base := "http://" + addr

		send := func(body string) (*http.Response, error) {
			req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+key)
			req.Header.Set("Content-Type", "application/json")
			return http.DefaultClient.Do(req)
		}
		want := map[string]string{} // inference id → outcome/reason after the restart
		// Finished before the crash.
		for i := range 5 {
			resp, err := send(fmt.Sprintf(`{"model":"m1","messages":[{"role":"user","content":"done %d"}],"mock":{"tokens":3}}`, i))
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("a finished request: %v %v", resp, err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			want[resp.Header.Get("X-Inference-Id")] = "success/"
		}
		// Streams that run for seconds: some old enough for their pending
		// row, some so young that only the journal has them.
		stream := func() string {
			resp, err := send(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"long"}],"mock":{"tps":10,"tokens":200}}`)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("a stream: %v %v", resp, err)
			}
			go func() { io.Copy(io.Discard, resp.Body); resp.Body.Close() }()
			return resp.Header.Get("X-Inference-Id")
		}
		var old []string
		for range 4 {
			old = append(old, stream())
		}
		waitFor(t, "the older streams' pending rows", 10*time.Second, func() bool {
			var n int64
			db.Model(&models.Usage{}).Where("inference_id IN ? AND outcome = ?", old, models.OutcomePending).Count(&n)
			return n == int64(len(old))
		})
		var young []string
		for range 4 {
			young = append(young, stream())
		}
		var written int64
		db.Model(&models.Usage{}).Where("inference_id IN ?", young).Count(&written)
		if err := child.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = child.Wait()
		if written != 0 {
			// The machine was too slow for the young streams to be young:
			// the journal's part of the crash was not exercised.
			t.Fatalf("%d of the young streams already had a row before the kill", written)
		}
		for _, id := range append(old, young...) {
			want[id] = "error/gateway_restart"
		}
		var before int64
		db.Model(&models.Usage{}).Count(&before)

		// The same replica starts again: its start-up closes what the crash
		// left open and records what only the journal knew.
		again, err := web.New(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatalf("restart: %v\nfirst life's log:\n%s", err, logs.String())
		}
		again.Shutdown(time.Second)

		var rows []models.Usage
		if err := db.Find(&rows).Error; err != nil {
			t.Fatal(err)
		}
		if len(rows) != len(want) {
			t.Errorf("%d rows for %d requests (%d before the restart)", len(rows), len(want), before)
		}
		for _, r := range rows {
			got := r.Outcome + "/" + r.Reason
			if w, ok := want[r.InferenceID]; !ok || got != w || r.FinishedAt == nil {
				t.Errorf("row %s: %s (finished %v), want %q", r.InferenceID, got, r.FinishedAt, w)
			}
		}
		if segs, _ := filepath.Glob(filepath.Join(dir, "journal", "*.journal")); len(segs) > 1 {
			t.Errorf("journal segments left after recovery: %v", segs)
		}
		// The rollup counted each row once: equal to a rebuild from rows.
		var before2, after []models.UsageRollup
		db.Model(&models.UsageRollup{}).Order("span, start, model, outcome").Find(&before2)
		if _, err := models.RebuildRollup(context.Background(), db); err != nil {
			t.Fatal(err)
		}
		db.Model(&models.UsageRollup{}).Order("span, start, model, outcome").Find(&after)
		if fmt.Sprint(before2) != fmt.Sprint(after) {
			t.Errorf("rollup differs from a rebuild:\n kept %v\n rebuilt %v", before2, after)
		}
	})
}
