package models

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// The dashboards read rollups of the ledger, not the ledger: a million rows
// summed on every page load would take seconds on SQLite, and the answer for
// a past hour never changes. The ledger's writer adds every row to the
// rollups in the same transaction that makes the row final
// (ledger.Ledger.write), and CloseUnfinishedUsage does the same for the rows
// it closes, so the rollups are exactly the sums of the final rows: a request
// counts once, under the hour and the day it was created in, with its final
// outcome. Pending rows are not counted until they end (running requests are
// on the live backends view). RebuildRollup recomputes them from the ledger.
//
// Each rollup is kept per hour (Span "h", for the last 24 hours) and per day
// (Span "d", for the last 30 days), so that a view reads at most a few
// dozen buckets, however busy the gateway was: their size depends on how
// many models, people and keys there are, not on how many requests.
const (
	SpanHour = "h"
	SpanDay  = "d"
)

// KeepHours is how long hourly rollup rows are kept; the dashboards read
// only the last 24 hours of them (PruneRollup deletes older ones).
const KeepHours = 8 * Day

// UsageRollup holds requests and tokens per span, model and outcome: the
// "over time" charts of everyone.
type UsageRollup struct {
	Span             string    `gorm:"primaryKey;size:1"`
	Start            time.Time `gorm:"primaryKey;autoIncrement:false"`
	Model            string    `gorm:"primaryKey;size:200"`
	Outcome          string    `gorm:"primaryKey;size:16"`
	Requests         int64
	PromptTokens     int64
	CompletionTokens int64
	Cost             int64 // nano-units (money)
}

// UsageByPerson holds requests and tokens per span, person and key (KeyID
// 0: their web chat), without model or outcome, so that ranking everyone
// over 30 days reads a few hundred rows a day: the top users and keys.
// Requests refused before anyone was known (a bad key) are not in it.
type UsageByPerson struct {
	Span             string    `gorm:"primaryKey;size:1"`
	Start            time.Time `gorm:"primaryKey;autoIncrement:false"`
	UserID           uint      `gorm:"primaryKey;autoIncrement:false"`
	KeyID            uint      `gorm:"primaryKey;autoIncrement:false"`
	Requests         int64
	PromptTokens     int64
	CompletionTokens int64
	Cost             int64 // nano-units (money)
}

// TableName keeps the table's name short.
func (UsageByPerson) TableName() string { return "usage_people" }

// UsageOfPerson holds one person's requests and tokens per span, model and
// outcome: their /usage page. Its primary key starts with the person, so a
// page reads only their rows.
type UsageOfPerson struct {
	UserID           uint      `gorm:"primaryKey;autoIncrement:false"`
	Span             string    `gorm:"primaryKey;size:1"`
	Start            time.Time `gorm:"primaryKey;autoIncrement:false"`
	Model            string    `gorm:"primaryKey;size:200"`
	Outcome          string    `gorm:"primaryKey;size:16"`
	Requests         int64
	PromptTokens     int64
	CompletionTokens int64
	Cost             int64 // nano-units (money)
}

// TableName keeps the table's name short.
func (UsageOfPerson) TableName() string { return "usage_person_models" }

// UsageLatency is a histogram of one latency per span and model: how many
// requests fell into each bucket (latencyBucket). Percentiles over a window
// are read from the sum of its buckets' histograms.
type UsageLatency struct {
	Span   string    `gorm:"primaryKey;size:1"`
	Start  time.Time `gorm:"primaryKey;autoIncrement:false"`
	Model  string    `gorm:"primaryKey;size:200"`
	Metric string    `gorm:"primaryKey;size:8"` // metricTTFT or metricQueue
	Bucket int       `gorm:"primaryKey;autoIncrement:false"`
	Count  int64
}

const (
	metricTTFT  = "ttft"
	metricQueue = "queue"
)

// latencyGrowth is the ratio between a histogram bucket's bounds: a
// percentile read from the histogram is at most 10 % above the true value.
const latencyGrowth = 1.1

var logGrowth = math.Log(latencyGrowth)

