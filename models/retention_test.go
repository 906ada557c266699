package models

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"
)

// seedAged writes n final rows created at created (one per minute after
// it), and adds them to the rollup as the ledger would.
func seedAged(t *testing.T, db *gorm.DB, prefix string, created time.Time, n int, outcome string) {
	t.Helper()
	uid, kid := uint(3), uint(4)
	r := NewRollup()
	rows := make([]Usage, n)
	for i := range rows {
		ttft := int64(100 + i)
		at := created.Add(time.Duration(i) * time.Minute)
		fin := at.Add(time.Second)
		rows[i] = Usage{InferenceID: fmt.Sprintf("%s%04d", prefix, i), CreatedAt: at, UserID: &uid, KeyID: &kid,
			Model: "m", Outcome: outcome, PromptTokens: 10, CompletionTokens: i, Cost: int64(i), TTFTMs: &ttft}
		if outcome != OutcomePending {
			rows[i].FinishedAt = &fin
		}
		r.Add(&rows[i])
	}
	if err := db.CreateInBatches(&rows, 200).Error; err != nil {
		t.Fatal(err)
	}
	if err := r.Apply(db); err != nil {
		t.Fatal(err)
	}
}

// rollupSnapshot is every rollup row, in a stable order.
func rollupSnapshot(t *testing.T, db *gorm.DB) []any {
	t.Helper()
	var a []UsageRollup
	var b []UsageByPerson
	var c []UsageOfPerson
	var d []UsageLatency
	for _, q := range []struct {
		dst   any
		order string
	}{{&a, "span, start, model, outcome"}, {&b, "span, start, user_id, key_id"},
		{&c, "user_id, span, start, model, outcome"}, {&d, "span, start, model, metric, bucket"}} {
		if err := db.Order(q.order).Find(q.dst).Error; err != nil {
			t.Fatal(err)
		}
	}
	for i := range a {
		a[i].Start = a[i].Start.UTC()
	}
	for i := range b {
		b[i].Start = b[i].Start.UTC()
	}
	for i := range c {
		c[i].Start = c[i].Start.UTC()
	}
	for i := range d {
		d[i].Start = d[i].Start.UTC()
	}
	return []any{a, b, c, d}
}

