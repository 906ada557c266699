package models

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"
)

// usageIndexes lists the indexes of usages, primary key aside.
func usageIndexes(t *testing.T, db *gorm.DB) []string {
	t.Helper()
	var names []string
	var err error
	if db.Dialector.Name() == "postgres" {
		err = db.Raw("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() AND tablename = 'usages' AND indexname <> 'usages_pkey'").Scan(&names).Error
	} else {
		err = db.Raw("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'usages' AND name NOT LIKE 'sqlite_autoindex_%'").Scan(&names).Error
	}
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(names)
	return names
}

// queryPlan returns the database's plan for query, as one text. PostgreSQL
// is told to avoid sequential scans, which it prefers on a table this small.
func queryPlan(t *testing.T, db *gorm.DB, query string, args ...any) string {
	t.Helper()
	var lines []string
	err := db.Transaction(func(tx *gorm.DB) error {
		if tx.Dialector.Name() == "postgres" {
			if err := tx.Exec("SET LOCAL enable_seqscan = off").Error; err != nil {
				return err
			}
			return tx.Raw("EXPLAIN "+query, args...).Scan(&lines).Error
		}
		var rows []struct{ Detail string }
		if err := tx.Raw("EXPLAIN QUERY PLAN "+query, args...).Scan(&rows).Error; err != nil {
			return err
		}
		for _, r := range rows {
			lines = append(lines, r.Detail)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// TestUsageIndexes pins the ledger's indexes (each is written for every
// row), checks that the queries needing them use them, and that an
// upgraded database loses the ones earlier versions made.
func TestUsageIndexes(t *testing.T) {
	want := []string{"idx_usage_outcome_created", "idx_usage_response_id", "idx_usage_user_created", "idx_usages_created_at"}
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		if got := usageIndexes(t, db); !slices.Equal(got, want) {
			t.Fatalf("indexes of usages: %v, want %v", got, want)
		}

		// A database migrated by an earlier version.
		for _, q := range []string{
			"CREATE INDEX idx_usages_key_id ON usages (key_id)",
			"CREATE INDEX idx_usages_replica ON usages (replica)",
			"CREATE INDEX idx_usages_user_id ON usages (user_id)",
			"CREATE INDEX idx_usages_response_id ON usages (response_id)",
		} {
			if err := db.Exec(q).Error; err != nil {
				t.Fatal(err)
			}
		}
		if err := Migrate(db); err != nil {
			t.Fatal(err)
		}
		if got := usageIndexes(t, db); !slices.Equal(got, want) {
			t.Fatalf("indexes of usages after an upgrade: %v, want %v", got, want)
		}

		plan := queryPlan(t, db, "SELECT * FROM usages WHERE response_id = ? AND response_id <> '' LIMIT 1", "resp_1")
		if !strings.Contains(plan, "idx_usage_response_id") {
			t.Errorf("look-up by response id does not use its index:\n%s", plan)
		}
		plan = queryPlan(t, db, "SELECT * FROM usages WHERE created_at >= ? AND user_id = ? ORDER BY created_at, inference_id", time.Now(), 7)
		if !strings.Contains(plan, "idx_usage_user_created") {
			t.Errorf("one person's export does not use idx_usage_user_created:\n%s", plan)
		}
		plan = queryPlan(t, db, "SELECT * FROM usages WHERE outcome = ? AND replica NOT IN (?) LIMIT 500", OutcomePending, "r1")
		if !strings.Contains(plan, "idx_usage_outcome_created") {
			t.Errorf("a vanished replica's pending rows are not found through idx_usage_outcome_created:\n%s", plan)
		}
	})
}

// TestUsageByResponseID finds a Responses request's row by its response id,
// and nothing for an empty id, which every other row has.
func TestUsageByResponseID(t *testing.T) {
	eachDatabase(t, func(t *testing.T, db *gorm.DB) {
		ctx := context.Background()
		now := time.Now().UTC()
		rows := []Usage{
			{InferenceID: "inf_chat", CreatedAt: now, Model: "m", Outcome: OutcomeSuccess, API: "chat"},
			{InferenceID: "inf_resp", CreatedAt: now, Model: "m", Outcome: OutcomeSuccess, API: "responses", ResponseID: "resp_1"},
		}
		if err := db.Create(&rows).Error; err != nil {
			t.Fatal(err)
		}
		u, err := UsageByResponseID(ctx, db, "resp_1")
		if err != nil || u.InferenceID != "inf_resp" {
			t.Fatalf("UsageByResponseID(resp_1) = %+v, %v", u, err)
		}
		for _, id := range []string{"", "resp_2", "resp_1' OR 1=1 --"} {
			if u, err := UsageByResponseID(ctx, db, id); !errors.Is(err, ErrNotFound) {
				t.Errorf("UsageByResponseID(%q) = %+v, %v; want ErrNotFound", id, u, err)
			}
		}
	})
}
