package ledger

import (
	"context"
	"fmt"
	"reflect"
	"testing"
	"time"

	"gorm.io/gorm"

	"moonji/internal/testdb"
	"moonji/models"
)

// The dashboards' aggregates, checked against a set of rows counted by hand:
// every outcome, two models, two people, a key each (and a web request with
// none), a request refused before anyone was known, one for a model nobody
// serves, one refused by a full queue, rows on both sides of a
// UTC midnight, one older than 24 hours, one older than 30 days, one still
// running and one orphaned by a dead replica. The rows go through the
// ledger's writer (Begin/Finish in separate batches and in one, Record) and
// CloseUnfinishedUsage: the paths that keep the rollup.
func TestDashboardAggregatesMatchHandCountedRows(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		db, err := models.Open(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { models.Close(db) })
		l := New(db, nil)
		defer l.Close()

		alice, bob := person(t, db, "alice@example.com"), person(t, db, "bob@example.com")
		a1, b1 := key(t, db, alice, "alice-laptop"), key(t, db, bob, "bob-ci")
		now := time.Date(2026, 11, 30, 0, 30, 0, 0, time.UTC)
		at := func(day, hour, minute int) time.Time { return time.Date(2026, 11, day, hour, minute, 0, 0, time.UTC) }
		ms := func(v int64) *int64 { return &v }
		type r = models.Usage
		final := func(u r) { // begun, then finished in a later batch: the upsert
			begin := u
			if err := <-l.Begin(begin); err != nil {
				t.Fatal(err)
			}
			l.Finish(u)
			if err := l.Flush(ctx); err != nil {
				t.Fatal(err)
			}
		}
		// 1, 2: alice's key, m1, both successes before midnight; 2 is begun
		// and finished in one batch (a merged insert).
		final(r{InferenceID: "r01", CreatedAt: at(29, 23, 10), UserID: &alice, KeyID: &a1, Model: "m1",
			Outcome: models.OutcomeSuccess, PromptTokens: 10, CompletionTokens: 20, TTFTMs: ms(100)})
		two := r{InferenceID: "r02", CreatedAt: at(29, 23, 20), UserID: &alice, KeyID: &a1, Model: "m1",
			PromptTokens: 5, CompletionTokens: 7, TTFTMs: ms(200), QueueMs: 50}
		l.write([]op{{kind: opBegin, row: pending(two)}, {kind: opFinish, row: with(two, models.OutcomeSuccess, "")}}, false)
		// 3: bob's key, m2, an engine error.
		final(r{InferenceID: "r03", CreatedAt: at(29, 23, 40), UserID: &bob, KeyID: &b1, Model: "m2",
			Outcome: models.OutcomeError, Reason: "upstream_500", PromptTokens: 3, QueueMs: 10})
		// 4: after midnight, bob cancels; 5: alice on the web (no key) stops.
		final(r{InferenceID: "r04", CreatedAt: at(30, 0, 5), UserID: &bob, KeyID: &b1, Model: "m2",
			Outcome: models.OutcomeCancelled, Reason: "client_disconnected", PromptTokens: 4, CompletionTokens: 2, TTFTMs: ms(300)})
		final(r{InferenceID: "r05", CreatedAt: at(30, 0, 10), UserID: &alice, Model: "m1",
			Outcome: models.OutcomeStopped, Reason: "stop_requested", PromptTokens: 6, CompletionTokens: 3, TTFTMs: ms(150)})
		// 6–8: rejections: bob's rate limit, a request with a bad key (no
		// person, no model), and a queue timeout after 5 s in the queue.
		l.Record(r{InferenceID: "r06", CreatedAt: at(30, 0, 15), UserID: &bob, KeyID: &b1, Model: "m1",
			Outcome: models.OutcomeRejected, Reason: "rate_limited", Status: 429})
		l.Record(r{InferenceID: "r07", CreatedAt: at(30, 0, 20), Outcome: models.OutcomeRejected, Reason: "unauthorized", Status: 401})
		l.Record(r{InferenceID: "r08", CreatedAt: at(30, 0, 25), UserID: &bob, KeyID: &b1, Model: "m2",
			Outcome: models.OutcomeRejected, Reason: "queue_timeout", Status: 503, QueueMs: 5000})
		// 13: a model nobody serves, counted under one name whatever was asked.
		l.Record(r{InferenceID: "r13", CreatedAt: at(30, 0, 26), UserID: &bob, KeyID: &b1, Model: "gpt-invented",
			Outcome: models.OutcomeRejected, Reason: "model_not_found", Status: 404})
		// 14: a full queue refuses bob at once: it never waited in the queue,
		// so it has no queue wait.
		l.Record(r{InferenceID: "r14", CreatedAt: at(30, 0, 27), UserID: &bob, KeyID: &b1, Model: "m1",
			Outcome: models.OutcomeRejected, Reason: "queue_full", Status: 503})
		// 9: weeks ago (in the 30 days, not in the 24 hours); 12: older than 30 days.
		final(r{InferenceID: "r09", CreatedAt: at(10, 12, 0), UserID: &alice, KeyID: &a1, Model: "m2",
			Outcome: models.OutcomeSuccess, PromptTokens: 100, CompletionTokens: 200, TTFTMs: ms(1000)})
		final(r{InferenceID: "r12", CreatedAt: time.Date(2026, 10, 15, 9, 0, 0, 0, time.UTC), UserID: &alice, KeyID: &a1, Model: "m1",
			Outcome: models.OutcomeSuccess, PromptTokens: 1000, CompletionTokens: 1000})
		// 10: still running on a live replica; 11: left pending by a replica
		// that died, closed below as an error.
		if err := models.Heartbeat(ctx, db, "live", now); err != nil {
			t.Fatal(err)
		}
		if err := <-l.Begin(r{InferenceID: "r10", CreatedAt: at(30, 0, 28), UserID: &alice, KeyID: &a1, Model: "m1", Replica: "live"}); err != nil {
			t.Fatal(err)
		}
		if err := <-l.Begin(r{InferenceID: "r11", CreatedAt: at(29, 23, 50), UserID: &bob, KeyID: &b1, Model: "m1", Replica: "dead"}); err != nil {
			t.Fatal(err)
		}
		if n, err := models.CloseUnfinishedUsage(ctx, db, "", time.Now().Add(-time.Minute)); err != nil || n != 1 {
			t.Fatalf("closed %d rows (%v), want 1", n, err)
		}
		// A Finish that comes after the row was closed changes nothing:
		// the row, and the rollup, keep the outcome counted.
		l.Finish(r{InferenceID: "r11", CreatedAt: at(29, 23, 50), UserID: &bob, KeyID: &b1, Model: "m1",
			Outcome: models.OutcomeSuccess, PromptTokens: 50, CompletionTokens: 50})
		if err := l.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		if u, _ := models.UsageByID(ctx, db, "r11"); u.Outcome != models.OutcomeError || u.Reason != "gateway_restart" {
			t.Fatalf("closed row changed by a late Finish: %+v", u)
		}

		day, month := models.LastDay(now), models.LastMonth(now)
		type p = models.UsagePoint
		h23, h00 := at(29, 23, 0), at(30, 0, 0)
		wantDay := []p{
			{Start: h23, Model: "m1", Outcome: "error", Requests: 1},
			{Start: h23, Model: "m1", Outcome: "success", Requests: 2, PromptTokens: 15, CompletionTokens: 27},
			{Start: h23, Model: "m2", Outcome: "error", Requests: 1, PromptTokens: 3},
			{Start: h00, Outcome: "rejected", Requests: 1},
			{Start: h00, Model: models.UnknownModel, Outcome: "rejected", Requests: 1},
			{Start: h00, Model: "m1", Outcome: "rejected", Requests: 2},
			{Start: h00, Model: "m1", Outcome: "stopped", Requests: 1, PromptTokens: 6, CompletionTokens: 3},
			{Start: h00, Model: "m2", Outcome: "cancelled", Requests: 1, PromptTokens: 4, CompletionTokens: 2},
			{Start: h00, Model: "m2", Outcome: "rejected", Requests: 1},
		}
		samePoints(t, "24 h, everyone", must(models.UsageOverTime(ctx, db, day, 0)), wantDay)
		d10, d29, d30 := at(10, 0, 0), at(29, 0, 0), at(30, 0, 0)
		samePoints(t, "30 days, everyone", must(models.UsageOverTime(ctx, db, month, 0)), []p{
			{Start: d10, Model: "m2", Outcome: "success", Requests: 1, PromptTokens: 100, CompletionTokens: 200},
			{Start: d29, Model: "m1", Outcome: "error", Requests: 1},
			{Start: d29, Model: "m1", Outcome: "success", Requests: 2, PromptTokens: 15, CompletionTokens: 27},
			{Start: d29, Model: "m2", Outcome: "error", Requests: 1, PromptTokens: 3},
			{Start: d30, Outcome: "rejected", Requests: 1},
			{Start: d30, Model: models.UnknownModel, Outcome: "rejected", Requests: 1},
			{Start: d30, Model: "m1", Outcome: "rejected", Requests: 2},
			{Start: d30, Model: "m1", Outcome: "stopped", Requests: 1, PromptTokens: 6, CompletionTokens: 3},
			{Start: d30, Model: "m2", Outcome: "cancelled", Requests: 1, PromptTokens: 4, CompletionTokens: 2},
			{Start: d30, Model: "m2", Outcome: "rejected", Requests: 1},
		})
		samePoints(t, "30 days, alice", must(models.UsageOverTime(ctx, db, month, alice)), []p{
			{Start: d10, Model: "m2", Outcome: "success", Requests: 1, PromptTokens: 100, CompletionTokens: 200},
			{Start: d29, Model: "m1", Outcome: "success", Requests: 2, PromptTokens: 15, CompletionTokens: 27},
			{Start: d30, Model: "m1", Outcome: "stopped", Requests: 1, PromptTokens: 6, CompletionTokens: 3},
		})

		users := must(models.TopUsers(ctx, db, day, 10))
		wantUsers := []models.UserTotal{{UserID: alice, Email: "alice@example.com", Requests: 3, Tokens: 51},
			{UserID: bob, Email: "bob@example.com", Requests: 7, Tokens: 9}}
		if !reflect.DeepEqual(users, wantUsers) {
			t.Errorf("top users (24 h) = %+v\nwant %+v", users, wantUsers)
		}
		if users := must(models.TopUsers(ctx, db, month, 1)); len(users) != 1 || users[0].UserID != alice || users[0].Tokens != 351 || users[0].Requests != 4 {
			t.Errorf("top user (30 days, limit 1) = %+v, want alice with 4 requests and 351 tokens", users)
		}
		keys := must(models.TopKeys(ctx, db, day, 0, 10))
		wantKeys := []models.KeyTotal{
			{KeyID: a1, Name: "alice-laptop", Prefix: "mj-alice-l", Owner: "alice@example.com", Requests: 2, PromptTokens: 15, CompletionTokens: 27},
			{KeyID: b1, Name: "bob-ci", Prefix: "mj-bob-ci", Owner: "bob@example.com", Requests: 7, PromptTokens: 7, CompletionTokens: 2},
		}
		if !reflect.DeepEqual(keys, wantKeys) {
			t.Errorf("top keys (24 h) = %+v\nwant %+v", keys, wantKeys)
		}
		if keys := must(models.TopKeys(ctx, db, day, bob, 10)); len(keys) != 1 || keys[0].KeyID != b1 {
			t.Errorf("bob's keys = %+v, want only bob-ci", keys)
		}

		lat := must(models.Latencies(ctx, db, day))
		if len(lat) != 2 || lat[0].Model != "m1" || lat[1].Model != "m2" {
			t.Fatalf("latencies = %+v, want m1 and m2 (the refused request without a model has none)", lat)
		}
		// m1: TTFT 100, 200, 150 (rows 1, 2, 5); queue 0, 50, 0 and 0 for the
		// closed orphan; the rate-limited row and the one the full queue
		// refused never queued.
		closeTo(t, "m1 ttft", lat[0].TTFT, 3, 150, 200, 200)
		closeTo(t, "m1 queue", lat[0].Queue, 4, 0, 50, 50)
		// m2: TTFT 300 (row 4); queue 10, 0, and 5000 for the queue timeout.
		closeTo(t, "m2 ttft", lat[1].TTFT, 1, 300, 300, 300)
		closeTo(t, "m2 queue", lat[1].Queue, 3, 10, 5000, 5000)

		// The 30 days add row 9 (m2: TTFT 1000, queue 0); row 12 is older.
		// m1 is as in the 24 hours: TTFT 100, 150, 200; queue 0, 0, 0, 50.
		// m2: TTFT 300, 1000; queue 0, 0, 10, 5000 — p50 is the 2nd of 4
		// by nearest rank (0, where the 24 hours' 3 give 10), p95 and p99
		// the 4th.
		lat = must(models.Latencies(ctx, db, month))
		if len(lat) != 2 || lat[0].Model != "m1" || lat[1].Model != "m2" {
			t.Fatalf("30-day latencies = %+v, want m1 and m2", lat)
		}
		closeTo(t, "30 d m1 ttft", lat[0].TTFT, 3, 150, 200, 200)
		closeTo(t, "30 d m1 queue", lat[0].Queue, 4, 0, 50, 50)
		closeTo(t, "30 d m2 ttft", lat[1].TTFT, 2, 300, 1000, 1000)
		closeTo(t, "30 d m2 queue", lat[1].Queue, 4, 0, 5000, 5000)

		// The dashboard's recent rejections (its query, its limit of 20):
		// newest first, each with its reason and status.
		rejected := must(models.RecentUsage(ctx, db, models.OutcomeRejected, 20))
		if got := ids(rejected); !reflect.DeepEqual(got, []string{"r14", "r13", "r08", "r07", "r06"}) {
			t.Errorf("recent rejections = %v, want r14 r13 r08 r07 r06", got)
		}
		var reasons []string
		for _, u := range rejected {
			reasons = append(reasons, fmt.Sprintf("%s %d", u.Reason, u.Status))
		}
		if want := []string{"queue_full 503", "model_not_found 404", "queue_timeout 503", "unauthorized 401", "rate_limited 429"}; !reflect.DeepEqual(reasons, want) {
			t.Errorf("recent rejections' reasons = %q, want %q", reasons, want)
		}
		if got := ids(must(models.RecentUsage(ctx, db, models.OutcomeError, 1))); !reflect.DeepEqual(got, []string{"r11"}) {
			t.Errorf("most recent error = %v, want r11", got)
		}

		// The rollup is exactly what a rebuild from the ledger gives.
		before := rollupRows(t, db)
		if n, err := models.RebuildRollup(ctx, db); err != nil || n != 14 {
			t.Fatalf("rebuild read %d rows (%v), want 14", n, err)
		}
		if after := rollupRows(t, db); !reflect.DeepEqual(before, after) {
			t.Errorf("rollup kept by the writer differs from a rebuild:\n%+v\n%+v", before, after)
		}
	})
}

