package web_test

import (
	"context"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/models"
)

// A crash leaves pending rows. At start a replica closes its own old ones
// and those of replicas that stopped sending heartbeats, but never those a
// live sibling is still serving.
func TestUnfinishedRowsClosedAtStart(t *testing.T) {
	eachDatabase(t, func(t *testing.T, dbURL string) {
		db, err := models.Open(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now().UTC()
		if err := models.Heartbeat(context.Background(), db, "sibling", now); err != nil {
			t.Fatal(err)
		}
		db.Create(&models.Replica{ID: "gone", StartedAt: now.Add(-time.Hour), SeenAt: now.Add(-10 * time.Minute)})
		rows := []models.Usage{
			{InferenceID: "inf_mine", CreatedAt: now, Outcome: models.OutcomePending, Replica: "me"},
			{InferenceID: "inf_gone", CreatedAt: now, Outcome: models.OutcomePending, Replica: "gone"},
			{InferenceID: "inf_sibling", CreatedAt: now, Outcome: models.OutcomePending, Replica: "sibling"},
			{InferenceID: "inf_done", CreatedAt: now, Outcome: models.OutcomeSuccess, Replica: "me", Status: 200},
		}
		if err := db.Create(&rows).Error; err != nil {
			t.Fatal(err)
		}
		models.Close(db)

		e := startEnv(t, dbURL, func(c *config.Config) { c.ReplicaID = "me" })
		for id, want := range map[string]string{"inf_mine": "error", "inf_gone": "error", "inf_sibling": "pending", "inf_done": "success"} {
			row, err := models.UsageByID(context.Background(), e.DB, id)
			if err != nil {
				t.Fatal(err)
			}
			if row.Outcome != want {
				t.Errorf("%s: outcome %s, want %s", id, row.Outcome, want)
			}
			if want == "error" && (row.Reason != "gateway_restart" || row.FinishedAt == nil) {
				t.Errorf("%s: %+v", id, row)
			}
		}
		// New rows carry this replica's name.
		resp := e.post(`{"model":"m1","messages":[{"role":"user","content":"x"}]}`)
		readAll(t, resp.Body)
		if row := e.final(resp.Header.Get("X-Inference-Id")); row.Replica != "me" {
			t.Errorf("row replica %q", row.Replica)
		}

		// The periodic clean-up of a running replica leaves its own running
		// requests (and its live sibling's) alone.
		e.DB.Create(&models.Usage{InferenceID: "inf_running", CreatedAt: now, Outcome: models.OutcomePending, Replica: "me"})
		if _, err := models.CloseUnfinishedUsage(context.Background(), e.DB, "", time.Now().Add(-time.Minute)); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{"inf_running", "inf_sibling"} {
			if row, _ := models.UsageByID(context.Background(), e.DB, id); row.Outcome != models.OutcomePending {
				t.Errorf("%s of a live replica was closed: %+v", id, row)
			}
		}
	})
}
