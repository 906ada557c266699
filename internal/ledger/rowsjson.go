package ledger

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"

	"moonji/internal/jsonguard"
	"moonji/models"
)

// Rows are written as one JSON array bound to a single statement
// (INSERT … SELECT … FROM the array's elements), not as a multi-row INSERT
// with a parameter per column, on both databases.
//
// On SQLite the driver prepares every statement anew, and even a 4-row
// INSERT of 22 columns needs ~50 KiB of memory cells: modernc's allocator
// maps that with mmap and gives it back with munmap, four system calls and
// a dozen page faults per statement, and binding hundreds of parameters
// costs more than the rows' B-tree work. Measured with BenchmarkRecord:
// ~105 µs of CPU per row as 16-row INSERTs, half of it in the kernel,
// against ~60 µs this way. SQLite still keeps a
// statement journal for these statements inside a transaction (a function
// call may fail midway), whose 1 KiB chunks are freed when the statement
// ends: models.keepAllocatorPages keeps the pages they come from mapped.
//
// On PostgreSQL gorm's multi-row Create walked every field of every row by
// reflection, and pgx encoded a parameter per column: 32–37 µs of the
// gateway's CPU and 49 allocations per row in BenchmarkRecord, against 17
// µs and 4 this way; the machine's CPU per row, the server's included, 56–63
// → 45–50 µs. One statement text per kind of write
// also means one prepared statement each in pgx's cache, whatever the
// number of rows.
//
// jsonb, not json: SQLite's json_each hands each row's array to the SELECT
// as JSON text, made anew for every one of its 22 column references and
// parsed again (found by text comparison in SQLite's JSON cache) by each
// ->>; jsonb_each hands out the row as the binary form SQLite parsed the
// whole text into, which ->> reads as it is: ~62 → ~46 µs of CPU per row in
// BenchmarkRecord, and the SQL values are the same (TestJSON*).
// PostgreSQL likewise parses a json element again for each ->>: its machine
// CPU per row was 105–119 µs with json against 45–50 with jsonb.

// usageColumns are the usages columns in the order appendUsageJSON writes
// them; TestJSONColumnsMatchSchema keeps it equal to gorm's.
var usageColumns = []string{"inference_id", "created_at", "finished_at", "user_id", "user", "key_id", "source",
	"api", "model", "backend", "retried_from", "response_id", "outcome", "status", "reason", "prompt_tokens",
	"completion_tokens", "cached_tokens", "cost", "usage_source", "queue_ms", "ttft_ms", "duration_ms", "replica"}

// pgTypes are the PostgreSQL types of the columns that are not text (the
// types gorm's migration gives them), which ->> hands out as text.
var pgTypes = map[string]string{"created_at": "timestamptz", "finished_at": "timestamptz", "user_id": "bigint",
	"key_id": "bigint", "status": "bigint", "prompt_tokens": "bigint", "completion_tokens": "bigint", "cached_tokens": "bigint", "cost": "bigint",
	"queue_ms": "bigint", "ttft_ms": "bigint", "duration_ms": "bigint"}

// sqliteTimeFormat is how the SQLite driver writes a time.Time (its first
// parse format): stored times must compare as text with the driver's.
// PostgreSQL reads it as a timestamptz.
const sqliteTimeFormat = "2006-01-02 15:04:05.999999999-07:00"

// jsonRows are one database's statements that write usage rows from a
// JSON array of arrays (appendUsageJSON's).
type jsonRows struct {
	insert string // new rows, final or pending
	upsert string // Finishes of pending rows
	// max is the most rows one statement writes.
	max int
	// micro cuts times to the microsecond before they are written:
	// PostgreSQL keeps microseconds and rounds the digits after them,
	// where pgx (gorm's writes, and every query's parameters) truncates.
	micro bool
}

// pgStatementRows is the most rows one statement writes on PostgreSQL (a
// batch is at most maxBatch rows). The server's backend spends ~21 µs a row
// on a statement, wherever the kernel runs it — on a gateway's own core too.
// A batch of 256 rows in one statement was ~5 ms of the backend's work in
// one piece, and requests arriving meanwhile waited behind it; in statements
// of 32 rows the backend works in pieces of under a millisecond, with the
// gateway's threads free to run between them.
const pgStatementRows = 32

var (
	sqliteRows = newJSONRows(func(i int, _ string) string { return "value ->> " + strconv.Itoa(i) },
		"jsonb_each(?)", sqliteStatementRows, false)
	postgresRows = newJSONRows(func(i int, c string) string {
		if t, ok := pgTypes[c]; ok {
			return "(v ->> " + strconv.Itoa(i) + ")::" + t
		}
		return "v ->> " + strconv.Itoa(i)
	}, "jsonb_array_elements(?::jsonb) AS v", pgStatementRows, true)
)

