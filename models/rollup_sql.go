package models

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"gorm.io/gorm"
)

// Rollup.Add in SQL, for the backfill (rollup_backfill.go): the sums of a
// range of ledger rows are computed and added to the rollup tables inside
// the database, one INSERT … SELECT … GROUP BY per table. It must count
// exactly as Add does (TestRollupSQLMatchesAdd): the same rows, the same
// buckets, and the same text for a bucket's start on SQLite, so that the
// ledger's writer adding to the same bucket meanwhile meets the same row.

// rollupRange is the ledger rows a backfill batch adds: created in
// (after, afterKey) < (created_at, inference_id) ≤ (through, throughKey)
// (no upper bound when through is zero), final, and final before
// finishedBefore (rows finished later were added by whoever finished them).
type rollupRange struct {
	after          time.Time
	afterKey       string
	through        time.Time
	throughKey     string
	finishedBefore time.Time
	// hourlyFrom: rows created before it are counted by day only, as
	// Rollup.hourlyFrom.
	hourlyFrom time.Time
}

// where restricts q (on usages) to the range's rows.
func (r rollupRange) where(q *gorm.DB) *gorm.DB {
	q = q.Where("created_at >= ? AND (created_at, inference_id) > (?, ?)", r.after, r.after, r.afterKey).
		Where("outcome NOT IN (?, '') AND (finished_at IS NULL OR finished_at < ?)", OutcomePending, r.finishedBefore)
	if !r.through.IsZero() {
		q = q.Where("created_at <= ? AND (created_at, inference_id) <= (?, ?)", r.through, r.through, r.throughKey)
	}
	return q
}

// rollupStatement is one rollup table's INSERT … SELECT from the batch.
type rollupStatement struct {
	table, what string
	key         []string // the conflict key; span and start come from the batch's day and hour
	// cols: the batch's expression for each key column but span and
	// start; filter: which of the batch's rows count.
	cols   map[string]string
	filter string
	sums   []string // column = aggregate
}

// batchTable holds one batch's rows, reduced to what the rollups read,
// for the statements of apply: the ledger's range is read (and each row's
// bucket start and latency buckets computed) once, not once per table.
const batchTable = "rollup_backfill_batch"

// apply adds the range's sums to the four rollup tables, in tx.
func (r rollupRange) apply(tx *gorm.DB) error {
	pg := tx.Dialector.Name() == "postgres"
	create := "CREATE TEMP TABLE " + batchTable
	if pg {
		create += " ON COMMIT DROP"
	}
	sel := "CASE WHEN reason = 'model_not_found' THEN '" + UnknownModel + "' ELSE model END AS model, outcome, " +
		truncSQL(pg, SpanDay) + " AS day, CASE WHEN created_at >= ? THEN " + truncSQL(pg, SpanHour) + " END AS hour, " +
		"COALESCE(user_id, 0) AS user_id, COALESCE(key_id, 0) AS key_id, prompt_tokens, completion_tokens, cost, " +
		"CASE WHEN ttft_ms IS NOT NULL THEN " + bucketSQL("ttft_ms") + " END AS ttft, " +
		"CASE WHEN outcome <> '" + OutcomeRejected + "' OR reason IN ('queue_timeout', 'engine_unavailable') THEN " + bucketSQL("queue_ms") + " END AS queue"
	q := r.where(tx.Session(&gorm.Session{DryRun: true, NewDB: true}).Table("usages").Select(sel, r.hourlyFrom)).Find(&[]map[string]any{}).Statement
	sql := q.SQL.String()
	if pg {
		sql = renumber(sql)
	}
	if err := tx.Exec(create+" AS "+sql, q.Vars...).Error; err != nil {
		return fmt.Errorf("read a batch of the ledger: %w", err)
	}
	money := []string{"requests = COUNT(*)", "prompt_tokens = SUM(prompt_tokens)", "completion_tokens = SUM(completion_tokens)", "cost = SUM(cost)"}
	stmts := []rollupStatement{
		{table: "usage_rollups", what: "usage rollup", key: []string{"span", "start", "model", "outcome"}, sums: money},
		{table: "usage_people", what: "per-person rollup", key: []string{"span", "start", "user_id", "key_id"}, filter: "user_id <> 0", sums: money},
		{table: "usage_person_models", what: "per-person model rollup", key: []string{"user_id", "span", "start", "model", "outcome"},
			filter: "user_id <> 0", sums: money},
		// The latency histograms: TTFT of the rows that have one, queue
		// wait of those that reached admission (reachedAdmission).
		{table: "usage_latencies", what: "latency rollup", key: []string{"span", "start", "model", "metric", "bucket"}, sums: []string{"count = COUNT(*)"},
			cols: map[string]string{"metric": "'" + metricTTFT + "'", "bucket": "ttft"}, filter: "ttft IS NOT NULL"},
		{table: "usage_latencies", what: "latency rollup", key: []string{"span", "start", "model", "metric", "bucket"}, sums: []string{"count = COUNT(*)"},
			cols: map[string]string{"metric": "'" + metricQueue + "'", "bucket": "queue"}, filter: "queue IS NOT NULL"},
	}
	for _, s := range stmts {
		if err := s.exec(tx, pg); err != nil {
			return err
		}
	}
	if pg {
		return nil // dropped at commit
	}
	if err := tx.Exec("DROP TABLE temp." + batchTable).Error; err != nil {
		return fmt.Errorf("drop the backfill's batch: %w", err)
	}
	return nil
}