func person(t *testing.T, db *gorm.DB, email string) uint {
	t.Helper()
	u, err := models.EnsureUser(context.Background(), db, email)
	if err != nil {
		t.Fatal(err)
	}
	return u.ID
}

func key(t *testing.T, db *gorm.DB, user uint, name string) uint {
	t.Helper()
	prefix := "mj-" + name
	if len(prefix) > 10 {
		prefix = prefix[:10]
	}
	k := &models.APIKey{UserID: user, Name: name, Prefix: prefix, Hash: name}
	if err := models.CreateAPIKey(context.Background(), db, k); err != nil {
		t.Fatal(err)
	}
	return k.ID
}

func pending(u models.Usage) models.Usage {
	u.Outcome = models.OutcomePending
	return u
}

func with(u models.Usage, outcome, reason string) models.Usage {
	u.Outcome, u.Reason = outcome, reason
	return u
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func ids(rows []models.Usage) []string {
	var out []string
	for _, u := range rows {
		out = append(out, u.InferenceID)
	}
	return out
}

func samePoints(t *testing.T, what string, got, want []models.UsagePoint) {
	t.Helper()
	for i := range got {
		got[i].Start = got[i].Start.UTC()
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s:\n got %+v\nwant %+v", what, got, want)
	}
}

// closeTo checks percentiles read from the histogram against the exact
// ones: never below, and at most 10 % above.
func closeTo(t *testing.T, what string, got models.Percentiles, count, p50, p95, p99 int64) {
	t.Helper()
	if got.Count != count {
		t.Errorf("%s: %d requests, want %d", what, got.Count, count)
	}
	for _, c := range []struct {
		name      string
		got, want int64
	}{{"p50", got.P50, p50}, {"p95", got.P95, p95}, {"p99", got.P99, p99}} {
		if c.got < c.want || float64(c.got) > float64(c.want)*1.1 {
			t.Errorf("%s %s = %d, want %d (+10 %% at most)", what, c.name, c.got, c.want)
		}
	}
}

type rollupState struct {
	Sums    []models.UsageRollup
	People  []models.UsageByPerson
	Models  []models.UsageOfPerson
	Latency []models.UsageLatency
}

func rollupRows(t *testing.T, db *gorm.DB) rollupState {
	t.Helper()
	var s rollupState
	if err := db.Order("span, start, model, outcome").Find(&s.Sums).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Order("span, start, user_id, key_id").Find(&s.People).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Order("user_id, span, start, model, outcome").Find(&s.Models).Error; err != nil {
		t.Fatal(err)
	}
	for i := range s.Models {
		s.Models[i].Start = s.Models[i].Start.UTC()
	}
	if err := db.Order("span, start, model, metric, bucket").Find(&s.Latency).Error; err != nil {
		t.Fatal(err)
	}
	for i := range s.Sums {
		s.Sums[i].Start = s.Sums[i].Start.UTC()
	}
	for i := range s.People {
		s.People[i].Start = s.People[i].Start.UTC()
	}
	for i := range s.Latency {
		s.Latency[i].Start = s.Latency[i].Start.UTC()
	}
	if len(s.Sums) == 0 || len(s.People) == 0 || len(s.Models) == 0 || len(s.Latency) == 0 {
		t.Fatalf("a rollup table is empty: %+v", s)
	}
	return s
}
