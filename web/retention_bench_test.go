//go:build bench

package web_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"moonji/internal/benchdata"
	"moonji/internal/config"
	"moonji/internal/mockllm"
	"moonji/internal/retention"
	"moonji/internal/testdb"
	"moonji/models"
)

// BenchmarkRetention is issue 47's proof at scale: a ledger of
// MOONJI_BENCH_ROWS rows (default 10,000,000), half of them older than the
// 400-day retention, on MOONJI_BENCH_DB (sqlite, the default, or postgres
// through MOONJI_TEST_POSTGRES_DSN); the schema migration on it timed (the
// rollup's backfill walks every row, in resumable batches); then the
// gateway serves MOONJI_BENCH_RPS (default 500) non-streaming requests a
// second against the mock engine for MOONJI_BENCH_SECONDS (default 20)
// without retention, and again while a retention run deletes the old half;
// p99 both ways, the run's time and the disk before and after.
//
//	MOONJI_BENCH_ROWS=10000000 go test -tags bench ./web -run '^$' -bench Retention -benchtime 1x -timeout 3h
func BenchmarkRetention(b *testing.B) {
	rows := envInt("MOONJI_BENCH_ROWS", 10_000_000)
	rps := envInt("MOONJI_BENCH_RPS", 500)
	secs := envInt("MOONJI_BENCH_SECONDS", 20)
	kind := os.Getenv("MOONJI_BENCH_DB")
	if kind == "" {
		kind = "sqlite"
	}
	ctx := context.Background()
	var dbURL, sqlitePath string
	switch kind {
	case "sqlite":
		dir := os.Getenv("MOONJI_BENCH_DIR") // a disk with room: 10M rows take ~4 GB
		if dir == "" {
			dir = b.TempDir()
		}
		sqlitePath = dir + "/retention.db"
		os.Remove(sqlitePath)
		dbURL = "sqlite://" + sqlitePath
		b.Cleanup(func() { os.Remove(sqlitePath); os.Remove(sqlitePath + "-wal"); os.Remove(sqlitePath + "-shm") })
	case "postgres":
		dsn := os.Getenv(testdb.PostgresEnv)
		if dsn == "" {
			b.Skip("MOONJI_BENCH_DB=postgres needs " + testdb.PostgresEnv)
		}
		dbURL = testdb.PostgresSchema(b, dsn)
	default:
		b.Fatalf("MOONJI_BENCH_DB=%q: want sqlite or postgres", kind)
	}
	logf := func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }

	// Fill: the schema first, then the rows without rollups.
	db, err := models.Open(dbURL)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now().UTC()
	keep := 400 * models.Day
	start := time.Now()
	err = benchdata.FillUsage(ctx, db, rows, now.Add(-2*keep+models.Day), now.Add(-time.Minute), func(done int) {
		if done%2_000_000 == 0 || done == rows {
			logf("filled %d rows in %s", done, time.Since(start).Round(time.Second))
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	fillTook := time.Since(start)
	start = time.Now()
	if err := models.Migrate(db); err != nil {
		b.Fatal(err)
	}
	migrateTook := time.Since(start)
	logf("%s: %d rows filled in %s; migration (rollup backfill over every row) %s", kind, rows, fillTook.Round(time.Second), migrateTook.Round(time.Second))
	models.Close(db)

	mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, Tokens: 16, MaxRecords: 1000, Logger: quietLog()})
	ms := httptest.NewServer(mock)
	defer ms.Close()
	env := startBenchGateway(b, ms.URL, nil, func(c *config.Config) { c.DatabaseURL = dbURL })
	size := func() string { return diskSize(b, env.DB, sqlitePath) }
	sizeBefore := size()
	var old int64
	env.DB.Model(&models.Usage{}).Where("created_at < ?", now.Add(-keep).Truncate(models.Day)).Count(&old)
	logf("before: %s; %d rows older than the retention", sizeBefore, old)

	client := benchClient()
	body := `{"model":"m1","max_tokens":16,"messages":[{"role":"user","content":"Hello there"}]}`
	spec := loadSpec{URL: env.URL + "/v1/chat/completions", Key: env.Key, Body: body, RPS: rps, Want: http.StatusOK}
	for b.Loop() {
		openLoop(client, spec.with(2*time.Second))
		base := openLoop(client, spec.with(time.Duration(secs)*time.Second))

		job := &retention.Job{DB: env.DB, Usage: keep, Log: quietLog()}
		var res retention.Result
		var runErr error
		done := make(chan struct{})
		go func() {
			defer close(done)
			res, runErr = job.RunOnce(ctx)
		}()
		// Load in windows until the run ends: every request sent while it
		// ran counts.
		var during loadResult
		during.Statuses = map[int]int{}
		for running := true; running; {
			select {
			case <-done:
				running = false
				continue
			default:
			}
			r := openLoop(client, spec.with(5*time.Second))
			during.Lat = append(during.Lat, r.Lat...)
			during.Errs += r.Errs
			for s, n := range r.Statuses {
				during.Statuses[s] += n
			}
		}
		if runErr != nil {
			b.Fatal(runErr)
		}
		if kind == "sqlite" {
			env.DB.Exec("PRAGMA wal_checkpoint(TRUNCATE)")
		}
		sizeAfter := size()
		b99, d99 := pct(base.Lat, 99), pct(during.Lat, 99)
		logf("%s, %d rows, %d req/s (%d CPUs):\n  without retention: %d requests, p50 %v p99 %v, %d errors\n  during retention:  %d requests, p50 %v p99 %v, %d errors (ratio p99 %.2f)\n"+
			"  retention run: %d rows deleted in %d batches, %s (of which vacuum %s), %d free pages left\n  disk before %s\n  disk after  %s",
			kind, rows, rps, runtime.NumCPU(), len(base.Lat), pct(base.Lat, 50), b99, base.Errs, len(during.Lat), pct(during.Lat, 50), d99, during.Errs,
			float64(d99)/float64(b99), res.Deleted[retention.TableUsage], res.Batches[retention.TableUsage], res.Took.Round(time.Second),
			res.VacuumTook.Round(time.Second), res.FreePages, sizeBefore, sizeAfter)
		if kind == "postgres" {
			start := time.Now()
			env.DB.Exec("VACUUM usages")
			logf("  after VACUUM (%s): %s", time.Since(start).Round(time.Second), size())
			if os.Getenv("MOONJI_BENCH_VACUUM_FULL") != "" {
				start = time.Now()
				env.DB.Exec("VACUUM FULL usages")
				logf("  after VACUUM FULL (%s, the table locked meanwhile): %s", time.Since(start).Round(time.Second), size())
			}
		}
		b.ReportMetric(us(b99), "base-p99-µs")
		b.ReportMetric(us(d99), "during-p99-µs")
		b.ReportMetric(float64(d99)/float64(b99), "ratio-p99")
		b.ReportMetric(res.Took.Seconds(), "run-s")
		b.ReportMetric(migrateTook.Seconds(), "migrate-s")
		if base.Errs+during.Errs > 0 {
			b.Errorf("%d requests failed (%v, %v)", base.Errs+during.Errs, base.Statuses, during.Statuses)
		}
	}
}

// diskSize describes the ledger's size on disk: the SQLite file (and its
// WAL), or PostgreSQL's usages with its indexes and TOAST.
func diskSize(b *testing.B, db *gorm.DB, sqlitePath string) string {
	if sqlitePath != "" {
		var parts []string
		for _, suffix := range []string{"", "-wal"} {
			if st, err := os.Stat(sqlitePath + suffix); err == nil {
				parts = append(parts, fmt.Sprintf("%s%s %.0f MB", "file", suffix, float64(st.Size())/1e6))
			}
		}
		var free int64
		db.Raw("PRAGMA freelist_count").Scan(&free)
		return strings.Join(parts, ", ") + fmt.Sprintf(" (%d free pages)", free)
	}
	var total, table int64
	db.Raw("SELECT pg_total_relation_size('usages'), pg_relation_size('usages')").Row().Scan(&total, &table)
	return fmt.Sprintf("usages %.0f MB with indexes (table %.0f MB)", float64(total)/1e6, float64(table)/1e6)
}
