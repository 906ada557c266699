package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"moonji/internal/faultproxy"
)

// cluster is everything the soak runs: a private redis-server, a schema of
// its own in the machine's PostgreSQL, a mock engine, a `moonji engine` in
// front of it, three gateway replicas, and a fault proxy on each path the
// replicas depend on. The machine's own servers are never stopped: only the
// proxies in front of them go down.
type cluster struct {
	dir, bin string
	log      *slog.Logger

	redisPort int
	redis     *proc
	schema    string
	pgAdmin   string // the real server's DSN, for the schema and the checks
	pgDirect  string // the schema's URL on the real server

	pgProxy, redisProxy, engineProxy, linkProxy *faultproxy.Proxy

	mock, engine *proc
	front        *proc // -front-cmd's process, if any
	replicas     []*replica
	key          string // an API key for /v1
	chatEmails   []string
}

type replica struct {
	n    int
	addr string
	cfg  string
	proc *proc
}

func (r *replica) base() string { return "http://" + r.addr }

// proc is a child process with its log in the run's directory.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

func startProc(dir, name, bin string, args ...string) (*proc, error) {
	f, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, fmt.Errorf("log of %s: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = f, f
	setDeathSignal(cmd)
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// stop asks the process to end (SIGTERM), and kills it after grace.
func (p *proc) stop(grace time.Duration) {
	if p == nil || !p.alive() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// waitFor polls cond every 100 ms until it holds or timeout passes.
func waitFor(what string, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

func listening(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func healthy(base string) bool {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get(base + "/healthz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (c *cluster) startRedis() error {
	p, err := startProc(c.dir, "redis", "redis-server", "--port", fmt.Sprint(c.redisPort), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", c.dir)
	if err != nil {
		return err
	}
	c.redis = p
	return waitFor("redis-server to listen", 10*time.Second, func() bool {
		return listening(fmt.Sprintf("127.0.0.1:%d", c.redisPort))
	})
}

// restartRedis is a real restart of the private redis-server: it ends, its
// keys are gone, and it listens again on the same port after down.
func (c *cluster) restartRedis(down time.Duration) error {
	c.redis.stop(5 * time.Second)
	time.Sleep(down)
	return c.startRedis()
}

// createSchema makes a schema of the soak's own in the database pgAdmin
// names, and returns its URL with host replaced by via (the proxy).
func (c *cluster) createSchema() (direct string, err error) {
	c.schema = "moonji_soak_" + randHex(4)
	db, err := gorm.Open(postgres.Open(c.pgAdmin), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return "", fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	defer closeDB(db)
	if err := db.Exec("CREATE SCHEMA " + c.schema).Error; err != nil {
		return "", fmt.Errorf("create schema: %w", err)
	}
	u, err := url.Parse(c.pgAdmin)
	if err != nil {
		return "", fmt.Errorf("parse the PostgreSQL DSN: %w", err)
	}
	q := u.Query()
	q.Set("search_path", c.schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

func (c *cluster) dropSchema() {
	if c.schema == "" {
		return
	}
	db, err := gorm.Open(postgres.Open(c.pgAdmin), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		c.log.Warn("drop schema", "err", err)
		return
	}
	defer closeDB(db)
	db.Exec("DROP SCHEMA " + c.schema + " CASCADE")
}

func closeDB(db *gorm.DB) {
	if s, err := db.DB(); err == nil {
		s.Close()
	}
}

func viaProxy(raw, addr string) string {
	u, _ := url.Parse(raw)
	u.Host = addr
	return u.String()
}

// start brings the whole cluster up.
func (c *cluster) start(ctx context.Context, replicas int) error {
	var err error
	if c.redisPort, err = freePort(); err != nil {
		return err
	}
	if err := c.startRedis(); err != nil {
		return err
	}
	if c.pgDirect, err = c.createSchema(); err != nil {
		return err
	}
	pgURL, _ := url.Parse(c.pgAdmin)
	if c.pgProxy, err = faultproxy.New("postgres", pgURL.Host); err != nil {
		return err
	}
	if c.redisProxy, err = faultproxy.New("redis", fmt.Sprintf("127.0.0.1:%d", c.redisPort)); err != nil {
		return err
	}
	mockPort, err := freePort()
	if err != nil {
		return err
	}
	mockAddr := fmt.Sprintf("127.0.0.1:%d", mockPort)
	// The chat's answers take the mock's defaults (a chat request carries no knobs): ~1 s each.
	if c.mock, err = startProc(c.dir, "mockllm", c.bin, "mockllm", "--listen", mockAddr, "--models", "m1",
		"--tps", "40", "--tokens", "40"); err != nil {
		return err
	}
	if err := waitFor("the mock engine", 20*time.Second, func() bool { return listening(mockAddr) }); err != nil {
		return err
	}
	if c.engineProxy, err = faultproxy.New("engine", mockAddr); err != nil {
		return err
	}
	enginePort, err := freePort()
	if err != nil {
		return err
	}
	engineAddr := fmt.Sprintf("127.0.0.1:%d", enginePort)
	engineCfg := filepath.Join(c.dir, "engine.yaml")
	if err := os.WriteFile(engineCfg, fmt.Appendf(nil, `database_url: sqlite://%s/engine-unused.db
backends: [{name: mock, url: http://%s/v1, max_concurrency: 64}]
models: [{name: mlink, backend: mock, upstream_model: m1}]
`, c.dir, mockAddr), 0o600); err != nil {
		return err
	}
	if c.engine, err = startProc(c.dir, "engine", c.bin, "engine", "--listen", engineAddr, "--config", engineCfg); err != nil {
		return err
	}
	if err := waitFor("moonji engine", 20*time.Second, func() bool { return listening(engineAddr) }); err != nil {
		return err
	}
	if c.linkProxy, err = faultproxy.New("link", engineAddr); err != nil {
		return err
	}
	prefix := "soak" + randHex(3) + ":"
	for i := range replicas {
		port, err := freePort()
		if err != nil {
			return err
		}
		r := &replica{n: i, addr: fmt.Sprintf("127.0.0.1:%d", port), cfg: filepath.Join(c.dir, fmt.Sprintf("replica%d.yaml", i))}
		if err := os.WriteFile(r.cfg, []byte(c.replicaConfig(r, prefix)), 0o600); err != nil {
			return err
		}
		c.replicas = append(c.replicas, r)
	}
	// The first replica migrates the schema alone; the others start after it.
	for i, r := range c.replicas {
		if r.proc, err = startProc(c.dir, fmt.Sprintf("replica%d", i), c.bin, "serve", "--config", r.cfg); err != nil {
			return err
		}
		if i == 0 {
			if err := c.waitReplica(r); err != nil {
				return err
			}
		}
	}
	for _, r := range c.replicas[1:] {
		if err := c.waitReplica(r); err != nil {
			return err
		}
	}
	return c.people(ctx)
}

func (c *cluster) waitReplica(r *replica) error {
	return waitFor(fmt.Sprintf("replica %d on %s (log: %s/replica%d.log)", r.n, r.addr, c.dir, r.n), 60*time.Second, func() bool {
		return r.proc.alive() && healthy(r.base())
	})
}

func (c *cluster) replicaConfig(r *replica, prefix string) string {
	return fmt.Sprintf(`listen: %s
replica_id: soak-%d
database_url: %q
journal_dir: %s
redis_url: redis://%s/0
redis_prefix: %q
rate_limit: {requests_per_minute: 1000000, unauthenticated_per_minute: 1000000}
limits: {chat_generations_per_person: 256, event_streams_per_person: 256, conversations_per_minute: 100000}
keys: {max_rpm: 1000000}
backends:
  - {name: mock, url: http://%s/v1, max_concurrency: 48, max_queue: 256, queue_timeout: 30s, timeout: 45s}
  - {name: link, kind: engine, url: ws://%s/engine, max_concurrency: 32, max_queue: 256, queue_timeout: 30s, timeout: 45s}
models:
  - {name: m1, backend: mock}
  - {name: mlink, backend: link}
health: {backoff: 500ms, max_backoff: 3s, probe_timeout: 2s}
`, r.addr, r.n, viaProxy(c.pgDirect, c.pgProxy.Addr()), filepath.Join(c.dir, fmt.Sprintf("journal%d", r.n)),
		c.redisProxy.Addr(), prefix, c.engineProxy.Addr(), c.linkProxy.Addr())
}

// cli runs one `moonji` subcommand against the first replica's file and
// returns its output.
func (c *cluster) cli(stdin string, args ...string) (string, error) {
	args = append(args, "--config", c.replicas[0].cfg)
	cmd := exec.Command(c.bin, args...)
	cmd.Dir = c.dir
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return "", fmt.Errorf("moonji %s: %w: %s", strings.Join(args, " "), err, ee.Stderr)
		}
		return "", fmt.Errorf("moonji %s: %w", strings.Join(args, " "), err)
	}
	return string(out), nil
}

const chatPassword = "soak-password-1234"

// people makes the API key and the chat's people.
func (c *cluster) people(context.Context) error {
	if _, err := c.cli("", "people", "add", "--email", "soak@example.com"); err != nil {
		return err
	}
	out, err := c.cli("", "keys", "create", "--owner", "soak@example.com", "--name", "soak", "--rpm", "1000000")
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); strings.HasPrefix(l, "mj-") {
			c.key = l
		}
	}
	if c.key == "" {
		return fmt.Errorf("keys create printed no key: %q", out)
	}
	for i := range 4 {
		email := fmt.Sprintf("chat%d@example.com", i)
		if _, err := c.cli(chatPassword+"\n", "people", "add", "--email", email, "--dev-password-stdin"); err != nil {
			return err
		}
		c.chatEmails = append(c.chatEmails, email)
	}
	return nil
}

// stop ends every process and proxy; keep leaves the schema for a look.
func (c *cluster) stop(keep bool) {
	for _, r := range c.replicas {
		if r.proc != nil {
			r.proc.stop(15 * time.Second)
		}
	}
	c.front.stop(5 * time.Second)
	c.engine.stop(5 * time.Second)
	c.mock.stop(5 * time.Second)
	c.redis.stop(5 * time.Second)
	for _, p := range []*faultproxy.Proxy{c.pgProxy, c.redisProxy, c.engineProxy, c.linkProxy} {
		if p != nil {
			p.Close()
		}
	}
	if !keep {
		c.dropSchema()
	}
}
