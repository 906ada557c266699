package web_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"moonji/internal/apikey"
	"moonji/models"
)

// lockedBuffer is a bytes.Buffer the process's stderr and the test share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestReloadSIGHUPBinary: the real binary, started with a configuration
// file, reloads it on SIGHUP: /readyz's config_version changes and the
// model's requests reach the backend the new file names.
func TestReloadSIGHUPBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "moonji")
	build := exec.Command("go", "build", "-o", bin, "moonji")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	mockA, urlA := mockEngine(t)
	mockB, urlB := mockEngine(t)
	ln, err := netListen()
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dbURL := "sqlite://" + filepath.Join(dir, "moonji.db")
	path := filepath.Join(dir, "moonji.yaml")
	write := func(backend string) {
		body := fmt.Sprintf("listen: %q\ndatabase_url: %q\nrate_limit: {requests_per_minute: 100000}\n"+
			"backends:\n  - {name: a, url: %q}\n  - {name: b, url: %q}\nmodels:\n  - {name: m1, backend: %s}\n",
			addr, dbURL, urlA, urlB, backend)
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("a")
	var stderr lockedBuffer
	cmd := exec.Command(bin, "serve", "-config", path)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "MOONJI_REDIS_URL=")
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("moonji's log:\n%s", stderr.String())
		}
	})
	base := "http://" + addr
	var v1 string
	waitFor(t, "/readyz answers", 30*time.Second, func() bool {
		v1 = readyVersion(t, base)
		return v1 != ""
	}, func() { t.Log(stderr.String()) })

	db, err := models.Open(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer models.Close(db)
	u, err := models.EnsureUser(context.Background(), db, "owner@example.com")
	if err != nil {
		t.Fatal(err)
	}
	key, _, err := apikey.Create(context.Background(), db, u.ID, "test", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	send := func(tag string) int {
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
			strings.NewReader(`{"model":"m1","messages":[{"role":"user","content":"hi"}],"mock":{"tag":"`+tag+`"}}`))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := send("before"); code != http.StatusOK || len(tagged(mockA, "before")) != 1 {
		t.Fatalf("before the reload: %d, backend a saw %d", code, len(tagged(mockA, "before")))
	}

	write("b")
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "config_version changes", 20*time.Second, func() bool {
		v := readyVersion(t, base)
		return v != "" && v != v1
	})
	if code := send("after"); code != http.StatusOK || len(tagged(mockB, "after")) != 1 || len(tagged(mockA, "after")) != 0 {
		t.Fatalf("after the reload: %d, backend b saw %d, a %d", code, len(tagged(mockB, "after")), len(tagged(mockA, "after")))
	}
	select {
	case <-exited:
		t.Fatal("the process exited on SIGHUP")
	default:
	}
}