// newJSONRows makes the statements that read the rows from the elements of
// the array that from lists, each row's i-th column with value(i, its name).
func newJSONRows(value func(i int, column string) string, from string, max int, micro bool) jsonRows {
	insert := insertSQL(value, from)
	return jsonRows{insert: insert, upsert: upsertSQL(insert), max: max, micro: micro}
}

// rowsFor returns the statements of the database gorm's dialector names.
func rowsFor(dialect string) jsonRows {
	if dialect == "sqlite" {
		return sqliteRows
	}
	return postgresRows
}

// insertSQL is an INSERT of every column from the array's elements, the
// i-th column read by value(i, its name).
func insertSQL(value func(i int, column string) string, from string) string {
	var b strings.Builder
	b.WriteString("INSERT INTO usages (")
	for i, c := range usageColumns {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(`"` + c + `"`)
	}
	b.WriteString(") SELECT ")
	for i, c := range usageColumns {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(value(i, c))
	}
	b.WriteString(" FROM " + from)
	return b.String()
}

// upsertSQL makes insert finish rows that are still pending, never a final
// one: a row another replica closed as gateway_restart (it found this
// replica's heartbeat stale) keeps that outcome, as the rollup counted it.
// WHERE true tells SQLite's parser that ON CONFLICT belongs to the INSERT,
// not to a join.
func upsertSQL(insert string) string {
	var b strings.Builder
	b.WriteString(insert + " WHERE true ON CONFLICT (inference_id) DO UPDATE SET ")
	for i, c := range finalColumns {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(`"` + c + `" = excluded."` + c + `"`)
	}
	b.WriteString(" WHERE usages.outcome = '" + models.OutcomePending + "'")
	return b.String()
}

// write runs query (r.insert or r.upsert) on rows, encoded into buf as a
// JSON array of arrays, and returns how many rows it changed and buf.
func (r *jsonRows) write(tx *gorm.DB, query string, rows []models.Usage, buf []byte) (int64, []byte, error) {
	buf = append(buf[:0], '[')
	for i := range rows {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = appendUsageJSON(buf, &rows[i], r.micro)
	}
	buf = append(buf, ']')
	res := tx.Exec(query, string(buf))
	if res.Error != nil {
		return 0, buf, fmt.Errorf("json write of %d rows: %w", len(rows), res.Error)
	}
	return res.RowsAffected, buf, nil
}

// appendUsageJSON appends u as a JSON array in usageColumns' order, its
// times cut to the microsecond if micro. A zero CreatedAt becomes now, as
// gorm's Create would make it.
func appendUsageJSON(b []byte, u *models.Usage, micro bool) []byte {
	created := u.CreatedAt
	if created.IsZero() {
		created = time.Now()
	}
	finished := u.FinishedAt
	if micro {
		created = created.Truncate(time.Microsecond)
		if finished != nil {
			f := finished.Truncate(time.Microsecond)
			finished = &f
		}
	}
	b = append(b, '[')
	b = jsonguard.AppendString(b, u.InferenceID)
	b = append(b, ',')
	b = appendJSONTime(b, &created)
	b = append(b, ',')
	b = appendJSONTime(b, finished)
	b = append(b, ',')
	b = appendJSONUint(b, u.UserID)
	b = append(b, ',')
	b = jsonguard.AppendString(b, u.User)
	b = append(b, ',')
	b = appendJSONUint(b, u.KeyID)
	for _, s := range [...]string{u.Source, u.API, u.Model, u.Backend, u.RetriedFrom, u.ResponseID, u.Outcome} {
		b = append(b, ',')
		b = jsonguard.AppendString(b, s)
	}
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(u.Status), 10)
	b = append(b, ',')
	b = jsonguard.AppendString(b, u.Reason)
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(u.PromptTokens), 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(u.CompletionTokens), 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(u.CachedTokens), 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, u.Cost, 10)
	b = append(b, ',')
	b = jsonguard.AppendString(b, u.UsageSource)
	b = append(b, ',')
	b = strconv.AppendInt(b, u.QueueMs, 10)
	b = append(b, ',')
	if u.TTFTMs == nil {
		b = append(b, "null"...)
	} else {
		b = strconv.AppendInt(b, *u.TTFTMs, 10)
	}
	b = append(b, ',')
	b = strconv.AppendInt(b, u.DurationMs, 10)
	b = append(b, ',')
	b = jsonguard.AppendString(b, u.Replica)
	return append(b, ']')
}

func appendJSONTime(b []byte, t *time.Time) []byte {
	if t == nil {
		return append(b, "null"...)
	}
	b = append(b, '"')
	b = t.AppendFormat(b, sqliteTimeFormat)
	return append(b, '"')
}

func appendJSONUint(b []byte, v *uint) []byte {
	if v == nil {
		return append(b, "null"...)
	}
	return strconv.AppendUint(b, uint64(*v), 10)
}
