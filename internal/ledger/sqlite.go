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

// On SQLite, rows are written as one JSON array bound to a single
// statement (INSERT … SELECT … FROM jsonb_each(?)), not as a multi-row
// INSERT with a parameter per column. The driver prepares every statement
// anew, and even a 4-row INSERT of 22 columns needs ~50 KiB of memory
// cells: modernc's allocator maps that with mmap and gives it back with
// munmap, four system calls and a dozen page faults per statement, and
// binding hundreds of parameters costs more than the rows' B-tree work. Measured
// with BenchmarkRecord: ~105 µs of CPU per row as 16-row INSERTs, half of
// it in the kernel, against ~60 µs this way (BENCHMARKS.md §17). SQLite
// still keeps a statement journal for these statements inside a
// transaction (a function call may fail midway), whose 1 KiB chunks are
// freed when the statement ends: models.keepAllocatorPages keeps the pages
// they come from mapped.
//
// jsonb_each, not json_each: json_each hands each row's array to the
// SELECT as JSON text, made anew for every one of its 22 column references
// and parsed again (found by text comparison in SQLite's JSON cache) by each
// ->>. jsonb_each hands out the row as the binary form SQLite parsed the
// whole text into, which ->> reads as it is: ~62 → ~46 µs of CPU per row
// in BenchmarkRecord, and the SQL values are the same (TestSQLiteJSON*).

// sqliteColumns are the usages columns in the order appendUsageJSON writes
// them; TestSQLiteColumnsMatchSchema keeps it equal to gorm's.
var sqliteColumns = []string{"inference_id", "created_at", "finished_at", "user_id", "user", "key_id", "source",
	"api", "model", "backend", "retried_from", "response_id", "outcome", "status", "reason", "prompt_tokens",
	"completion_tokens", "usage_source", "queue_ms", "ttft_ms", "duration_ms", "replica"}

// sqliteTimeFormat is how the SQLite driver writes a time.Time (its first
// parse format): stored times must compare as text with the driver's.
const sqliteTimeFormat = "2006-01-02 15:04:05.999999999-07:00"

var (
	sqliteInsert       = "INSERT INTO usages" + sqliteSelect()
	sqliteUpsertFinish = sqliteUpsertSQL()
)

func sqliteSelect() string {
	var b strings.Builder
	b.WriteString(" (")
	for i, c := range sqliteColumns {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(`"` + c + `"`)
	}
	b.WriteString(") SELECT ")
	for i := range sqliteColumns {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("value ->> " + strconv.Itoa(i))
	}
	b.WriteString(" FROM jsonb_each(?)")
	return b.String()
}

// sqliteUpsertSQL finishes pending rows (upsertFinal): WHERE true tells
// SQLite's parser that ON CONFLICT belongs to the INSERT, not to a join.
func sqliteUpsertSQL() string {
	var b strings.Builder
	b.WriteString("INSERT INTO usages" + sqliteSelect() + " WHERE true ON CONFLICT (inference_id) DO UPDATE SET ")
	for i, c := range finalColumns {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(`"` + c + `" = excluded."` + c + `"`)
	}
	b.WriteString(" WHERE usages.outcome = '" + models.OutcomePending + "'")
	return b.String()
}

// sqliteWrite runs one of the statements above on rows, as a JSON array of
// arrays, and returns how many rows it changed.
func sqliteWrite(tx *gorm.DB, query string, rows []models.Usage, buf []byte) (int64, []byte, error) {
	buf = append(buf[:0], '[')
	for i := range rows {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = appendUsageJSON(buf, &rows[i])
	}
	buf = append(buf, ']')
	res := tx.Exec(query, string(buf))
	if res.Error != nil {
		return 0, buf, fmt.Errorf("sqlite json write of %d rows: %w", len(rows), res.Error)
	}
	return res.RowsAffected, buf, nil
}

// appendUsageJSON appends u as a JSON array in sqliteColumns' order. A
// zero CreatedAt becomes now, as gorm's Create would make it.
func appendUsageJSON(b []byte, u *models.Usage) []byte {
	created := u.CreatedAt
	if created.IsZero() {
		created = time.Now()
	}
	b = append(b, '[')
	b = jsonguard.AppendString(b, u.InferenceID)
	b = append(b, ',')
	b = appendJSONTime(b, &created)
	b = append(b, ',')
	b = appendJSONTime(b, u.FinishedAt)
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