// latencyBucket is the histogram bucket of a latency in milliseconds: 0 for
// 0 ms, else b ≥ 1 with latencyGrowth^(b-1) ≤ ms < latencyGrowth^b. An hour
// is bucket 160; a model's latencies usually fill a few dozen.
func latencyBucket(ms int64) int {
	if ms <= 0 {
		return 0
	}
	b := 1 + int(math.Floor(math.Log(float64(ms))/logGrowth))
	// Guard the float edges: the bucket must hold ms.
	for b > 1 && float64(ms) < math.Pow(latencyGrowth, float64(b-1)) {
		b--
	}
	for float64(ms) >= math.Pow(latencyGrowth, float64(b)) {
		b++
	}
	return b
}

// bucketMax is the largest whole millisecond in bucket b.
func bucketMax(b int) int64 {
	if b <= 0 {
		return 0
	}
	return int64(math.Ceil(math.Pow(latencyGrowth, float64(b)))) - 1
}

type totalKey struct {
	span           string
	start          time.Time
	model, outcome string
}

type personKey struct {
	span      string
	start     time.Time
	user, key uint
}

type personModelKey struct {
	user           uint
	span           string
	start          time.Time
	model, outcome string
}

type latencyKey struct {
	span          string
	start         time.Time
	model, metric string
	bucket        int
}

type sums struct{ requests, prompt, completion, cost int64 }

func (s sums) add(u *Usage) sums {
	return sums{s.requests + 1, s.prompt + int64(u.PromptTokens), s.completion + int64(u.CompletionTokens), s.cost + u.Cost}
}

// Rollup gathers the final rows of one write, to add them to the rollup
// tables with one statement per table.
type Rollup struct {
	totals  map[totalKey]sums
	people  map[personKey]sums
	models  map[personModelKey]sums
	latency map[latencyKey]int64
	// hourlyFrom: rows created before it are counted by day only (a
	// backfill's: PruneRollup would delete their hourly rows anyway).
	hourlyFrom time.Time
}

// NewRollup returns an empty Rollup.
func NewRollup() *Rollup {
	return &Rollup{totals: map[totalKey]sums{}, people: map[personKey]sums{}, models: map[personModelKey]sums{},
		latency: map[latencyKey]int64{}}
}

// UnknownModel is the rollups' name for every model a request asked for
// that the gateway does not serve. The ledger keeps the name asked for, but
// anyone with a key can invent names: one rollup row per name would let them
// grow the rollups, and the dashboards' queries, without bound.
const UnknownModel = "(unknown)"

// Add counts a final row. Rows still pending are ignored.
func (r *Rollup) Add(u *Usage) {
	if u.Outcome == OutcomePending || u.Outcome == "" {
		return
	}
	if u.Reason == "model_not_found" {
		v := *u
		v.Model = UnknownModel
		u = &v
	}
	created := u.CreatedAt.UTC()
	var user, key uint
	if u.UserID != nil {
		user = *u.UserID
	}
	if u.KeyID != nil {
		key = *u.KeyID
	}
	for _, span := range [...]struct {
		name string
		size time.Duration
	}{{SpanHour, time.Hour}, {SpanDay, Day}} {
		if span.name == SpanHour && created.Before(r.hourlyFrom) {
			continue
		}
		start := created.Truncate(span.size)
		tk := totalKey{span.name, start, u.Model, u.Outcome}
		r.totals[tk] = r.totals[tk].add(u)
		if user != 0 {
			pk := personKey{span.name, start, user, key}
			r.people[pk] = r.people[pk].add(u)
			mk := personModelKey{user, span.name, start, u.Model, u.Outcome}
			r.models[mk] = r.models[mk].add(u)
		}
		if u.TTFTMs != nil {
			r.latency[latencyKey{span.name, start, u.Model, metricTTFT, latencyBucket(*u.TTFTMs)}]++
		}
		if reachedAdmission(u) {
			r.latency[latencyKey{span.name, start, u.Model, metricQueue, latencyBucket(u.QueueMs)}]++
		}
	}
}

