// Package benchdata fills databases for benchmarks: a ledger of realistic
// size and shape, the same in every run.
package benchdata

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"gorm.io/gorm"

	"moonji/models"
)

// SeedLedger adds n final ledger rows spread over the 30 days before now
// (200 people with two keys each, a fifth of requests from the web chat,
// six models, every outcome, lognormal TTFT, some queueing), and those
// people and keys, without the rollups: call models.RebuildRollup after. The
// same seed gives the same rows.
func SeedLedger(ctx context.Context, db *gorm.DB, n int, now time.Time) error {
	rng := rand.New(rand.NewPCG(1, 2))
	const people = 200
	var users, keys []uint
	for i := range people {
		u, err := models.EnsureUser(ctx, db, fmt.Sprintf("person%03d@example.com", i))
		if err != nil {
			return fmt.Errorf("seed the ledger: %w", err)
		}
		users = append(users, u.ID)
		for j := range 2 {
			k := &models.APIKey{UserID: u.ID, Name: fmt.Sprintf("key %d", j), Prefix: fmt.Sprintf("mj-%03d%d", i, j),
				Hash: fmt.Sprintf("bench-%d-%d-%d", i, j, now.UnixNano())}
			if err := models.CreateAPIKey(ctx, db, k); err != nil {
				return fmt.Errorf("seed the ledger: %w", err)
			}
			keys = append(keys, k.ID)
		}
	}
	modelNames := []string{"qwen3-8b", "qwen3-32b", "llama-3.1-70b", "gemma-3-27b", "mistral-small", "embed-small"}
	from := now.Add(-30 * models.Day)
	batch := make([]models.Usage, 0, 500)
	for i := range n {
		created := from.Add(time.Duration(rng.Int64N(int64(30 * models.Day))))
		who := rng.IntN(people)
		uid := users[who]
		u := models.Usage{InferenceID: fmt.Sprintf("bench%07d%d", i, now.UnixNano()%1e6), CreatedAt: created,
			UserID: &uid, User: fmt.Sprintf("person%03d@example.com", who), Source: "api",
			Model: modelNames[min(int(rng.ExpFloat64()*1.5), len(modelNames)-1)], Backend: "b", Replica: "bench"}
		if rng.IntN(5) == 0 {
			u.Source = "web"
		} else {
			kid := keys[who*2+rng.IntN(2)]
			u.KeyID = &kid
		}
		switch p := rng.IntN(1000); {
		case p < 900:
			u.Outcome, u.Status = models.OutcomeSuccess, 200
		case p < 920:
			u.Outcome, u.Status, u.Reason = models.OutcomeError, 502, "upstream_500"
		case p < 945:
			u.Outcome, u.Status, u.Reason = models.OutcomeCancelled, 499, "client_disconnected"
		case p < 960:
			u.Outcome, u.Status, u.Reason = models.OutcomeStopped, 200, "stop_requested"
		case p < 970:
			u.Outcome, u.Status, u.Reason, u.UserID, u.KeyID, u.Model = models.OutcomeRejected, 401, "unauthorized", nil, nil, ""
		default:
			u.Outcome, u.Status = models.OutcomeRejected, 429
			u.Reason = []string{"rate_limited", "queue_full", "queue_timeout"}[rng.IntN(3)]
		}
		if u.Outcome != models.OutcomeRejected {
			u.PromptTokens, u.CompletionTokens = 20+rng.IntN(2000), rng.IntN(800)
			if rng.IntN(4) == 0 {
				u.QueueMs = int64(rng.ExpFloat64() * 400)
			}
			if rng.IntN(10) < 7 {
				ttft := int64(math.Exp(rng.NormFloat64()*0.6 + math.Log(300)))
				u.TTFTMs = &ttft
			}
			u.DurationMs = 500 + rng.Int64N(20000)
		}
		fin := created.Add(time.Duration(u.DurationMs) * time.Millisecond)
		u.FinishedAt = &fin
		batch = append(batch, u)
		if len(batch) == cap(batch) || i == n-1 {
			if err := db.Create(&batch).Error; err != nil {
				return fmt.Errorf("seed the ledger: %w", err)
			}
			batch = batch[:0]
		}
	}
	return nil
}
