package retention

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"gorm.io/gorm"

	"moonji/internal/testdb"
	"moonji/models"
)

func open(t *testing.T, dbURL string) *gorm.DB {
	t.Helper()
	db, err := models.Open(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { models.Close(db) })
	return db
}

// seed writes n rows of outcome created from at, one a minute, with their
// rollup as the ledger writes it.
func seed(t *testing.T, db *gorm.DB, prefix string, at time.Time, n int, outcome string) {
	t.Helper()
	uid := uint(1)
	r := models.NewRollup()
	rows := make([]models.Usage, n)
	for i := range rows {
		created := at.Add(time.Duration(i) * time.Minute)
		rows[i] = models.Usage{InferenceID: fmt.Sprintf("%s%03d", prefix, i), CreatedAt: created, UserID: &uid,
			Model: "m", Outcome: outcome, PromptTokens: 5, CompletionTokens: 7, Cost: 11}
		if outcome != models.OutcomePending {
			rows[i].FinishedAt = &created
		}
		r.Add(&rows[i])
	}
	if err := db.CreateInBatches(&rows, 100).Error; err != nil {
		t.Fatal(err)
	}
	if err := r.Apply(db); err != nil {
		t.Fatal(err)
	}
}

func oldConversation(t *testing.T, db *gorm.DB, updated time.Time) string {
	t.Helper()
	ctx := context.Background()
	u, err := models.EnsureUser(ctx, db, "p@example.com")
	if err != nil {
		t.Fatal(err)
	}
	c := &models.Conversation{ID: models.NewConversationID(), UserID: u.ID, Title: "t"}
	if err := models.CreateConversation(ctx, db, c); err != nil {
		t.Fatal(err)
	}
	m := models.Message{ID: models.NewMessageID(), ConversationID: c.ID, Role: "user", Content: "hello", Status: models.MessageDone}
	if err := db.Create(&m).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Model(&models.Conversation{}).Where("id = ?", c.ID).UpdateColumn("updated_at", updated).Error; err != nil {
		t.Fatal(err)
	}
	return c.ID
}

func count(t *testing.T, db *gorm.DB, model any) int64 {
	t.Helper()
	var n int64
	if err := db.Model(model).Count(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

func TestRunOnceDeletesOldRowsInBatches(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		db := open(t, dbURL)
		ctx := context.Background()
		now := time.Now().UTC()
		seed(t, db, "old", now.Add(-450*models.Day), 35, models.OutcomeSuccess)
		seed(t, db, "pend", now.Add(-450*models.Day), 2, models.OutcomePending)
		seed(t, db, "new", now.Add(-10*models.Day), 4, models.OutcomeError)
		oldConv := oldConversation(t, db, now.Add(-40*models.Day))
		newConv := oldConversation(t, db, now.Add(-time.Hour))
		window := models.Window{From: now.Add(-460 * models.Day).Truncate(models.Day), To: now.Truncate(models.Day).Add(models.Day), Step: models.Day}
		before, err := models.UsageOverTime(ctx, db, window, 0)
		if err != nil {
			t.Fatal(err)
		}

		deleted := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "d"}, []string{"table"})
		var hooked []time.Time
		job := &Job{DB: db, Usage: 400 * models.Day, Conversations: 30 * models.Day, Batch: 10, Pause: time.Millisecond, Deleted: deleted,
			WithUsage: []Table{{Name: "audit", Prune: func(_ context.Context, _ *gorm.DB, before time.Time, _ int) (int64, error) {
				hooked = append(hooked, before)
				return 0, nil
			}}}}
		res, err := job.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Deleted[TableUsage] != 35 || res.Batches[TableUsage] != 4 || res.Deleted[TableConversations] != 1 {
			t.Errorf("result %+v: want 35 usage rows in 4 batches of at most 10, and 1 conversation", res)
		}
		if got := testutil.ToFloat64(deleted.WithLabelValues(TableUsage)); got != 35 {
			t.Errorf("metric usage = %v, want 35", got)
		}
		if want := now.Add(-400 * models.Day).Truncate(models.Day); len(hooked) != 1 || !hooked[0].Equal(want) {
			t.Errorf("the usage-aged hook saw %v, want once with %v", hooked, want)
		}
		if n := count(t, db, &models.Usage{}); n != 6 {
			t.Errorf("%d usage rows left, want the 2 pending and the 4 recent", n)
		}
		if _, err := models.ConversationOf(ctx, db, 1, oldConv); !errors.Is(err, models.ErrNotFound) {
			t.Errorf("old conversation: %v", err)
		}
		var msgs int64
		db.Model(&models.Message{}).Where("conversation_id = ?", oldConv).Count(&msgs)
		if msgs != 0 {
			t.Errorf("%d messages of the deleted conversation left", msgs)
		}
		if _, err := models.ConversationOf(ctx, db, 1, newConv); err != nil {
			t.Errorf("recent conversation: %v", err)
		}
		after, _ := models.UsageOverTime(ctx, db, window, 0)
		if !reflect.DeepEqual(before, after) {
			t.Errorf("dashboard over the old period changed:\n%+v\n%+v", before, after)
		}
		// A second run (or a sibling replica's) finds nothing more.
		res, err = job.RunOnce(ctx)
		if err != nil || res.Deleted[TableUsage] != 0 || res.Deleted[TableConversations] != 0 {
			t.Errorf("second run: %+v, %v", res, err)
		}
	})
}