// exec adds the batch's sums to one table.
func (s rollupStatement) exec(tx *gorm.DB, pg bool) error {
	var sources []string
	for _, span := range []struct{ name, col string }{{SpanDay, "day"}, {SpanHour, "hour"}} {
		sel := []string{"'" + span.name + "' AS span", span.col + " AS start"}
		for _, k := range s.key {
			if k == "span" || k == "start" {
				continue
			}
			expr := k
			if e, ok := s.cols[k]; ok {
				expr = e
			}
			sel = append(sel, expr+" AS "+k)
		}
		where := span.col + " IS NOT NULL"
		if s.filter != "" {
			where += " AND " + s.filter
		}
		sources = append(sources, "SELECT "+strings.Join(sel, ", ")+", prompt_tokens, completion_tokens, cost FROM "+batchTable+" WHERE "+where)
	}
	var targets, values, updates []string
	for _, sum := range s.sums {
		col, expr, _ := strings.Cut(sum, " = ")
		targets = append(targets, col)
		values = append(values, expr)
		updates = append(updates, fmt.Sprintf("%s = %s.%s + excluded.%s", col, s.table, col, col))
	}
	// Rows are added in key order (ORDER BY), as Rollup.Apply does, so
	// that the ledger's writer adding to the same rows cannot deadlock
	// with the backfill on PostgreSQL.
	// Apply sorts strings bytewise: so does COLLATE "C" on PostgreSQL,
	// whatever the database's collation (SQLite's is bytewise already).
	keys := strings.Join(s.key, ", ")
	order := make([]string, len(s.key))
	for i, k := range s.key {
		order[i] = k
		if pg && (k == "span" || k == "model" || k == "outcome" || k == "metric") {
			order[i] += ` COLLATE "C"`
		}
	}
	sql := "INSERT INTO " + s.table + " (" + keys + ", " + strings.Join(targets, ", ") + ") SELECT " + keys + ", " + strings.Join(values, ", ") +
		" FROM (" + strings.Join(sources, " UNION ALL ") + ") AS rows WHERE true GROUP BY " + keys + " ORDER BY " + strings.Join(order, ", ") +
		" ON CONFLICT (" + keys + ") DO UPDATE SET " + strings.Join(updates, ", ")
	if err := tx.Exec(sql).Error; err != nil {
		return fmt.Errorf("add a batch of the ledger to the %s: %w", s.what, err)
	}
	return nil
}

// renumber rewrites PostgreSQL's $n placeholders as ? for gorm's Exec,
// which numbers them again across the whole statement.
func renumber(sql string) string {
	var b strings.Builder
	for i := 0; i < len(sql); i++ {
		if sql[i] == '$' && i+1 < len(sql) && sql[i+1] >= '0' && sql[i+1] <= '9' {
			b.WriteByte('?')
			for i+1 < len(sql) && sql[i+1] >= '0' && sql[i+1] <= '9' {
				i++
			}
			continue
		}
		b.WriteByte(sql[i])
	}
	return b.String()
}

// truncSQL is created_at truncated to a span's start, as Rollup.Add
// computes it (UTC). On SQLite, the text the driver writes for such a time
// ("2006-01-02 15:00:00+00:00"), so that the bucket is the same row.
func truncSQL(pg bool, span string) string {
	unit, sqliteFmt := "hour", "%Y-%m-%d %H:00:00"
	if span == SpanDay {
		unit, sqliteFmt = "day", "%Y-%m-%d 00:00:00"
	}
	if pg {
		return "(date_trunc('" + unit + "', created_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC')"
	}
	// The driver writes UTC times as "2006-01-02 15:04:05.999999999+00:00":
	// cutting the text is several times cheaper than strftime, which
	// stays for a time stored with another offset.
	cut := "13) || ':00:00+00:00'"
	if span == SpanDay {
		cut = "10) || ' 00:00:00+00:00'"
	}
	return "(CASE WHEN substr(created_at, -6) = '+00:00' THEN substr(created_at, 1, " + cut +
		" ELSE strftime('" + sqliteFmt + "', created_at) || '+00:00' END)"
}

// bucketSQL is latencyBucket(col) in SQL: a binary search over the lowest
// millisecond of each bucket, found with latencyBucket itself, so that the
// database's floating point (and its ln, which SQLite may lack) plays no
// part. Latencies beyond the last bound (~2^53 ms, 285,000 years) fall in
// the last bucket.
func bucketSQL(col string) string {
	bounds := bucketBounds()
	var tree func(lo, hi int) string // over bounds[lo:hi]
	tree = func(lo, hi int) string {
		if hi-lo == 1 {
			return strconv.Itoa(bounds[lo].bucket)
		}
		mid := (lo + hi) / 2
		return "CASE WHEN " + col + " < " + strconv.FormatInt(bounds[mid].from, 10) + " THEN " + tree(lo, mid) + " ELSE " + tree(mid, hi) + " END"
	}
	return "(" + tree(0, len(bounds)) + ")"
}

type bucketBound struct {
	from   int64 // the lowest millisecond in the bucket
	bucket int
}

// bucketBounds lists every bucket latencyBucket returns with the lowest
// millisecond in it, ascending; the first (bucket 0) holds all ms ≤ 0.
var bucketBounds = sync.OnceValue(func() []bucketBound {
	bounds := []bucketBound{{from: -1 << 63, bucket: 0}}
	for ms := int64(1); ms < 1<<53; {
		b := latencyBucket(ms)
		bounds = append(bounds, bucketBound{from: ms, bucket: b})
		ms = bucketMax(b) + 1
	}
	return bounds
})