func countUsage(t *testing.T, db *gorm.DB, where string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := db.Model(&Usage{}).Where(where, args...).Count(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// Old final rows go, in batches of the size asked; recent and pending rows
// stay; the rollups (and so the dashboards and budgets over the old
// period) do not move, and a rebuild of the rollup leaves the pruned
// period's sums alone.
func TestPruneUsage(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		now := time.Now().UTC()
		old := now.Add(-500 * Day).Truncate(Day)
		seedAged(t, db, "old", old, 35, OutcomeSuccess)
		seedAged(t, db, "pend", old.Add(time.Hour), 3, OutcomePending)
		seedAged(t, db, "new", now.Add(-2*Day), 5, OutcomeError)
		window := Window{From: old.Add(-Day), To: now.Truncate(Day).Add(Day), Step: Day}
		before, err := UsageOverTime(ctx, db, window, 0)
		if err != nil {
			t.Fatal(err)
		}
		mine, _ := UsageOverTime(ctx, db, window, 3)
		snap := rollupSnapshot(t, db)

		cutoff := now.Add(-400 * Day).Truncate(Day)
		if err := MarkUsageKept(ctx, db, cutoff); err != nil {
			t.Fatal(err)
		}
		var batches []int64
		for {
			n, err := PruneUsage(ctx, db, cutoff, 10)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
			batches = append(batches, n)
		}
		if !reflect.DeepEqual(batches, []int64{10, 10, 10, 5}) {
			t.Errorf("batches = %v, want [10 10 10 5]", batches)
		}
		if n := countUsage(t, db, "inference_id LIKE ?", "old%"); n != 0 {
			t.Errorf("%d old rows left", n)
		}
		if n := countUsage(t, db, "outcome = ?", OutcomePending); n != 3 {
			t.Errorf("%d pending rows left, want 3", n)
		}
		if n := countUsage(t, db, "inference_id LIKE ?", "new%"); n != 5 {
			t.Errorf("%d recent rows left, want 5", n)
		}
		after, _ := UsageOverTime(ctx, db, window, 0)
		mineAfter, _ := UsageOverTime(ctx, db, window, 3)
		if !reflect.DeepEqual(before, after) || !reflect.DeepEqual(mine, mineAfter) || !reflect.DeepEqual(snap, rollupSnapshot(t, db)) {
			t.Errorf("the rollups moved:\n%+v\n%+v", before, after)
		}
		spent, err := spentSince(ctx, db, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if want := int64(35*34/2 + 5*4/2); spent != want {
			t.Errorf("spent since forever = %d, want %d (the deleted rows' cost still counts)", spent, want)
		}
		// A rebuild recomputes only what the ledger still holds.
		if _, err := RebuildRollup(ctx, db); err != nil {
			t.Fatal(err)
		}
		if again, _ := UsageOverTime(ctx, db, window, 0); !reflect.DeepEqual(before, again) {
			t.Errorf("after a rebuild:\n%+v\nwant\n%+v", again, before)
		}
		if from, _ := UsageKeptFrom(ctx, db); !from.Equal(cutoff) {
			t.Errorf("kept from %v, want %v", from, cutoff)
		}
		// Never backwards.
		if err := MarkUsageKept(ctx, db, cutoff.Add(-Day)); err != nil {
			t.Fatal(err)
		}
		if from, _ := UsageKeptFrom(ctx, db); !from.Equal(cutoff) {
			t.Errorf("kept from moved back to %v", from)
		}
	})
}

// spentSince sums usage_people's daily cost, as budgets read it.
func spentSince(ctx context.Context, db *gorm.DB, since time.Time) (int64, error) {
	var s int64
	err := db.WithContext(ctx).Model(&UsageByPerson{}).Select("COALESCE(SUM(cost), 0)").
		Where("span = ? AND start >= ?", SpanDay, since.UTC()).Scan(&s).Error
	return s, err
}

// An old conversation goes with its messages (and their search entries),
// attachments and share links; a recent one and one still streaming stay.
func TestPruneConversations(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		u, err := EnsureUser(ctx, db, "old@example.com")
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now().UTC()
		mk := func(title string, age time.Duration, status string) string {
			c := &Conversation{ID: NewConversationID(), UserID: u.ID, Title: title, Model: "m"}
			if err := CreateConversation(ctx, db, c); err != nil {
				t.Fatal(err)
			}
			for i, st := range []string{MessageDone, status} {
				m := Message{ID: NewMessageID(), ConversationID: c.ID, Role: "user", Content: "zebra words " + title, Status: st}
				if err := db.Create(&m).Error; err != nil {
					t.Fatal(err)
				}
				a := Attachment{ID: NewAttachmentID(), UserID: u.ID, ConversationID: &c.ID, MessageID: &m.ID, Position: i, Data: []byte("x")}
				if err := db.Create(&a).Error; err != nil {
					t.Fatal(err)
				}
			}
			if err := db.Create(&Share{Token: c.ID[2:], UserID: u.ID, ConversationID: c.ID}).Error; err != nil {
				t.Fatal(err)
			}
			if err := db.Model(&Conversation{}).Where("id = ?", c.ID).UpdateColumn("updated_at", now.Add(-age)).Error; err != nil {
				t.Fatal(err)
			}
			return c.ID
		}
		var olds []string
		for i := range 5 {
			olds = append(olds, mk(fmt.Sprintf("old%d", i), 100*Day, MessageDone))
		}
		recent := mk("recent", Day, MessageDone)
		streaming := mk("streaming", 100*Day, MessageStreaming)

		var batches []int64
		for {
			n, err := PruneConversations(ctx, db, now.Add(-30*Day), 2)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
			batches = append(batches, n)
		}
		if !reflect.DeepEqual(batches, []int64{2, 2, 1}) {
			t.Errorf("batches = %v, want [2 2 1]", batches)
		}
		for _, id := range olds {
			if _, err := ConversationOf(ctx, db, u.ID, id); !errors.Is(err, ErrNotFound) {
				t.Errorf("old conversation %s: %v", id, err)
			}
		}
		for _, m := range []any{&Message{}, &Attachment{}, &Share{}} {
			var left int64
			if err := db.Model(m).Where("conversation_id IN ?", olds).Count(&left).Error; err != nil {
				t.Fatal(err)
			}
			if left != 0 {
				t.Errorf("%T: %d rows of deleted conversations left", m, left)
			}
			if err := db.Model(m).Where("conversation_id IN ?", []string{recent, streaming}).Count(&left).Error; err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int64{true: 2, false: 4}[reflect.TypeOf(m) == reflect.TypeOf(&Share{})]; left != want {
				t.Errorf("%T: %d rows of kept conversations, want %d", m, left, want)
			}
		}
		found, err := ListConversations(ctx, db, u.ID, "zebra", nil, 20)
		if err != nil {
			t.Fatal(err)
		}
		if len(found) != 2 {
			t.Errorf("search finds %d conversations, want the 2 kept", len(found))
		}
	})
}