// 0 keeps everything: the job is off and deletes nothing.
func TestZeroKeepsForever(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		db := open(t, dbURL)
		now := time.Now().UTC()
		seed(t, db, "ancient", now.Add(-9000*models.Day), 3, models.OutcomeSuccess)
		oldConversation(t, db, now.Add(-9000*models.Day))
		job := &Job{DB: db}
		if job.Enabled() {
			t.Fatal("a job without ages is enabled")
		}
		job.Run(context.Background()) // returns at once
		if _, err := job.RunOnce(context.Background()); err != nil {
			t.Fatal(err)
		}
		if count(t, db, &models.Usage{}) != 3 || count(t, db, &models.Conversation{}) != 1 {
			t.Error("rows deleted with retention 0")
		}
	})
}

// A cancelled run stops between batches, and Run returns.
func TestStopsWhenCancelled(t *testing.T) {
	db := open(t, "sqlite://"+t.TempDir()+"/m.db")
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	job := &Job{DB: db, Usage: models.Day, Batch: 5, Delay: time.Nanosecond, Every: time.Nanosecond,
		WithUsage: []Table{{Name: "endless", Prune: func(context.Context, *gorm.DB, time.Time, int) (int64, error) {
			if calls++; calls == 3 {
				cancel()
			}
			return 5, nil // always a full batch: only the cancel ends it
		}}}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		job.Run(ctx)
	}()
	<-done
	if calls != 3 {
		t.Errorf("%d batches, want 3 (it stops at the cancel)", calls)
	}
	if _, err := job.RunOnce(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("RunOnce on a cancelled context: %v", err)
	}
}

// After a batch that took d, a run pauses at least (1-Share)/Share × d:
// however slow the batches, the run works at most its share of the time.
func TestPauseGrowsWithTheBatch(t *testing.T) {
	db := open(t, "sqlite://"+t.TempDir()+"/m.db")
	type call struct{ began, ended time.Time }
	var calls []call
	job := &Job{DB: db, Usage: models.Day, Batch: 5, Pause: time.Millisecond, Share: 0.25,
		WithUsage: []Table{{Name: "slow", Prune: func(context.Context, *gorm.DB, time.Time, int) (int64, error) {
			c := call{began: time.Now()}
			time.Sleep(10 * time.Millisecond) // the batch's cost
			c.ended = time.Now()
			calls = append(calls, c)
			if len(calls) == 4 {
				return 0, nil
			}
			return 5, nil
		}}}}
	if _, err := job.RunOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(calls) != 4 {
		t.Fatalf("%d batches, want 4", len(calls))
	}
	for i := 1; i < len(calls); i++ {
		busy := calls[i-1].ended.Sub(calls[i-1].began)
		if gap := calls[i].began.Sub(calls[i-1].ended); gap < 3*busy {
			t.Errorf("pause after batch %d: %v after %v of work, want at least 3× (share 0.25)", i, gap, busy)
		}
	}
	if got := job.pauseAfter(time.Microsecond); got != time.Millisecond {
		t.Errorf("after a cheap batch the pause is %v, want Pause (1ms)", got)
	}
	if got := (&Job{}).pauseAfter(100 * time.Millisecond); got != 1900*time.Millisecond {
		t.Errorf("default share: %v after 100ms, want 1.9s", got)
	}
}

// A run that finds nothing to delete still gives back the pages an
// interrupted run freed and did not vacuum.
func TestVacuumsAfterAnInterruptedRun(t *testing.T) {
	db := open(t, "sqlite://"+t.TempDir()+"/m.db")
	ctx := context.Background()
	seed(t, db, "old", time.Now().UTC().Add(-50*models.Day), 3000, models.OutcomeSuccess)
	// The interrupted run: its deletes happened, its vacuum did not.
	for {
		n, err := models.PruneUsage(ctx, db, time.Now(), 1000)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	var free int64
	if err := db.Raw("PRAGMA freelist_count").Scan(&free).Error; err != nil || free == 0 {
		t.Fatalf("free pages after the deletes: %d, %v; want some", free, err)
	}
	res, err := (&Job{DB: db, Usage: models.Day, Pause: time.Millisecond}).RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var left int64
	if err := db.Raw("PRAGMA freelist_count").Scan(&left).Error; err != nil {
		t.Fatal(err)
	}
	if res.Deleted[TableUsage] != 0 || left != 0 {
		t.Errorf("run: %d deleted, %d free pages left of %d; want 0 and 0", res.Deleted[TableUsage], left, free)
	}
}
