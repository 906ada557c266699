package main

import (
	"bufio"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"moonji/internal/sysmon"
)

// TestMain runs main itself when TestServeKeepsTheMonitorAwake asks for it:
// the test binary then is moonji, its arguments moonji's.
func TestMain(m *testing.M) {
	if os.Getenv("MOONJI_TEST_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestServeKeepsTheMonitorAwake starts `moonji serve` and checks that the
// process serving is the one started, running with the runtime's monitor
// kept awake (package sysmon): main ran it again with GODEBUG set.
func TestServeKeepsTheMonitorAwake(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the monitor is left as it is here")
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "moonji.yaml")
	cfg := "listen: 127.0.0.1:0\ndatabase_url: sqlite://" + filepath.Join(dir, "moonji.db") + "\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "serve", "--config", path)
	cmd.Env = append(os.Environ(), "MOONJI_TEST_MAIN=1", "GODEBUG=", "MOONJI_JOURNAL_DIR="+filepath.Join(dir, "journal"))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("serve: %v", err)
		}
	}()

	listening := regexp.MustCompile(`moonji is listening" .* addr=(127\.0\.0\.1:\d+)`)
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
	}()
	select {
	case a := <-addr:
		resp, err := http.Get("http://" + a + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("/healthz: %s", resp.Status)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not start listening")
	}
	environ, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(cmd.Process.Pid), "environ"))
	if err != nil {
		t.Fatal(err)
	}
	var godebug []string
	for kv := range strings.SplitSeq(string(environ), "\x00") {
		if strings.HasPrefix(kv, "GODEBUG=") {
			godebug = append(godebug, kv)
		}
	}
	if len(godebug) != 1 || godebug[0] != "GODEBUG="+sysmon.Setting {
		t.Errorf("serve runs with %q, want GODEBUG=%s", godebug, sysmon.Setting)
	}
}
