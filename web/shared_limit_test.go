package web_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/internal/testredis"
	"moonji/models"
)

// sharedRedis is the Redis the cross-replica tests share: the real one of
// MOONJI_TEST_REDIS_URL when set, else a fresh miniredis. The prefix is
// fresh either way.
func sharedRedis(t *testing.T) (url, prefix string) {
	t.Helper()
	be := testredis.Best(t)
	return be.URL, be.Prefix
}

// sharedDB is one database for several in-process replicas: PostgreSQL
// when MOONJI_TEST_POSTGRES_DSN is set, else a SQLite file.
func sharedDB(t *testing.T) string {
	t.Helper()
	if dsn := os.Getenv("MOONJI_TEST_POSTGRES_DSN"); dsn != "" {
		return freshPostgresSchema(t, dsn)
	}
	return "sqlite://" + t.TempDir() + "/shared.db"
}

// TestConcurrencyLimitAcrossReplicas: three replicas in front of one engine
// with max_concurrency 16. With Redis the engine never sees more than 16
// requests at once, whatever replica they came through; every request gets
// an answer or a 503 and leaves one row. Without Redis each replica keeps
// its own 16 and the engine sees more: the test of the shared limit can
// fail.
func TestConcurrencyLimitAcrossReplicas(t *testing.T) {
	for _, shared := range []bool{true, false} {
		name := map[bool]string{true: "redis", false: "per_replica"}[shared]
		t.Run(name, func(t *testing.T) {
			engine := startKillableEngine(t, "m1")
			redisURL, prefix := sharedRedis(t)
			if !shared {
				redisURL = ""
			}
			dbURL := sharedDB(t)
			var replicas []*testEnv
			for i := range 3 {
				e := startWithConfig(t, &config.Config{
					DatabaseURL: dbURL, RedisURL: redisURL, RedisPrefix: prefix,
					ReplicaID: fmt.Sprintf("replica-%c-%d", 'A'+i, time.Now().UnixNano()),
					RateLimit: config.RateLimit{RequestsPerMinute: 100000},
					Backends: []config.Backend{{Name: "mock", URL: engine.URL(), MaxConcurrency: 16, MaxQueue: 100,
						QueueTimeout: 30 * time.Second}},
					Models: []config.Model{{Name: "m1", Backend: "mock"}},
				}, nil, "")
				if len(replicas) > 0 {
					e.Key = replicas[0].Key // one key, valid on every replica
				}
				replicas = append(replicas, e)
			}
			const n = 100
			var wg sync.WaitGroup
			var mu sync.Mutex
			statuses := map[int]int{}
			var ids []string
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					e := replicas[i%3]
					resp := e.post(fmt.Sprintf(`{"model":"m1","messages":[{"role":"user","content":"%d"}],"mock":{"tokens":5,"tps":25}}`, i))
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					mu.Lock()
					statuses[resp.StatusCode]++
					ids = append(ids, resp.Header.Get("X-Inference-Id"))
					mu.Unlock()
				}()
			}
			wg.Wait()
			for status := range statuses {
				if status != http.StatusOK && status != http.StatusServiceUnavailable {
					t.Fatalf("statuses %v: only 200 and 503 are acceptable", statuses)
				}
			}
			peak := engine.peak.Load()
			t.Logf("engine peak concurrency %d; statuses %v", peak, statuses)
			if shared && peak > 16 {
				t.Fatalf("the engine saw %d requests at once through 3 replicas, over max_concurrency 16", peak)
			}
			if shared && peak < 12 {
				t.Fatalf("the engine saw at most %d requests at once: the limit of 16 was never used", peak)
			}
			if !shared && peak <= 16 {
				t.Fatalf("without Redis the engine saw at most %d at once: each replica should have kept its own 16", peak)
			}
			for _, e := range replicas {
				_ = e.srv.Ledger.Flush(context.Background())
			}
			var rows int64
			if err := replicas[0].DB.Model(&models.Usage{}).Where("inference_id IN ?", ids).Count(&rows).Error; err != nil {
				t.Fatal(err)
			}
			if rows != n {
				t.Fatalf("%d rows for %d requests", rows, n)
			}
			if shared {
				// Every slot is back in Redis once the requests are done.
				for _, e := range replicas {
					if held := e.srv.Leases.Held("mock"); held != 0 {
						t.Fatalf("replica still holds %d leases", held)
					}
				}
				// A release is sent a couple of milliseconds after its
				// request ends, unless the next request takes its slot
				// (lease.Store.ReleaseSoon, handOver).
				var count int
				var err error
				for deadline := time.Now().Add(time.Second); ; time.Sleep(5 * time.Millisecond) {
					count, err = replicas[0].srv.Leases.Count(context.Background(), "mock")
					if err != nil || count == 0 || time.Now().After(deadline) {
						break
					}
				}
				if err != nil || count != 0 {
					t.Fatalf("%d leases left in Redis a second after the requests ended (err %v)", count, err)
				}
			}
		})
	}
}

