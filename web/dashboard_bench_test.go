//go:build bench

package web_test

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"slices"
	"testing"
	"time"

	"moonji/internal/benchdata"
	"moonji/internal/testdb"
	"moonji/models"
)

// TestDashboardPagesBench times the dashboards as a browser gets them — the
// whole page over HTTP, every query and the rendering — on a ledger of
// 1,000,000 rows, on SQLite and (with MOONJI_TEST_POSTGRES_DSN) PostgreSQL.
// A benchmark, not a check (BENCHMARKS.md §11):
//
//	MOONJI_BENCH_DASHBOARD=1 go test -run DashboardPagesBench -v -timeout 60m ./web/
//
// MOONJI_BENCH_ROWS changes the row count; MOONJI_BENCH_DB=/path/file.db
// uses (and keeps) that SQLite file, seeding it only if it has fewer rows.
func TestDashboardPagesBench(t *testing.T) {
	if os.Getenv("MOONJI_BENCH_DASHBOARD") == "" {
		t.Skip("a benchmark: set MOONJI_BENCH_DASHBOARD=1")
	}
	rows := envInt("MOONJI_BENCH_ROWS", 1_000_000)
	urls := testdb.URLs()
	if path := os.Getenv("MOONJI_BENCH_DB"); path != "" {
		urls["sqlite"] = func(testing.TB) string { return "sqlite://" + path }
	}
	for name, mk := range urls {
		t.Run(name, func(t *testing.T) {
			dbURL := mk(t)
			seedForBench(t, dbURL, rows)
			e := startEnv(t, dbURL)
			admin := e.signedIn("bench-admin@example.com", true)
			person := e.signedIn("person000@example.com", false)
			pages := []struct {
				path   string
				client *http.Client
			}{{"/admin", admin}, {"/admin?range=30d", admin}, {"/usage", person}, {"/usage?range=24h", person}}
			for _, p := range pages {
				var took []time.Duration
				for i := range 41 {
					start := time.Now()
					resp, body := e.fetch(p.client, http.MethodGet, p.path, nil, nil)
					if resp.StatusCode != http.StatusOK {
						t.Fatalf("%s: %d\n%s", p.path, resp.StatusCode, body)
					}
					if i > 0 { // the first load warms the caches
						took = append(took, time.Since(start))
					}
				}
				slices.Sort(took)
				at := func(q float64) float64 {
					return float64(took[int(math.Ceil(q*float64(len(took))))-1].Microseconds()) / 1000
				}
				t.Logf("%-18s p50 %7.2f ms  p95 %7.2f ms  max %7.2f ms", p.path, at(0.5), at(0.95), at(1))
			}
		})
	}
}

// seedForBench fills the ledger at dbURL up to rows rows, with rollups.
func seedForBench(t *testing.T, dbURL string, rows int) {
	t.Helper()
	db, err := models.Open(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer models.Close(db)
	var have int64
	if err := db.Model(&models.Usage{}).Count(&have).Error; err != nil {
		t.Fatal(err)
	}
	if have >= int64(rows) {
		return
	}
	start := time.Now()
	if err := benchdata.SeedLedger(context.Background(), db, rows-int(have), time.Now().UTC()); err != nil {
		t.Fatal(err)
	}
	if _, err := models.RebuildRollup(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	t.Log(fmt.Sprintf("seeded %d rows and their rollups in %s", rows-int(have), time.Since(start).Round(time.Second)))
}
