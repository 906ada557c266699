package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// frontEnv is what -front-cmd and -fault-hook are told of the cluster: the
// replicas' addresses (space-separated host:port) and the run's directory.
func (c *cluster) frontEnv() []string {
	var addrs []string
	for _, r := range c.replicas {
		addrs = append(addrs, r.addr)
	}
	return append(os.Environ(), "SOAK_REPLICAS="+strings.Join(addrs, " "), "SOAK_DIR="+c.dir)
}

// startFront runs -front-cmd (an nginx with idle timeouts in front of the
// replicas, say) for the whole run: it reads SOAK_REPLICAS, and the first
// line it prints is the comma-separated base URLs the clients use instead of
// the replicas. It is ended with the cluster.
func (c *cluster) startFront(cmdline string) ([]string, error) {
	// exec: the soak's SIGTERM reaches the command itself, not a shell
	// that would die and leave it running.
	cmd := exec.Command("sh", "-c", "exec "+cmdline)
	cmd.Dir, cmd.Env = c.dir, c.frontEnv()
	setDeathSignal(cmd)
	logf, err := os.Create(filepath.Join(c.dir, "front.log"))
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logf
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("-front-cmd: %w", err)
	}
	c.front = &proc{name: "front", cmd: cmd, done: make(chan struct{})}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		for sc.Scan() {
			fmt.Fprintln(logf, sc.Text())
		}
		_ = cmd.Wait()
		logf.Close()
		close(c.front.done)
	}()
	select {
	case l, ok := <-lines:
		if !ok || strings.TrimSpace(l) == "" {
			return nil, fmt.Errorf("-front-cmd printed no base URL (log: %s/front.log)", c.dir)
		}
		return strings.Split(strings.TrimSpace(l), ","), nil
	case <-time.After(30 * time.Second):
		return nil, fmt.Errorf("-front-cmd printed no base URL within 30 s (log: %s/front.log)", c.dir)
	}
}