// TestDeadReplicaFreesItsSlots: a replica killed with SIGKILL while it
// holds every slot of a backend gives them back within the lease TTL:
// another replica, refused while the dead one held them, gets all of them.
func TestDeadReplicaFreesItsSlots(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and kills a gateway process")
	}
	const ttl = 2 * time.Second
	engine := startKillableEngine(t, "m1")
	redisURL, prefix := sharedRedis(t)
	// A short queue timeout: a request that finds no slot says so quickly.
	backend := config.Backend{Name: "mock", URL: engine.URL(), MaxConcurrency: 16, MaxQueue: 16, QueueTimeout: 300 * time.Millisecond}
	live := startWithConfig(t, &config.Config{
		DatabaseURL: "sqlite://" + t.TempDir() + "/live.db", RedisURL: redisURL, RedisPrefix: prefix,
		ReplicaID: "live", LeaseTTL: ttl,
		RateLimit: config.RateLimit{RequestsPerMinute: 100000},
		Backends:  []config.Backend{backend},
		Models:    []config.Model{{Name: "m1", Backend: "mock"}},
	}, nil, "")

	// The replica that dies: this test binary again (TestCrashChild).
	dir := t.TempDir()
	ln, err := netListen()
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dbURL := "sqlite://" + filepath.Join(dir, "doomed.db")
	cfgPath := filepath.Join(dir, "moonji.yaml")
	yaml := fmt.Sprintf(`listen: %s
replica_id: doomed
database_url: %q
journal_dir: %s
redis_url: %q
redis_prefix: %q
lease_ttl: %s
rate_limit: {requests_per_minute: 100000}
backends: [{name: mock, url: %s, max_concurrency: 16, max_queue: 0}]
models: [{name: m1, backend: mock}]
`, addr, dbURL, filepath.Join(dir, "journal"), redisURL, prefix, ttl, engine.URL())
	if err := os.WriteFile(cfgPath, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	child, key := startChildGateway(t, cfgPath, addr, dbURL, io.Discard)
	doomed := "http://" + addr

	// openStreams opens n long streams on base and returns how many were
	// admitted (their first frame read), and a function closing them all.
	openStreams := func(base, key string, n int) (int, func()) {
		var bodies []io.Closer
		admitted := 0
		for range n {
			req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
				strings.NewReader(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"hold"}],"mock":{"tps":20,"tokens":10000}}`))
			req.Header.Set("Authorization", "Bearer "+key)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				continue // the doomed replica may die under us
			}
			bodies = append(bodies, resp.Body)
			if resp.StatusCode == http.StatusOK {
				if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err == nil {
					admitted++
				}
			}
		}
		return admitted, func() {
			for _, b := range bodies {
				b.Close()
			}
		}
	}

	held, closeDoomed := openStreams(doomed, key, 16)
	defer closeDoomed()
	if held != 16 {
		t.Fatalf("the doomed replica got %d of 16 slots", held)
	}
	if got, closeLive := openStreams(live.URL, live.Key, 1); got != 0 {
		closeLive()
		t.Fatal("the live replica got a slot while the other held all 16: the limit is not shared")
	}

	signalled := time.Now()
	if err := child.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = child.Wait()
	killed := time.Now()
	// The dead replica's streams are cut at once, but its leases live on
	// until they expire: right after the kill the slots are still taken.
	// Renewed every TTL/3, the last renewal was at most that long before
	// the kill; a check that a busy machine made last longer than the rest
	// of the TTL proves nothing either way.
	if got, closeLive := openStreams(live.URL, live.Key, 1); got != 0 {
		closeLive()
		if since := time.Since(signalled); since < ttl-ttl/3 {
			t.Fatalf("a slot was free %s after the kill: leases are not what holds them", since)
		}
		t.Logf("the check right after the kill took %s, past the leases' earliest expiry", time.Since(signalled))
	}
	waitFor(t, "the dead replica's leases to expire", ttl+2*time.Second, func() bool {
		n, err := live.srv.Leases.Count(context.Background(), "mock")
		return err == nil && n == 0
	})
	freed := time.Since(killed)
	if got, closeLive := openStreams(live.URL, live.Key, 16); got != 16 {
		closeLive()
		t.Fatalf("the live replica got %d of 16 slots after the dead one's leases expired", got)
	} else {
		closeLive()
	}
	t.Logf("all 16 slots free %s after the kill (lease TTL %s)", freed.Round(time.Millisecond), ttl)
	if freed > ttl+time.Second {
		t.Fatalf("slots took %s to come back, over the lease TTL %s", freed, ttl)
	}
}

// TestSharedLimitWithoutRedis: when Redis goes away, each replica serves
// its share of the limit (max_concurrency / live replicas), never more,
// says so in a metric and /readyz, and goes back to the shared limit once
// Redis answers.
func TestSharedLimitWithoutRedis(t *testing.T) {
	engine := startKillableEngine(t, "m1")
	be := testredis.Mini(t)
	mr := be.Mini
	dbURL := sharedDB(t)
	var replicas []*testEnv
	for i := range 2 {
		e := startWithConfig(t, &config.Config{
			DatabaseURL: dbURL, RedisURL: be.URL, RedisPrefix: be.Prefix, LeaseTTL: 3 * time.Second,
			ReplicaID: fmt.Sprintf("share-%d-%d", i, time.Now().UnixNano()),
			RateLimit: config.RateLimit{RequestsPerMinute: 100000},
			Backends: []config.Backend{{Name: "mock", URL: engine.URL(), MaxConcurrency: 8, MaxQueue: 8,
				QueueTimeout: 200 * time.Millisecond}},
			Models: []config.Model{{Name: "m1", Backend: "mock"}},
		}, nil, "")
		replicas = append(replicas, e)
	}
	a := replicas[0]
	// Both replicas have renewed once, so each knows there are two.
	waitFor(t, "both replicas to see each other", 5*time.Second, func() bool { return a.srv.Leases.LiveReplicas() == 2 })

	mr.Close()
	var bodies []io.Closer
	defer func() {
		for _, b := range bodies {
			b.Close()
		}
	}()
	admitted, refused := 0, 0
	for range 6 {
		resp := a.post(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"hold"}],"mock":{"tps":20,"tokens":10000}}`)
		bodies = append(bodies, resp.Body)
		switch resp.StatusCode {
		case http.StatusOK:
			if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
				t.Fatal(err)
			}
			admitted++
		case http.StatusServiceUnavailable:
			refused++
		default:
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	if admitted != 4 || refused != 2 {
		t.Fatalf("with Redis down: %d admitted, %d refused; want the share 8/2 = 4 admitted", admitted, refused)
	}
	if v := metricValue(t, a, "moonji_concurrency_limit_degraded", ""); v != 1 {
		t.Fatalf("moonji_concurrency_limit_degraded = %v, want 1", v)
	}
	resp, err := http.Get(a.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	ready := readAll(t, resp.Body)
	resp.Body.Close()
	if !strings.Contains(ready, `"concurrency_limit":"per_replica"`) || !strings.Contains(ready, `"redis":"unreachable"`) {
		t.Fatalf("/readyz with Redis down: %s", ready)
	}
	for _, b := range bodies {
		b.Close()
	}
	bodies = nil

	if err := mr.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the shared limit to come back", 5*time.Second, func() bool {
		return metricValue(t, a, "moonji_concurrency_limit_degraded", "") == 0
	})
	waitFor(t, "the engine to see the streams end", 5*time.Second, func() bool { return engine.running.Load() == 0 })
	// Coming back, the replicas record the slots they handed out meanwhile
	// and the store grants nothing for a few seconds (the fence).
	waitFor(t, "the fence to fall", 10*time.Second, func() bool { return !leaseFenced(t, be) })
	if a.srv.Scheduler.Degraded() {
		t.Fatal("the scheduler still says degraded")
	}
	// Back on leases: one replica may take all 8 again.
	for range 8 {
		resp := a.post(`{"model":"m1","stream":true,"messages":[{"role":"user","content":"hold"}],"mock":{"tps":20,"tokens":10000}}`)
		bodies = append(bodies, resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("after Redis came back: status %d", resp.StatusCode)
		}
		if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := a.srv.Leases.Count(context.Background(), "mock"); err != nil || n != 8 {
		t.Fatalf("%d leases in Redis (err %v), want 8", n, err)
	}
}