// A new SQLite database is made with auto_vacuum INCREMENTAL, and the pages
// a deletion frees go back to the file system.
func TestIncrementalVacuum(t *testing.T) {
	db := openTestDB(t, "sqlite://"+t.TempDir()+"/v.db")
	ctx := context.Background()
	if mode, err := SQLiteAutoVacuum(ctx, db); err != nil || mode != 2 {
		t.Fatalf("auto_vacuum = %d, %v; want 2 (INCREMENTAL)", mode, err)
	}
	seedAged(t, db, "v", time.Now().Add(-10*Day), 3000, OutcomeSuccess)
	for {
		n, err := PruneUsage(ctx, db, time.Now(), 1000)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
	}
	free, err := sqlitePragma(ctx, db, "freelist_count")
	if err != nil || free == 0 {
		t.Fatalf("free pages after deleting = %d, %v; want some", free, err)
	}
	// One call frees as many pages as it asks.
	if left, err := IncrementalVacuum(ctx, db, 10); err != nil || left != free-10 {
		t.Fatalf("one step of 10 pages left %d of %d free, %v", left, free, err)
	}
	for range 1000 {
		if free, err = IncrementalVacuum(ctx, db, 10); err != nil {
			t.Fatal(err)
		}
		if free == 0 {
			break
		}
	}
	if free != 0 {
		t.Errorf("%d free pages left after vacuuming", free)
	}
}

// A UsagePruner's batches each begin where the last ended (a lower bound
// on created_at, so PostgreSQL's index scan starts past the entries of the
// rows just deleted), and rows that share the last one's time are not
// skipped.
func TestUsagePrunerResumes(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		old := time.Now().UTC().Add(-500 * Day).Truncate(Day)
		seedAged(t, db, "a", old, 7, OutcomeSuccess)
		// 15 rows of one instant: the first batch ends among them.
		same := make([]Usage, 15)
		for i := range same {
			fin := old.Add(time.Hour)
			same[i] = Usage{InferenceID: fmt.Sprintf("same%02d", i), CreatedAt: old.Add(time.Hour), FinishedAt: &fin, Model: "m", Outcome: OutcomeSuccess}
		}
		if err := db.Create(&same).Error; err != nil {
			t.Fatal(err)
		}
		seedAged(t, db, "b", old.Add(2*time.Hour), 4, OutcomeSuccess)
		var selects []string
		if err := db.Callback().Query().After("gorm:query").Register("test:sql", func(tx *gorm.DB) {
			if tx.Statement.Table == "usages" {
				selects = append(selects, tx.Statement.SQL.String())
			}
		}); err != nil {
			t.Fatal(err)
		}
		defer db.Callback().Query().Remove("test:sql")

		prune := UsagePruner()
		var batches []int64
		for {
			n, err := prune(ctx, db, old.Add(Day), 10)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
			batches = append(batches, n)
		}
		if !reflect.DeepEqual(batches, []int64{10, 10, 6}) {
			t.Errorf("batches = %v, want [10 10 6]", batches)
		}
		if n := countUsage(t, db, "1 = 1"); n != 0 {
			t.Errorf("%d rows left", n)
		}
		if len(selects) < 2 || strings.Contains(selects[0], ">=") || !strings.Contains(selects[1], "created_at >=") {
			t.Errorf("the batches' look-ups: %q; want the first from the oldest, the next from the last one's time", selects)
		}
	})
}

// An interrupted backfill of the rollup resumes where it stopped and ends
// with the same rollup as one uninterrupted run.
func TestBackfillRollupResumes(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		base := time.Now().UTC().Add(-3 * Day)
		seedAged(t, db, "a", base, 230, OutcomeSuccess)
		seedAged(t, db, "b", base.Add(30*time.Second), 40, OutcomeRejected) // ties of created_at order by id
		seedAged(t, db, "p", base, 7, OutcomePending)
		want := rollupSnapshot(t, db)
		for _, m := range []any{&UsageRollup{}, &UsageByPerson{}, &UsageOfPerson{}, &UsageLatency{}} {
			if err := db.Where("1 = 1").Delete(m).Error; err != nil {
				t.Fatal(err)
			}
		}
		cctx, cancel := context.WithCancel(ctx)
		batches := 0
		backfillBatchDone = func() {
			if batches++; batches == 3 {
				cancel()
			}
		}
		defer func() { backfillBatchDone = nil }()
		if err := backfillRollup(cctx, db, 20); !errors.Is(err, context.Canceled) {
			t.Fatalf("interrupted backfill: %v", err)
		}
		p, err := progressOf(ctx, db, progressRollupBackfill)
		if err != nil || p == nil || p.Done || p.Key == "" {
			t.Fatalf("progress after the interruption: %+v, %v", p, err)
		}
		batches = 0
		if err := backfillRollup(ctx, db, 20); err != nil {
			t.Fatal(err)
		}
		if batches >= 270/20 {
			t.Errorf("the resumed run took %d batches: it started over", batches)
		}
		if got := rollupSnapshot(t, db); !reflect.DeepEqual(got, want) {
			t.Errorf("resumed backfill's rollup differs from the ledger's:\n%+v\nwant\n%+v", got, want)
		}
		// Done: later starts only read.
		if err := Migrate(db); err != nil {
			t.Fatal(err)
		}
		if got := rollupSnapshot(t, db); !reflect.DeepEqual(got, want) {
			t.Error("a later Migrate changed the rollup")
		}
	})
}
