package cli

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer that serve's logger and the test may use
// at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestServeReleasesStartupPages starts serve in this process and waits for
// it to let go of the executable's start-up pages (package exepages), then
// checks that it still answers. Without the release the log line never
// comes.
func TestServeReleasesStartupPages(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "moonji.yaml")
	cfg := "listen: 127.0.0.1:0\ndatabase_url: sqlite://" + filepath.Join(dir, "moonji.db") + "\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var stderr syncBuffer
	done := make(chan error, 1)
	go func() { done <- cmdServe(ctx, []string{"--config", path}, &stderr) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()

	released := regexp.MustCompile(`released the executable's start-up pages" bytes=(\d+)`)
	listening := regexp.MustCompile(`moonji is listening" .* addr=(127\.0\.0\.1:\d+)`)
	deadline := time.Now().Add(30 * time.Second)
	var m []string
	for m == nil && time.Now().Before(deadline) {
		select {
		case err := <-done:
			t.Fatalf("serve stopped: %v\n%s", err, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		m = released.FindStringSubmatch(stderr.String())
	}
	if m == nil {
		t.Fatalf("no release logged:\n%s", stderr.String())
	}
	// The test binary's read-only pages are megabytes; a release of none
	// means the mappings were not found.
	if n, _ := strconv.Atoi(m[1]); n < 1<<20 {
		t.Errorf("released %d bytes, want at least 1 MiB", n)
	}
	addr := listening.FindStringSubmatch(stderr.String())
	if addr == nil {
		t.Fatalf("no listening address logged:\n%s", stderr.String())
	}
	resp, err := http.Get("http://" + addr[1] + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz after the release: %d", resp.StatusCode)
	}
}
