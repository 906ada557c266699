// Package testredis starts a private redis-server for tests that must see
// nothing but their own traffic, such as those counting commands with INFO
// commandstats: the shared server of MOONJI_TEST_REDIS_URL also serves the
// other packages' tests, which `go test ./...` runs at the same time.
package testredis

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Start runs redis-server on a free loopback port until the test ends and
// returns its URL. It fails the test when redis-server is not installed:
// callers use it only where a real Redis was asked for.
func Start(tb testing.TB) string {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatalf("a real Redis was asked for (MOONJI_TEST_REDIS_URL) but redis-server is not installed: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(bin, "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", tb.TempDir(), "--loglevel", "warning")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start redis-server: %v", err)
	}
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	url := fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port)})
	defer rdb.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := rdb.Ping(ctx).Err()
		cancel()
		if err == nil {
			return url
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redis-server on port %d does not answer: %v", port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
