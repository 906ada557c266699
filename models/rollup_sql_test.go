package models

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"testing"
	"time"

	"gorm.io/gorm"
)

// TestRollupSQLMatchesAdd: the backfill's set-based SQL counts a varied
// ledger exactly as Rollup.Add does — unknown models, no person, no key,
// every outcome, rows older than the hourly rollups, latencies from 0 to
// days — and its buckets are the same rows the ledger's writer adds to
// later (a row written by Apply afterwards adds to them, no duplicate).
func TestRollupSQLMatchesAdd(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		now := time.Now().UTC()
		outcomes := []string{OutcomeSuccess, OutcomeError, OutcomeCancelled, OutcomeStopped, OutcomeRejected, OutcomePending}
		reasons := []string{"", "model_not_found", "queue_timeout", "engine_unavailable", "rate_limited"}
		lat := []int64{0, 1, 2, 3, 9, 10, 11, 99, 100, 101, 1234, 59_999, 3_600_000, 86_400_000 * 3, -4}
		rows := make([]Usage, 600)
		r := NewRollup()
		r.hourlyFrom = now.Add(-KeepHours)
		for i := range rows {
			at := now.Add(-time.Minute - time.Duration(i)*37*time.Minute).Add(time.Duration(i%1000) * time.Microsecond * 7)
			fin := at.Add(time.Second) // before the backfill begins: it counts the row
			u := Usage{InferenceID: fmt.Sprintf("q%05d", i), CreatedAt: at, FinishedAt: &fin, Model: fmt.Sprintf("m%d", i%3),
				Outcome: outcomes[i%len(outcomes)], Reason: reasons[i%len(reasons)], PromptTokens: i, CompletionTokens: 2 * i,
				Cost: int64(i * 1000), QueueMs: lat[i%len(lat)]}
			if i%4 != 0 {
				uid := uint(1 + i%5)
				u.UserID = &uid
			}
			if i%3 != 0 {
				kid := uint(1 + i%7)
				u.KeyID = &kid
			}
			if i%5 != 0 {
				ttft := lat[(i/2)%len(lat)] + int64(i%13)
				u.TTFTMs = &ttft
			}
			rows[i] = u
			r.Add(&rows[i])
		}
		if err := db.CreateInBatches(&rows, 100).Error; err != nil {
			t.Fatal(err)
		}
		if err := r.Apply(db); err != nil {
			t.Fatal(err)
		}
		want := rollupSnapshot(t, db)
		for _, m := range []any{&UsageRollup{}, &UsageByPerson{}, &UsageOfPerson{}, &UsageLatency{}} {
			if err := db.Where("1 = 1").Delete(m).Error; err != nil {
				t.Fatal(err)
			}
		}
		if err := backfillRollup(ctx, db, 64); err != nil {
			t.Fatal(err)
		}
		got := rollupSnapshot(t, db)
		for i := range want {
			if !reflect.DeepEqual(got[i], want[i]) {
				t.Errorf("rollup table %d from SQL:\n%+v\nfrom Add:\n%+v", i, got[i], want[i])
			}
		}
		// The writer's next row lands in the same bucket rows.
		again := NewRollup()
		again.Add(&rows[1])
		if err := again.Apply(db); err != nil {
			t.Fatal(err)
		}
		for i, m := range []any{&UsageRollup{}, &UsageByPerson{}, &UsageOfPerson{}, &UsageLatency{}} {
			var n int64
			if err := db.Model(m).Count(&n).Error; err != nil {
				t.Fatal(err)
			}
			if n != int64(reflect.ValueOf(want[i]).Len()) {
				t.Errorf("rollup table %d: %d rows after one more write, want %d (a bucket's start written twice differently?)", i, n, reflect.ValueOf(want[i]).Len())
			}
		}
	})
}

// TestBucketSQL: the SQL histogram bucket is latencyBucket's, at every
// bound and around it.
func TestBucketSQL(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		var values []int64
		for _, b := range bucketBounds() {
			if b.from > -1<<62 {
				values = append(values, b.from-1, b.from, b.from+1)
			}
		}
		values = append(values, -1<<62, 0, 1<<62, 1<<63-1)
		list, _ := json.Marshal(values)
		from := "(SELECT CAST(value AS INTEGER) AS ms FROM json_each(?)) v"
		if db.Dialector.Name() == "postgres" {
			from = "(SELECT jsonb_array_elements_text(?::jsonb)::bigint AS ms) v"
		}
		var got []struct{ Ms, B int64 }
		if err := db.Raw("SELECT ms, "+bucketSQL("ms")+" AS b FROM "+from, string(list)).Scan(&got).Error; err != nil {
			t.Fatal(err)
		}
		if len(got) != len(values) {
			t.Fatalf("%d values back, want %d", len(got), len(values))
		}
		for _, g := range got {
			if want := latencyBucket(g.Ms); g.Ms < 1<<53 && g.B != int64(want) {
				t.Errorf("bucket of %d ms: SQL %d, latencyBucket %d", g.Ms, g.B, want)
			}
		}
	})
}
