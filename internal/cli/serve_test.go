package cli

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"
)

// addrWatcher is serve's log output: it keeps the log for the test's
// messages and hands over the address once serve logs that it listens.
type addrWatcher struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	sent bool
	addr chan string
}

var listening = regexp.MustCompile(`moonji is listening" .* addr=(127\.0\.0\.1:\d+)`)

func (w *addrWatcher) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n, err := w.buf.Write(p)
	if !w.sent {
		if m := listening.FindSubmatch(w.buf.Bytes()); m != nil {
			w.sent = true
			w.addr <- string(m[1])
		}
	}
	return n, err
}

func (w *addrWatcher) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestServeAnswersAndStops starts serve in this process on the embedded
// defaults plus a temporary database, checks that it answers /healthz, and
// that cancelling its context ends it without an error.
func TestServeAnswersAndStops(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "moonji.yaml")
	cfg := "listen: 127.0.0.1:0\ndatabase_url: sqlite://" + filepath.Join(dir, "moonji.db") + "\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("MOONJI_JOURNAL_DIR", filepath.Join(dir, "journal"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stderr := &addrWatcher{addr: make(chan string, 1)}
	done := make(chan error, 1)
	go func() { done <- cmdServe(ctx, []string{"--config", path}, stderr) }()

	var addr string
	select {
	case addr = <-stderr.addr:
	case err := <-done:
		t.Fatalf("serve stopped before listening: %v\n%s", err, stderr)
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not listen:\n%s", stderr)
	}
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/healthz: %s", resp.Status)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve: %v\n%s", err, stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not stop:\n%s", stderr)
	}
}
