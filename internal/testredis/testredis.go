// Package testredis is the Redis harness of the tests: the Redis a test
// runs against (a miniredis of its own, or the real server of
// MOONJI_TEST_REDIS_URL under a fresh key prefix, or a private
// redis-server), a dialer that cuts a client off or freezes its
// connections, a hook counting the commands a client sends, and a logger
// writing to the test's log.
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
// returns its URL, for tests that must see nothing but their own traffic,
// such as those counting commands with INFO commandstats: the shared server
// of MOONJI_TEST_REDIS_URL also serves the other packages' tests, which `go
// test ./...` runs at the same time. It fails the test when redis-server is
// not installed: callers use it only where a real Redis was asked for.
func Start(tb testing.TB) string {
	tb.Helper()
	return StartServer(tb).URL
}

// Server is a private redis-server, killed when the test ends.
type Server struct {
	URL  string
	bin  string
	dir  string
	port int
	cmd  *exec.Cmd
}

// StartServer is Start, returning the server so that the test can stop it
// and start it again on the same port (Stop, Restart).
func StartServer(tb testing.TB) *Server {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatalf("a real Redis was asked for (%s) but redis-server is not installed: %v", EnvURL, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	s := &Server{URL: fmt.Sprintf("redis://127.0.0.1:%d/0", port), bin: bin, dir: tb.TempDir(), port: port}
	tb.Cleanup(s.kill)
	s.Restart(tb)
	return s
}

// Stop kills the server; its data goes with it.
func (s *Server) Stop(tb testing.TB) {
	tb.Helper()
	s.kill()
}

func (s *Server) kill() {
	if s.cmd != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
}

// Restart starts the server again on its port, empty, and returns once it
// answers. (StartServer starts it the first time the same way.)
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	s.kill()
	cmd := exec.Command(s.bin, "--port", fmt.Sprint(s.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--loglevel", "warning")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start redis-server: %v", err)
	}
	s.cmd = cmd
	rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", s.port), MaxRetries: -1})
	defer rdb.Close()
	var err error
	ok := WaitFor(5*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		err = rdb.Ping(ctx).Err()
		return err == nil
	})
	if !ok {
		tb.Fatalf("redis-server on port %d does not answer: %v", s.port, err)
	}
}

// WaitFor checks cond every few milliseconds until it holds, and reports
// false if it still does not after within.
func WaitFor(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}
