package benchdata

import (
	"context"
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"
)

// fillChunk is how many rows one INSERT … SELECT of FillUsage writes.
const fillChunk = 500_000

// FillUsage adds n final ledger rows created evenly from from to to, in
// order (as a ledger is written), generated inside the database — a
// recursive CTE on SQLite, generate_series on PostgreSQL — so that ten
// million rows take minutes, not the hour row-by-row inserts from Go
// would. No rollup is written: models.Migrate's backfill builds it. The
// rows: 200 people, six models, one in fifty an error, TTFT on most.
//
// The ledger's secondary indexes are dropped for the fill and built again
// after it (a sort each, instead of ten million scattered B-tree inserts
// through SQLite's 256 KiB page cache: ~11,000 rows/s with them), on one
// connection with a large cache.
func FillUsage(ctx context.Context, db *gorm.DB, n int, from, to time.Time, progress func(done int)) error {
	return db.WithContext(ctx).Connection(func(conn *gorm.DB) error {
		var indexes []string
		q := "SELECT sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'usages' AND sql IS NOT NULL"
		if conn.Dialector.Name() == "postgres" {
			q = "SELECT indexdef FROM pg_indexes WHERE tablename = 'usages' AND schemaname = current_schema() AND indexname <> 'usages_pkey'"
		} else if err := conn.Exec("PRAGMA cache_size = -262144").Error; err != nil { // 256 MB
			return fmt.Errorf("fill usage: %w", err)
		}
		if err := conn.Raw(q).Scan(&indexes).Error; err != nil {
			return fmt.Errorf("fill usage: list the indexes: %w", err)
		}
		for _, def := range indexes {
			name := strings.Fields(def[strings.Index(strings.ToUpper(def), "INDEX ")+6:])[0]
			if err := conn.Exec("DROP INDEX " + name).Error; err != nil {
				return fmt.Errorf("fill usage: drop %s: %w", name, err)
			}
		}
		if err := fill(conn, n, from, to, progress); err != nil {
			return err
		}
		for _, def := range indexes {
			if err := conn.Exec(def).Error; err != nil {
				return fmt.Errorf("fill usage: %s: %w", def, err)
			}
		}
		if conn.Dialector.Name() == "postgres" {
			return conn.Exec("ANALYZE usages").Error
		}
		return conn.Exec("PRAGMA cache_size = -256").Error
	})
}

func fill(db *gorm.DB, n int, from, to time.Time, progress func(done int)) error {
	step := to.Sub(from).Seconds() / float64(n)
	cols := "inference_id, created_at, finished_at, user_id, \"user\", key_id, source, api, model, backend, retried_from, response_id, " +
		"outcome, status, reason, prompt_tokens, completion_tokens, cached_tokens, cost, usage_source, queue_ms, ttft_ms, duration_ms, replica"
	for lo := 0; lo < n; lo += fillChunk {
		hi := min(lo+fillChunk, n) - 1
		var q string
		switch db.Dialector.Name() {
		case "sqlite":
			// Times as the driver writes them: "2006-01-02 15:04:05+00:00".
			at := fmt.Sprintf("strftime('%%Y-%%m-%%d %%H:%%M:%%S', %d + CAST(i * %f AS INTEGER), 'unixepoch') || '+00:00'", from.Unix(), step)
			q = "INSERT INTO usages (" + cols + ") WITH RECURSIVE s(i) AS (SELECT " + fmt.Sprint(lo) + " UNION ALL SELECT i + 1 FROM s WHERE i < " + fmt.Sprint(hi) + ") " +
				"SELECT printf('fill%010d', i), " + at + ", " + at + ", 1 + i % 200, 'person' || (i % 200) || '@example.com', 1 + i % 400, 'api', 'chat', " +
				"'model-' || (i % 6), 'b', '', '', CASE WHEN i % 50 = 0 THEN 'error' ELSE 'success' END, CASE WHEN i % 50 = 0 THEN 502 ELSE 200 END, " +
				"CASE WHEN i % 50 = 0 THEN 'upstream_500' ELSE '' END, 20 + i % 2000, i % 800, 0, (i % 2000) * 1000, 'engine', i % 7, 100 + i % 900, 500 + i % 20000, 'bench' FROM s"
		case "postgres":
			at := fmt.Sprintf("to_timestamp(%d + floor(g * %f))", from.Unix(), step)
			q = "INSERT INTO usages (" + cols + ") SELECT 'fill' || lpad(g::text, 10, '0'), " + at + ", " + at + ", 1 + g % 200, 'person' || (g % 200) || '@example.com', 1 + g % 400, 'api', 'chat', " +
				"'model-' || (g % 6), 'b', '', '', CASE WHEN g % 50 = 0 THEN 'error' ELSE 'success' END, CASE WHEN g % 50 = 0 THEN 502 ELSE 200 END, " +
				"CASE WHEN g % 50 = 0 THEN 'upstream_500' ELSE '' END, 20 + g % 2000, g % 800, 0, (g % 2000) * 1000, 'engine', g % 7, 100 + g % 900, 500 + g % 20000, 'bench' " +
				fmt.Sprintf("FROM generate_series(%d, %d) g", lo, hi)
		default:
			return fmt.Errorf("fill usage: unknown database %s", db.Dialector.Name())
		}
		if err := db.Exec(q).Error; err != nil {
			return fmt.Errorf("fill usage rows %d–%d: %w", lo, hi, err)
		}
		if progress != nil {
			progress(hi + 1)
		}
	}
	return nil
}
