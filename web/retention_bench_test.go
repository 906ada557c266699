//go:build bench

package web_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
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
// second against the mock engine in interleaved windows of
// MOONJI_BENCH_SECONDS (default 15): without retention, then while a
// retention run deletes the old half (cancelled at the window's end; it
// resumes in the next), MOONJI_BENCH_PAIRS times (default 3) for each
// batch/pause setting of MOONJI_BENCH_RETENTION (default the job's); the
// run then finishes without load. p50/p99 of each window and of all, the
// machine's load average, the run's time and the disk before and after.
//
//	MOONJI_BENCH_ROWS=10000000 go test -tags bench ./web -run '^$' -bench Retention -benchtime 1x -timeout 3h
func BenchmarkRetention(b *testing.B) {
	rows := envInt("MOONJI_BENCH_ROWS", 10_000_000)
	rps := envInt("MOONJI_BENCH_RPS", 500)
	secs := envInt("MOONJI_BENCH_SECONDS", 15)
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
	settings := retentionSettings(b)
	pairs := envInt("MOONJI_BENCH_PAIRS", 3)
	window := time.Duration(secs) * time.Second
	for b.Loop() {
		openLoop(client, spec.with(2*time.Second))
		// Interleaved windows, pairs times per setting: W s of load with
		// no retention, then W s of load while a retention run deletes
		// (cancelled at the window's end: a run resumes where the last
		// stopped), so that the machine's noise falls on both alike.
		var ran, busy time.Duration
		var deleted int64
		var batches int
		var allBase, allDuring []time.Duration
		errs := 0
		finished := false
		for _, set := range settings {
			var setBase, setDuring []time.Duration
			for i := 0; i < pairs && !finished; i++ {
				base := openLoop(client, spec.with(window))
				rctx, cancel := context.WithCancel(ctx)
				job := set.job(env.DB, keep)
				done := make(chan struct{})
				var res retention.Result
				var runErr error
				began := time.Now()
				go func() {
					defer close(done)
					res, runErr = job.RunOnce(rctx)
				}()
				during := openLoop(client, spec.with(window))
				cancel()
				<-done
				ran += time.Since(began)
				busy += res.Busy
				deleted += res.Deleted[retention.TableUsage]
				batches += res.Batches[retention.TableUsage]
				if runErr == nil {
					finished = true
				} else if !errors.Is(runErr, context.Canceled) {
					b.Fatal(runErr)
				}
				errs += base.Errs + during.Errs
				setBase, setDuring = append(setBase, base.Lat...), append(setDuring, during.Lat...)
				logf("  pair %d, %v (load average %s): without p50 %v p99 %v | during p50 %v p99 %v (ratio p99 %.2f), %d rows deleted, %d errors",
					i+1, set, loadAvg(), pct(base.Lat, 50), pct(base.Lat, 99), pct(during.Lat, 50), pct(during.Lat, 99),
					float64(pct(during.Lat, 99))/float64(pct(base.Lat, 99)), res.Deleted[retention.TableUsage], base.Errs+during.Errs)
			}
			if len(setBase) > 0 {
				logf("%v, all pairs: without %d requests p50 %v p99 %v | during %d requests p50 %v p99 %v (ratio p99 %.2f)",
					set, len(setBase), pct(setBase, 50), pct(setBase, 99), len(setDuring), pct(setDuring, 50), pct(setDuring, 99),
					float64(pct(setDuring, 99))/float64(pct(setBase, 99)))
			}
			allBase, allDuring = append(allBase, setBase...), append(allDuring, setDuring...)
		}
		// The rest of the run, without load, with the first setting (its
		// share MOONJI_BENCH_REST_SHARE when set: 1 measures the work
		// alone, without the pauses).
		res := retention.Result{Deleted: map[string]int64{}}
		if !finished {
			rest := settings[0]
			if v := os.Getenv("MOONJI_BENCH_REST_SHARE"); v != "" {
				if rest.share, err = strconv.ParseFloat(v, 64); err != nil || rest.share <= 0 || rest.share > 1 {
					b.Fatalf("MOONJI_BENCH_REST_SHARE=%q: want a share in (0, 1]", v)
				}
			}
			logf("the rest of the run without load, %v", rest)
			began := time.Now()
			if res, err = rest.job(env.DB, keep).RunOnce(ctx); err != nil {
				b.Fatal(err)
			}
			ran += time.Since(began)
			busy += res.Busy
			deleted += res.Deleted[retention.TableUsage]
			batches += res.Batches[retention.TableUsage]
		}
		if kind == "sqlite" {
			env.DB.Exec("PRAGMA wal_checkpoint(TRUNCATE)")
		}
		sizeAfter := size()
		b99, d99 := pct(allBase, 99), pct(allDuring, 99)
		logf("%s, %d rows, %d req/s (%d CPUs, load average %s now):\n  retention run: %d rows deleted in %d batches, %s in all, %s of it in statements (its last vacuum %s), %d free pages left\n  disk before %s\n  disk after  %s",
			kind, rows, rps, runtime.NumCPU(), loadAvg(), deleted, batches, ran.Round(time.Second), busy.Round(time.Second),
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
		b.ReportMetric(ran.Seconds(), "run-s")
		b.ReportMetric(migrateTook.Seconds(), "migrate-s")
		if errs > 0 {
			b.Errorf("%d requests failed", errs)
		}
	}
}

type retentionSetting struct {
	batch int
	pause time.Duration
	share float64
}

func (s retentionSetting) job(db *gorm.DB, keep time.Duration) *retention.Job {
	return &retention.Job{DB: db, Usage: keep, Batch: s.batch, Pause: s.pause, Share: s.share, Log: quietLog()}
}

func (s retentionSetting) String() string {
	return fmt.Sprintf("batch %d pause %v share %.2g", s.batch, s.pause, s.share)
}

// retentionSettings reads MOONJI_BENCH_RETENTION ("2000/50ms/0.2,500/200ms/1":
// batch/pause/share, each measured in turn on the same run; the share may
// be left out); the job's defaults when unset.
func retentionSettings(b *testing.B) []retentionSetting {
	v := os.Getenv("MOONJI_BENCH_RETENTION")
	if v == "" {
		return []retentionSetting{{retention.DefaultBatch, retention.DefaultPause, retention.DefaultShare}}
	}
	var out []retentionSetting
	for _, item := range strings.Split(v, ",") {
		parts := strings.Split(item, "/")
		if len(parts) == 2 {
			parts = append(parts, fmt.Sprint(retention.DefaultShare))
		}
		if len(parts) != 3 {
			b.Fatalf("MOONJI_BENCH_RETENTION=%q: want batch/pause[/share],…", v)
		}
		batch, err1 := strconv.Atoi(parts[0])
		pause, err2 := time.ParseDuration(parts[1])
		share, err3 := strconv.ParseFloat(parts[2], 64)
		if err1 != nil || err2 != nil || err3 != nil || batch <= 0 || share <= 0 || share > 1 {
			b.Fatalf("MOONJI_BENCH_RETENTION=%q: want batch/pause[/share],…", v)
		}
		out = append(out, retentionSetting{batch, pause, share})
	}
	return out
}

// loadAvg is the machine's 1, 5 and 15-minute load averages.
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(data))[:3], " ")
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
