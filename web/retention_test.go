package web_test

import (
	"context"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/models"
	"moonji/web"
)

// TestServerRunsRetention: a server configured with retention.usage starts
// the retention job, which deletes a ledger row older than that (and only
// it), leaving the rollup that counts it.
func TestServerRunsRetention(t *testing.T) {
	defer web.SetRetentionDelay(10 * time.Millisecond)()
	dbURL := "sqlite://" + t.TempDir() + "/m.db"
	db, err := models.Open(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	old, recent := now.Add(-3*models.Day), now.Add(-time.Hour)
	for _, u := range []models.Usage{
		{InferenceID: "old-row", CreatedAt: old, FinishedAt: &old, Model: "m1", Outcome: models.OutcomeSuccess},
		{InferenceID: "recent-row", CreatedAt: recent, FinishedAt: &recent, Model: "m1", Outcome: models.OutcomeSuccess},
	} {
		if err := db.Create(&u).Error; err != nil {
			t.Fatal(err)
		}
	}
	// The audit log is pruned at the usage age too.
	for _, a := range []models.AuditEvent{
		{At: old, Actor: "a@example.com", Action: "key.create", Target: "old-event"},
		{At: recent, Actor: "a@example.com", Action: "key.create", Target: "recent-event"},
	} {
		if err := models.InsertAuditEvent(context.Background(), db, &a); err != nil {
			t.Fatal(err)
		}
	}
	models.Close(db)

	e := startEnv(t, dbURL, func(c *config.Config) { c.Retention.Usage, c.Retention.Share = config.Age(models.Day), 1 })
	if got := e.srv.Retention.Share; got != 1 {
		t.Errorf("the job's share is %g, want the configured 1", got)
	}
	left := func(id string) bool {
		var n int64
		if err := e.DB.Model(&models.Usage{}).Where("inference_id = ?", id).Count(&n).Error; err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	waitFor(t, "the old row deleted by the server's retention job", 30*time.Second, func() bool { return !left("old-row") })
	if !left("recent-row") {
		t.Error("the recent row was deleted too")
	}
	events := func(target string) int64 {
		var n int64
		if err := e.DB.Model(&models.AuditEvent{}).Where("target = ?", target).Count(&n).Error; err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor(t, "the old audit event deleted by the same job", 30*time.Second, func() bool { return events("old-event") == 0 })
	if events("recent-event") != 1 {
		t.Error("the recent audit event was deleted too")
	}
	// The rollup built at start (the backfill) still counts the old row.
	var requests int64
	err = e.DB.Model(&models.UsageRollup{}).Select("COALESCE(SUM(requests), 0)").
		Where("span = ? AND start = ?", models.SpanDay, old.Truncate(models.Day)).Scan(&requests).Error
	if err != nil || requests != 1 {
		t.Errorf("the old row's day in the rollup: %d requests, %v; want 1", requests, err)
	}
}