// reachedAdmission reports whether a request got to the backend's queue, so
// that its queue wait means something: everything but requests refused
// before it (bad key, bad body, rate limit, full queue). An engine backend's
// engine_unavailable refusal comes after its slot was granted.
func reachedAdmission(u *Usage) bool {
	return u.Outcome != OutcomeRejected || u.Reason == "queue_timeout" || u.Reason == "engine_unavailable"
}

func addSums(table string, key ...string) clause.OnConflict {
	cols := make([]clause.Column, len(key))
	for i, k := range key {
		cols[i] = clause.Column{Name: k}
	}
	return clause.OnConflict{Columns: cols, DoUpdates: clause.Assignments(map[string]any{
		"requests":          gorm.Expr(table + ".requests + excluded.requests"),
		"prompt_tokens":     gorm.Expr(table + ".prompt_tokens + excluded.prompt_tokens"),
		"completion_tokens": gorm.Expr(table + ".completion_tokens + excluded.completion_tokens"),
		"cost":              gorm.Expr(table + ".cost + excluded.cost"),
	})}
}

var (
	addTotals = addSums("usage_rollups", "span", "start", "model", "outcome")
	addPeople = addSums("usage_people", "span", "start", "user_id", "key_id")
	addModels = addSums("usage_person_models", "user_id", "span", "start", "model", "outcome")
	addCounts = clause.OnConflict{
		Columns:   []clause.Column{{Name: "span"}, {Name: "start"}, {Name: "model"}, {Name: "metric"}, {Name: "bucket"}},
		DoUpdates: clause.Assignments(map[string]any{"count": gorm.Expr("usage_latencies.count + excluded.count")}),
	}
)

// rollupChunk bounds one statement (at most 10 values a row; SQLite allows
// 32766).
const rollupChunk = 256

// Apply adds what was gathered to the rollup tables, in tx. Rows are
// written in key order, so that two replicas' writers adding to the same
// rows lock them in the same order and cannot deadlock.
func (r *Rollup) Apply(tx *gorm.DB) error {
	totals := make([]UsageRollup, 0, len(r.totals))
	for k, s := range r.totals {
		totals = append(totals, UsageRollup{Span: k.span, Start: k.start, Model: k.model, Outcome: k.outcome,
			Requests: s.requests, PromptTokens: s.prompt, CompletionTokens: s.completion, Cost: s.cost})
	}
	slices.SortFunc(totals, func(a, b UsageRollup) int {
		return cmp.Or(cmp.Compare(a.Span, b.Span), a.Start.Compare(b.Start), cmp.Compare(a.Model, b.Model), cmp.Compare(a.Outcome, b.Outcome))
	})
	people := make([]UsageByPerson, 0, len(r.people))
	for k, s := range r.people {
		people = append(people, UsageByPerson{Span: k.span, Start: k.start, UserID: k.user, KeyID: k.key,
			Requests: s.requests, PromptTokens: s.prompt, CompletionTokens: s.completion, Cost: s.cost})
	}
	slices.SortFunc(people, func(a, b UsageByPerson) int {
		return cmp.Or(cmp.Compare(a.Span, b.Span), a.Start.Compare(b.Start), cmp.Compare(a.UserID, b.UserID), cmp.Compare(a.KeyID, b.KeyID))
	})
	ofPerson := make([]UsageOfPerson, 0, len(r.models))
	for k, s := range r.models {
		ofPerson = append(ofPerson, UsageOfPerson{UserID: k.user, Span: k.span, Start: k.start, Model: k.model, Outcome: k.outcome,
			Requests: s.requests, PromptTokens: s.prompt, CompletionTokens: s.completion, Cost: s.cost})
	}
	slices.SortFunc(ofPerson, func(a, b UsageOfPerson) int {
		return cmp.Or(cmp.Compare(a.UserID, b.UserID), cmp.Compare(a.Span, b.Span), a.Start.Compare(b.Start),
			cmp.Compare(a.Model, b.Model), cmp.Compare(a.Outcome, b.Outcome))
	})
	counts := make([]UsageLatency, 0, len(r.latency))
	for k, n := range r.latency {
		counts = append(counts, UsageLatency{Span: k.span, Start: k.start, Model: k.model, Metric: k.metric, Bucket: k.bucket, Count: n})
	}
	slices.SortFunc(counts, func(a, b UsageLatency) int {
		return cmp.Or(cmp.Compare(a.Span, b.Span), a.Start.Compare(b.Start), cmp.Compare(a.Model, b.Model),
			cmp.Compare(a.Metric, b.Metric), cmp.Compare(a.Bucket, b.Bucket))
	})
	if err := upsertChunks(tx, totals, addTotals); err != nil {
		return fmt.Errorf("add to the usage rollup: %w", err)
	}
	if err := upsertChunks(tx, people, addPeople); err != nil {
		return fmt.Errorf("add to the per-person rollup: %w", err)
	}
	if err := upsertChunks(tx, ofPerson, addModels); err != nil {
		return fmt.Errorf("add to the per-person model rollup: %w", err)
	}
	if err := upsertChunks(tx, counts, addCounts); err != nil {
		return fmt.Errorf("add to the latency rollup: %w", err)
	}
	return nil
}

