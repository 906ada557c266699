package models

import (
	"context"
	"testing"
	"time"

	"gorm.io/gorm"
)

// Every latency falls in a bucket whose largest value is at least it and at
// most 10 % more: what the dashboards promise of their percentiles.
func TestLatencyBucketsHoldTheirValues(t *testing.T) {
	for ms := int64(0); ms <= 200_000; ms += 1 + ms/97 {
		b := latencyBucket(ms)
		top := bucketMax(b)
		if top < ms || float64(top) > float64(ms)*latencyGrowth {
			t.Fatalf("%d ms: bucket %d reads as %d", ms, b, top)
		}
		if b > 0 && bucketMax(b-1) >= ms {
			t.Fatalf("%d ms: bucket %d, but bucket %d already reaches %d", ms, b, b-1, bucketMax(b-1))
		}
	}
	if b := latencyBucket(3_600_000); b > 160 {
		t.Errorf("an hour is bucket %d, want at most 160", b)
	}
}

// A ledger from before the rollup existed gets one at its first start, and
// the dashboards count its rows.
func TestMigrateBuildsTheRollupOfAnOlderLedger(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		hour := time.Now().UTC().Truncate(time.Hour)
		rows := []Usage{
			{InferenceID: "a", CreatedAt: hour.Add(time.Minute), Model: "m", Outcome: OutcomeSuccess, PromptTokens: 2, CompletionTokens: 3},
			{InferenceID: "b", CreatedAt: hour.Add(2 * time.Minute), Model: "m", Outcome: OutcomeRejected, Reason: "rate_limited"},
			{InferenceID: "c", CreatedAt: hour.Add(3 * time.Minute), Model: "m", Outcome: OutcomePending},
		}
		// Written the way an older version did: no rollup.
		if err := db.Create(&rows).Error; err != nil {
			t.Fatal(err)
		}
		if err := Migrate(db); err != nil {
			t.Fatal(err)
		}
		got, err := UsageOverTime(ctx, db, LastDay(time.Now()), 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[0].Outcome != OutcomeRejected || got[1].Outcome != OutcomeSuccess ||
			got[1].Requests != 1 || got[1].CompletionTokens != 3 {
			t.Fatalf("after migrating: %+v, want one rejected and one success (the pending row uncounted)", got)
		}
		// Once built, a later start leaves it alone (no double count).
		if err := Migrate(db); err != nil {
			t.Fatal(err)
		}
		if again, _ := UsageOverTime(ctx, db, LastDay(time.Now()), 0); len(again) != 2 || again[1].Requests != 1 {
			t.Fatalf("after a second start: %+v", again)
		}
	})
}

// Pruning drops hourly rows before the cut and keeps the daily ones.
func TestPruneRollupKeepsDays(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		old := time.Now().UTC().Add(-10 * Day)
		r := NewRollup()
		uid := uint(7)
		r.Add(&Usage{CreatedAt: old, UserID: &uid, Model: "m", Outcome: OutcomeSuccess, TTFTMs: new(int64)})
		if err := r.Apply(db); err != nil {
			t.Fatal(err)
		}
		if err := PruneRollup(ctx, db, time.Now().Add(-KeepHours)); err != nil {
			t.Fatal(err)
		}
		for _, m := range []any{&UsageRollup{}, &UsageByPerson{}, &UsageOfPerson{}, &UsageLatency{}} {
			var spans []string
			if err := db.Model(m).Distinct("span").Pluck("span", &spans).Error; err != nil {
				t.Fatal(err)
			}
			if len(spans) != 1 || spans[0] != SpanDay {
				t.Errorf("%T keeps spans %v, want only %q", m, spans, SpanDay)
			}
		}
	})
}
