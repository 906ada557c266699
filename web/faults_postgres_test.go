package web_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"gorm.io/gorm"

	"moonji/internal/config"
	"moonji/internal/faultproxy"
	"moonji/internal/mockllm"
	"moonji/internal/testdb"
	"moonji/models"
	"moonji/web"
)

// PostgreSQL goes away under load, on two replicas (one in this process,
// one a process of its own): every request is still answered, /readyz
// names the database, the in-memory backlog stays within its bound (the
// rest only in the journal), a replica killed and started again meanwhile
// starts and serves (a key it never saw: 503, not 401), and once the
// database is back every inference id a client saw has exactly one row,
// final and as it ended — the killed replica's too.
//
// MOONJI_PG_FAULT_RATE (requests a second, both replicas together) and
// MOONJI_PG_FAULT_DOWN (how long the database is away) make it the soak
// run of issue 46: 200 and 60s.
func TestPostgresDownKeepsEveryRow(t *testing.T) {
	if testing.Short() {
		t.Skip("runs load through a PostgreSQL outage")
	}
	direct, proxied := proxiedPostgres(t)
	rate := faultRate(t)
	down := envDuration(t, "MOONJI_PG_FAULT_DOWN", 5*time.Second)
	const bound = 20 // replica A's in-memory backlog bound: small, so the journal takes the rest

	mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ms := httptest.NewServer(mock)
	defer ms.Close()
	dir := t.TempDir()
	cfgB, addrB := faultReplicaConfig(t, dir, "b", proxied, ms.URL)
	var logsB syncBuffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("replica b's log:\n%s", logsB.String())
		}
	})
	childB, key := startChildGateway(t, cfgB, addrB, direct, &logsB)
	cfgA, addrA := faultReplicaConfig(t, dir, "a", proxied, ms.URL)
	a := startInProcess(t, cfgA, addrA)
	a.Ledger.SetMaxBacklog(bound)

	db, err := models.Open(direct)
	if err != nil {
		t.Fatal(err)
	}
	defer models.Close(db)

	l := &faultLoad{key: key, client: &http.Client{Timeout: 30 * time.Second}}
	l.start(t, rate, map[string]string{"a": "http://" + addrA, "b": "http://" + addrB})
	l.waitAnswered(t, "a", 10)
	l.waitAnswered(t, "b", 10)

	pgDown(t)
	downAt := time.Now()
	// /readyz names the database, and the replica stays in rotation.
	waitFor(t, "replica a's /readyz to name the database", 20*time.Second, func() bool {
		code, body := get(t, "http://"+addrA+"/readyz")
		return code == http.StatusOK && strings.Contains(body, `"database":"unreachable"`) && strings.Contains(body, `"database_down_since"`)
	})
	// Past the bound, final rows are only in the journal.
	waitFor(t, "replica a's rows past its backlog to be only in its journal", 30*time.Second, func() bool {
		return metric(t, "http://"+addrA, "moonji_ledger_journal_only") > 0
	})
	for time.Since(downAt) < down/2 {
		if b := metric(t, "http://"+addrA, "moonji_ledger_backlog"); b > bound+64 {
			t.Fatalf("replica a holds %v rows in memory, bound %d (+ its running requests)", b, bound)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Replica b is killed during the outage, once every request it answered
	// is in the database or in its journal's final records.
	idsB := l.stop("b")
	waitFor(t, "replica b's answered rows to be in the database or its journal", 20*time.Second, func() bool {
		return missingFromJournal(t, db, filepath.Join(dir, "journal-b"), idsB) == 0
	})
	if err := childB.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = childB.Wait()
	childB2, _ := startChildGateway(t, cfgB, addrB, direct, &logsB)
	defer childB2.Process.Kill()
	// Started while the database is away: it serves, and a key it has not
	// read yet is a 503 that says why, not a 401.
	code, body := post(t, "http://"+addrB, key)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"code":"database_unavailable"`) {
		t.Errorf("restarted replica, unknown key, database away: %d %s", code, body)
	}
	for time.Since(downAt) < down {
		time.Sleep(50 * time.Millisecond)
	}
	if l.failures() > 0 {
		t.Errorf("%d requests failed while the database was away: %s", l.failures(), l.firstFailure())
	}

	pgUp(t)
	idsA := l.stop("a")
	all := append(append([]string{}, idsA...), idsB...)
	waitFor(t, "every row in the database, final", 90*time.Second, func() bool {
		var n int64
		db.Model(&models.Usage{}).Where("inference_id IN ? AND outcome <> ?", all, models.OutcomePending).Count(&n)
		return n == int64(len(all))
	}, func() { t.Logf("replica b's log:\n%s", logsB.String()) })
	var rows []models.Usage
	if err := db.Where("inference_id IN ?", all).Find(&rows).Error; err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, r := range rows {
		seen[r.InferenceID]++
		if r.Outcome != "success" {
			t.Errorf("row %s: %s/%s, want success (the journal keeps final rows)", r.InferenceID, r.Outcome, r.Reason)
		}
	}
	for _, id := range all {
		if seen[id] != 1 {
			t.Errorf("inference id %s: %d rows", id, seen[id])
		}
	}
	t.Logf("%d requests (a %d, b %d) at %d/s, database away %s", len(all), len(idsA), len(idsB), rate, down)
	waitFor(t, "replica a's /readyz to say the database is back", 20*time.Second, func() bool {
		_, body := get(t, "http://"+addrA+"/readyz")
		return strings.Contains(body, `"database":"ok"`) && !strings.Contains(body, `"ledger"`)
	})
	assertRollupIsRebuild(t, db)
}

// The database restarts (its connections cut, back at once) a few times
// under load: every answered request has exactly one final row.
func TestPostgresRestartKeepsEveryRow(t *testing.T) {
	if testing.Short() {
		t.Skip("runs load through PostgreSQL restarts")
	}
	direct, proxied := proxiedPostgres(t)
	mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ms := httptest.NewServer(mock)
	defer ms.Close()
	dir := t.TempDir()
	cfgB, addrB := faultReplicaConfig(t, dir, "b", proxied, ms.URL)
	var logsB syncBuffer
	_, key := startChildGateway(t, cfgB, addrB, direct, &logsB)
	cfgA, addrA := faultReplicaConfig(t, dir, "a", proxied, ms.URL)
	startInProcess(t, cfgA, addrA)
	db, err := models.Open(direct)
	if err != nil {
		t.Fatal(err)
	}
	defer models.Close(db)
	l := &faultLoad{key: key, client: &http.Client{Timeout: 30 * time.Second}}
	l.start(t, faultRate(t), map[string]string{"a": "http://" + addrA, "b": "http://" + addrB})
	for i := range 3 {
		l.waitAnswered(t, "a", 10*(i+1))
		l.waitAnswered(t, "b", 10*(i+1))
		pgRestart(t)
	}
	l.waitAnswered(t, "a", 40)
	all := append(l.stop("a"), l.stop("b")...)
	if l.failures() > 0 {
		t.Errorf("%d requests failed across the restarts: %s", l.failures(), l.firstFailure())
	}
	waitFor(t, "every row in the database, final", 90*time.Second, func() bool {
		var n int64
		db.Model(&models.Usage{}).Where("inference_id IN ? AND outcome = ?", all, "success").Count(&n)
		return n == int64(len(all))
	}, func() { t.Logf("replica b's log:\n%s", logsB.String()) })
	var dup int64
	db.Raw("SELECT count(*) FROM (SELECT inference_id FROM usages GROUP BY inference_id HAVING count(*) > 1) d").Scan(&dup)
	if dup != 0 {
		t.Errorf("%d inference ids with several rows", dup)
	}
	assertRollupIsRebuild(t, db)
}

// proxiedPostgres returns a fresh schema's URL, directly and through a
// faultproxy in front of the test's PostgreSQL (pgDown, pgUp, pgRestart
// drive it). Outside CI, without MOONJI_TEST_POSTGRES_DSN, the test skips.
func proxiedPostgres(t *testing.T) (direct, proxied string) {
	dsn := os.Getenv(testdb.PostgresEnv)
	if dsn == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is not set in CI", testdb.PostgresEnv)
		}
		t.Skipf("needs PostgreSQL: set %s", testdb.PostgresEnv)
	}
	direct = testdb.PostgresSchema(t, dsn)
	u, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	p := faultproxy.Start(t, u.Host)
	currentProxy = p
	u.Host = p.Addr()
	return direct, u.String()
}

// currentProxy is the faultproxy of the running test (these tests do not
// run in parallel).
var currentProxy *faultproxy.Proxy

func pgDown(t *testing.T)    { currentProxy.Down() }
func pgUp(t *testing.T)      { currentProxy.Up() }
func pgRestart(t *testing.T) { currentProxy.Restart() }

// faultReplicaConfig writes replica name's configuration and returns its
// path and listen address.
func faultReplicaConfig(t *testing.T, dir, name, dbURL, engine string) (string, string) {
	ln, err := netListen()
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	path := filepath.Join(dir, name+".yaml")
	yaml := fmt.Sprintf(`listen: %s
replica_id: %s
database_url: %q
journal_dir: %s
rate_limit: {requests_per_minute: 1000000}
backends: [{name: mock, url: %s/v1, max_concurrency: 64, max_queue: 256}]
models: [{name: m1, backend: mock}]
`, addr, name, dbURL, filepath.Join(dir, "journal-"+name), engine)
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, addr
}

// startInProcess serves the configuration at path in this process until
// the test ends.
func startInProcess(t *testing.T, path, addr string) *web.Server {
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := web.New(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Shutdown(5 * time.Second) })
	return srv
}

// faultLoad sends requests at a steady rate to each replica, and keeps the
// inference ids of those answered 200.
type faultLoad struct {
	key    string
	client *http.Client

	mu      sync.Mutex
	ids     map[string][]string
	failed  []string
	stopped map[string]chan struct{}
	done    map[string]*sync.WaitGroup
}

func (l *faultLoad) start(t *testing.T, rate int, replicas map[string]string) {
	l.ids, l.stopped, l.done = map[string][]string{}, map[string]chan struct{}{}, map[string]*sync.WaitGroup{}
	every := time.Duration(int64(time.Second) * int64(len(replicas)) / int64(max(rate, 1)))
	for name, base := range replicas {
		stop, wg := make(chan struct{}), &sync.WaitGroup{}
		l.stopped[name], l.done[name] = stop, wg
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(every)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					l.one(base, name, i)
				}()
			}
		}()
	}
	t.Cleanup(func() {
		for name := range replicas {
			l.stop(name)
		}
	})
}

func (l *faultLoad) one(base, name string, i int) {
	body := fmt.Sprintf(`{"model":"m1","messages":[{"role":"user","content":"%s %d"}],"mock":{"tokens":3}}`, name, i)
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+l.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := l.client.Do(req)
	if err != nil {
		l.fail(fmt.Sprintf("%s: %v", name, err))
		return
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !json.Valid(data) {
		l.fail(fmt.Sprintf("%s: %d %s", name, resp.StatusCode, data))
		return
	}
	l.mu.Lock()
	l.ids[name] = append(l.ids[name], resp.Header.Get("X-Inference-Id"))
	l.mu.Unlock()
}

func (l *faultLoad) fail(what string) {
	l.mu.Lock()
	l.failed = append(l.failed, what)
	l.mu.Unlock()
}

func (l *faultLoad) failures() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.failed)
}

func (l *faultLoad) firstFailure() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.failed) == 0 {
		return ""
	}
	return l.failed[0]
}

func (l *faultLoad) waitAnswered(t *testing.T, name string, n int) {
	waitFor(t, fmt.Sprintf("%d requests answered by %s", n, name), 30*time.Second, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return len(l.ids[name]) >= n
	})
}

// stop ends the load on one replica, waits for its requests, and returns
// the ids answered.
func (l *faultLoad) stop(name string) []string {
	l.mu.Lock()
	stop := l.stopped[name]
	delete(l.stopped, name)
	l.mu.Unlock()
	if stop == nil {
		return nil
	}
	close(stop)
	l.done[name].Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.ids[name]...)
}

// missingFromJournal counts the ids that are neither in the database nor
// in a final (F) record of the journal in dir.
func missingFromJournal(t *testing.T, db *gorm.DB, dir string, ids []string) int {
	var have []string
	if err := db.Model(&models.Usage{}).Where("inference_id IN ?", ids).Pluck("inference_id", &have).Error; err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, id := range have {
		found[id] = true
	}
	segs, _ := filepath.Glob(filepath.Join(dir, "*.journal"))
	for _, seg := range segs {
		data, _ := os.ReadFile(seg)
		for _, m := range finalRecord.FindAllSubmatch(data, -1) {
			found[string(m[1])] = true
		}
	}
	missing := 0
	for _, id := range ids {
		if !found[id] {
			missing++
		}
	}
	return missing
}

// assertRollupIsRebuild checks that the rollup counted each row once: it
// equals a rebuild from the rows.
func assertRollupIsRebuild(t *testing.T, db *gorm.DB) {
	var kept, rebuilt []models.UsageRollup
	db.Model(&models.UsageRollup{}).Order("span, start, model, outcome").Find(&kept)
	if _, err := models.RebuildRollup(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	db.Model(&models.UsageRollup{}).Order("span, start, model, outcome").Find(&rebuilt)
	if fmt.Sprint(kept) != fmt.Sprint(rebuilt) {
		t.Errorf("rollup differs from a rebuild:\n kept %v\n rebuilt %v", kept, rebuilt)
	}
}

func get(_ *testing.T, u string) (int, string) {
	resp, err := http.Get(u)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func post(_ *testing.T, base, key string) (int, string) {
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
		strings.NewReader(`{"model":"m1","messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metric reads one unlabelled gauge from a replica's /metrics.
func metric(t *testing.T, base, name string) float64 {
	_, body := get(t, base+"/metrics")
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f
		}
	}
	return -1
}

var finalRecord = regexp.MustCompile(`(?m)^F \{"InferenceID":"([^"]+)"`)

func faultRate(t *testing.T) int {
	n := envInt("MOONJI_PG_FAULT_RATE", 40)
	if n <= 0 {
		t.Fatal("MOONJI_PG_FAULT_RATE: want a positive number")
	}
	return n
}

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a duration", name, v)
	}
	return d
}

// syncBuffer is a bytes.Buffer a child's stderr copier and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