func upsertChunks[T any](tx *gorm.DB, rows []T, add clause.OnConflict) error {
	for chunk := range slices.Chunk(rows, rollupChunk) {
		if err := tx.Clauses(add).Create(&chunk).Error; err != nil {
			return err
		}
	}
	return nil
}

// PruneRollup deletes hourly rollup rows that started before before; daily
// rows are kept.
func PruneRollup(ctx context.Context, db *gorm.DB, before time.Time) error {
	for _, model := range []any{&UsageRollup{}, &UsageByPerson{}, &UsageOfPerson{}, &UsageLatency{}} {
		if err := db.WithContext(ctx).Where("span = ? AND start < ?", SpanHour, before.UTC()).Delete(model).Error; err != nil {
			return fmt.Errorf("prune the hourly rollup: %w", err)
		}
	}
	return nil
}

// RebuildRollup recomputes the rollup tables from the ledger, in one
// transaction: an operator may run it to check or repair the rollup
// (`moonji usage rollup`). Periods whose ledger rows retention may have
// deleted (before UsageKeptFrom, rounded up to a whole day) keep their
// rollups: the ledger no longer holds what they sum.
func RebuildRollup(ctx context.Context, db *gorm.DB) (rows int64, err error) {
	err = db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if tx.Dialector.Name() == "postgres" {
			// One rebuild at a time, and no ledger writer adding to a
			// half-built rollup: they wait for this transaction.
			if err := tx.Exec("LOCK TABLE usage_rollups, usage_people, usage_person_models, usage_latencies IN EXCLUSIVE MODE").Error; err != nil {
				return fmt.Errorf("lock the rollup: %w", err)
			}
		}
		from, err := UsageKeptFrom(ctx, tx)
		if err != nil {
			return err
		}
		if day := from.Truncate(Day); day.Before(from) {
			from = day.Add(Day)
		}
		for _, model := range []any{&UsageRollup{}, &UsageByPerson{}, &UsageOfPerson{}, &UsageLatency{}} {
			if err := tx.Where("start >= ?", from).Delete(model).Error; err != nil {
				return fmt.Errorf("clear the rollup: %w", err)
			}
		}
		r := NewRollup()
		err = EachUsage(ctx, tx, from, func(u *Usage) error {
			r.Add(u)
			rows++
			return nil
		})
		if err != nil {
			return err
		}
		return r.Apply(tx)
	})
	if err != nil {
		return 0, fmt.Errorf("rebuild the usage rollup: %w", err)
	}
	return rows, nil
}

// exists reports whether q finds a row, reading at most one.
func exists(q *gorm.DB) (bool, error) {
	var one []int
	if err := q.Select("1").Limit(1).Find(&one).Error; err != nil {
		return false, fmt.Errorf("look for rows: %w", err)
	}
	return len(one) > 0, nil
}
