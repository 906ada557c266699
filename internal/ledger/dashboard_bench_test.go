package ledger

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"gorm.io/gorm"

	"moonji/internal/benchdata"
	"moonji/internal/testdb"
	"moonji/models"
)

// TestDashboardQueriesAtAMillionRows times the dashboards' queries on a
// ledger of 1,000,000 rows spread over 30 days (200 people, 400 keys, six
// models, every outcome), on SQLite and, with MOONJI_TEST_POSTGRES_DSN, on
// PostgreSQL. It is a benchmark, not a check: it runs only with
// MOONJI_BENCH_DASHBOARD=1 and prints p50/p95/max per query and per page,
// to show that the pages stay fast however large the ledger grows:
//
//	MOONJI_BENCH_DASHBOARD=1 go test -run DashboardQueriesAtAMillionRows -v -timeout 30m ./internal/ledger/
//
// MOONJI_BENCH_ROWS changes the row count; MOONJI_BENCH_DB=/path/file.db
// seeds that SQLite file (and keeps it) instead of a temporary one, so that
// `moonji serve` can be pointed at it to time the pages over HTTP.
func TestDashboardQueriesAtAMillionRows(t *testing.T) {
	if os.Getenv("MOONJI_BENCH_DASHBOARD") == "" {
		t.Skip("a benchmark: set MOONJI_BENCH_DASHBOARD=1")
	}
	rows := 1_000_000
	if n, err := strconv.Atoi(os.Getenv("MOONJI_BENCH_ROWS")); err == nil && n > 0 {
		rows = n
	}
	urls := testdb.URLs()
	if path := os.Getenv("MOONJI_BENCH_DB"); path != "" {
		urls["sqlite"] = func(testing.TB) string { return "sqlite://" + path }
	}
	for name, mk := range urls {
		t.Run(name, func(t *testing.T) {
			db, err := models.Open(mk(t))
			if err != nil {
				t.Fatal(err)
			}
			defer models.Close(db)
			now := time.Now().UTC()
			var have int64
			db.Model(&models.Usage{}).Count(&have)
			if have < int64(rows) {
				start := time.Now()
				if err := benchdata.SeedLedger(context.Background(), db, rows-int(have), now); err != nil {
					t.Fatal(err)
				}
				t.Logf("seeded %d ledger rows in %s", rows-int(have), time.Since(start).Round(time.Millisecond))
				start = time.Now()
				n, err := models.RebuildRollup(context.Background(), db)
				if err != nil {
					t.Fatal(err)
				}
				t.Logf("rollup rebuilt from %d rows in %s", n, time.Since(start).Round(time.Millisecond))
			}
			reportRollupSize(t, db)
			timeDashboard(t, db, now)
		})
	}
}

func reportRollupSize(t *testing.T, db *gorm.DB) {
	for _, m := range []any{&models.Usage{}, &models.UsageRollup{}, &models.UsageByPerson{}, &models.UsageOfPerson{}, &models.UsageLatency{}} {
		var n int64
		db.Model(m).Count(&n)
		t.Logf("%-22T %9d rows", m, n)
	}
}

// timeDashboard runs each page's queries 40 times and prints the latency of
// each query and of each page (all its queries, one after another).
func timeDashboard(t *testing.T, db *gorm.DB, now time.Time) {
	ctx := context.Background()
	var someone uint
	db.Model(&models.User{}).Select("id").Where("email = ?", "person000@example.com").Scan(&someone)
	type query struct {
		name string
		run  func() error
	}
	page := func(w models.Window) []query {
		return []query{
			{"usage over time", func() error { _, err := models.UsageOverTime(ctx, db, w, 0); return err }},
			{"latencies", func() error { _, err := models.Latencies(ctx, db, w); return err }},
			{"top users", func() error { _, err := models.TopUsers(ctx, db, w, 10); return err }},
			{"top keys", func() error { _, err := models.TopKeys(ctx, db, w, 0, 10); return err }},
			{"recent rejections", func() error { _, err := models.RecentUsage(ctx, db, models.OutcomeRejected, 20); return err }},
			{"recent errors", func() error { _, err := models.RecentUsage(ctx, db, models.OutcomeError, 20); return err }},
		}
	}
	person := func(w models.Window) []query {
		return []query{
			{"usage over time", func() error { _, err := models.UsageOverTime(ctx, db, w, someone); return err }},
			{"keys", func() error { _, err := models.TopKeys(ctx, db, w, someone, 100); return err }},
		}
	}
	pages := []struct {
		name    string
		queries []query
	}{
		{"/admin (24 h)", page(models.LastDay(now))},
		{"/admin?range=30d", page(models.LastMonth(now))},
		{"/usage (30 days)", person(models.LastMonth(now))},
	}
	const runs = 40
	for _, p := range pages {
		perQuery := make([][]time.Duration, len(p.queries))
		var total []time.Duration
		for range runs {
			pageStart := time.Now()
			for i, q := range p.queries {
				start := time.Now()
				if err := q.run(); err != nil {
					t.Fatal(err)
				}
				perQuery[i] = append(perQuery[i], time.Since(start))
			}
			total = append(total, time.Since(pageStart))
		}
		for i, q := range p.queries {
			t.Logf("%-18s %-18s %s", p.name, q.name, stats(perQuery[i]))
		}
		t.Logf("%-18s %-18s %s", p.name, "ALL (page)", stats(total))
	}
}

func stats(d []time.Duration) string {
	slices.Sort(d)
	at := func(q float64) time.Duration { return d[min(len(d)-1, int(math.Ceil(q*float64(len(d))))-1)] }
	ms := func(v time.Duration) string { return fmt.Sprintf("%7.2f ms", float64(v.Microseconds())/1000) }
	return fmt.Sprintf("p50 %s  p95 %s  max %s", ms(at(0.5)), ms(at(0.95)), ms(d[len(d)-1]))
}
