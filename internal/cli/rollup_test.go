package cli

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"moonji/models"
)

// `moonji usage rollup` brings the dashboards' sums back in line with the
// ledger, here after rows were written around the writer.
func TestUsageRollupRebuildsFromTheLedger(t *testing.T) {
	cfg := writeConfig(t)
	dbURL := "sqlite://" + filepath.Join(filepath.Dir(cfg), "moonji.db")
	write := func(rows ...models.Usage) {
		db, err := models.Open(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer models.Close(db)
		if err := db.Create(&rows).Error; err != nil {
			t.Fatal(err)
		}
	}
	count := func() int64 {
		db, err := models.Open(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer models.Close(db)
		points, err := models.UsageOverTime(context.Background(), db, models.LastDay(time.Now()), 0)
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, p := range points {
			n += p.Requests
		}
		return n
	}
	now := time.Now().UTC()
	write(models.Usage{InferenceID: "a", CreatedAt: now, Model: "m", Outcome: models.OutcomeSuccess})
	if _, err := run(t, "usage", "rollup", "--config", cfg); err != nil {
		t.Fatal(err)
	}
	write(models.Usage{InferenceID: "b", CreatedAt: now, Model: "m", Outcome: models.OutcomeError},
		models.Usage{InferenceID: "c", CreatedAt: now, Model: "m", Outcome: models.OutcomePending})
	if got := count(); got != 1 {
		t.Fatalf("before the rebuild the rollup counts %d requests, want 1 (rows written around the writer)", got)
	}
	out, err := run(t, "usage", "rollup", "--config", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "from 3 ledger rows") {
		t.Errorf("output %q does not say how many rows it read", out)
	}
	if got := count(); got != 2 {
		t.Errorf("after the rebuild the rollup counts %d requests, want 2 (the pending one waits)", got)
	}
	if _, err := run(t, "usage", "rollup", "extra"); err == nil {
		t.Error("an argument was accepted")
	}
}
