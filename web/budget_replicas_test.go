package web_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/models"
)

// Budget proof prices: an input token costs 100,000 nano-units, an output
// token 200,000, so that a few hundred small requests spend a budget of
// 1.00 and a request's reservation is a few percent of it.
var proofPrice = &config.Price{Input: 100, Output: 200}

const proofBudget = int64(1_000_000_000) // 1.00

// TestBudgetsHoldAcrossReplicas: three replicas on one Redis and one
// database, one budget of 1.00 — a key's, a person's or a team's — and 300
// requests at once spread over the replicas, streamed and whole, some
// stopped through another replica, some left by their client. The ledger's
// cost for the budget never passes 1.00; requests sent one by one then
// bring it to at least 1.00 less one request's reservation before one is
// refused; every request has its one row, and every refusal is a rejected
// row with reason budget_exceeded.
func TestBudgetsHoldAcrossReplicas(t *testing.T) {
	for _, scope := range []string{"key", "person", "team"} {
		t.Run(scope, func(t *testing.T) {
			t.Parallel()
			engine := startKillableEngine(t, "m1")
			redisURL, prefix := sharedRedis(t)
			dbURL := sharedDB(t)
			var replicas []*testEnv
			for i := range 3 {
				e := startWithConfig(t, &config.Config{
					DatabaseURL: dbURL, RedisURL: redisURL, RedisPrefix: prefix,
					ReplicaID: fmt.Sprintf("budget-%s-%c-%d", scope, 'A'+i, time.Now().UnixNano()),
					RateLimit: config.RateLimit{RequestsPerMinute: 1_000_000},
					Backends: []config.Backend{{Name: "mock", URL: engine.URL(), MaxConcurrency: 64, MaxQueue: 400,
						QueueTimeout: 60 * time.Second}},
					Models: []config.Model{{Name: "m1", Backend: "mock", Price: proofPrice}},
				}, nil, "")
				replicas = append(replicas, e)
			}
			a := replicas[0]
			email := "spender-" + scope + "@example.com"
			var limits models.Limits
			if scope == "key" {
				limits = models.Limits{Budget: &[]int64{proofBudget}[0], BudgetPeriod: models.BudgetMonth}
			}
			key, keyID := a.limitedKey(email, limits)
			user, err := models.UserByEmail(context.Background(), a.DB, email)
			if err != nil {
				t.Fatal(err)
			}
			switch scope {
			case "person":
				b := proofBudget
				if err := models.SetPersonBudget(context.Background(), a.DB, user.ID, &b, models.BudgetMonth); err != nil {
					t.Fatal(err)
				}
			case "team":
				b := proofBudget
				team, err := models.CreateTeam(context.Background(), a.DB, "spenders-"+prefix, models.Limits{Budget: &b, BudgetPeriod: models.BudgetTotal})
				if err != nil {
					t.Fatal(err)
				}
				if err := models.AddTeamMember(context.Background(), a.DB, team.ID, user.ID); err != nil {
					t.Fatal(err)
				}
			}
			spent := func() int64 {
				t.Helper()
				for _, e := range replicas {
					_ = e.srv.Ledger.Flush(context.Background())
				}
				var sum int64
				if err := a.DB.Model(&models.Usage{}).Where("user_id = ?", user.ID).
					Select("COALESCE(SUM(cost), 0)").Scan(&sum).Error; err != nil {
					t.Fatal(err)
				}
				return sum
			}

			// 300 at once.
			var (
				wg                         sync.WaitGroup
				mu                         sync.Mutex
				ids                        []string
				ok, refused, stopped, left atomic.Int64
			)
			for i := range 300 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					e := replicas[i%3]
					stream := i%2 == 0
					body := fmt.Sprintf(`{"model":"m1","messages":[{"role":"user","content":"question %d"}],"max_tokens":20,"stream":%t,"mock":{"tps":400}}`, i, stream)
					ctx, cancel := context.WithCancel(context.Background())
					defer cancel()
					resp := e.postWith(ctx, key, body)
					id := resp.Header.Get("X-Inference-Id")
					mu.Lock()
					ids = append(ids, id)
					mu.Unlock()
					switch {
					case resp.StatusCode == http.StatusTooManyRequests:
						if ae := decodeError(t, resp); ae.Error.Code != "budget_exceeded" {
							t.Errorf("refusal: %+v", ae)
						}
						refused.Add(1)
						return
					case resp.StatusCode != http.StatusOK:
						t.Errorf("status %d: %s", resp.StatusCode, readAll(t, resp.Body))
						resp.Body.Close()
						return
					}
					switch {
					case stream && i%10 == 0: // stopped through another replica
						buf := make([]byte, 64)
						_, _ = resp.Body.Read(buf)
						cancelVia(t, replicas[(i+1)%3], key, id)
						readAll(t, resp.Body)
						stopped.Add(1)
					case stream && i%10 == 4: // the client leaves
						buf := make([]byte, 64)
						_, _ = resp.Body.Read(buf)
						cancel()
						left.Add(1)
					default:
						readAll(t, resp.Body)
						ok.Add(1)
					}
					resp.Body.Close()
				}()
			}
			wg.Wait()
			for _, id := range ids {
				a.final(id)
			}
			afterBurst := spent()
			t.Logf("%s: burst ok %d, refused %d, stopped %d, left %d; spent %d of %d", scope, ok.Load(), refused.Load(),
				stopped.Load(), left.Load(), afterBurst, proofBudget)
			if afterBurst > proofBudget {
				t.Fatalf("%s budget overspent under concurrency: %d > %d", scope, afterBurst, proofBudget)
			}

			// One by one until refused.
			body := `{"model":"m1","messages":[{"role":"user","content":"one more"}],"max_tokens":20}`
			reservation := int64(len(body)+256)*100_000 + 20*200_000
			for i := 0; ; i++ {
				if i > 1000 {
					t.Fatal("never refused")
				}
				e := replicas[i%3]
				a.settled(user.ID, &keyID)
				resp := e.postWith(context.Background(), key, body)
				id := resp.Header.Get("X-Inference-Id")
				if resp.StatusCode == http.StatusOK {
					readAll(t, resp.Body)
					resp.Body.Close()
					a.final(id)
					continue
				}
				if resp.StatusCode != http.StatusTooManyRequests {
					t.Fatalf("status %d", resp.StatusCode)
				}
				decodeError(t, resp)
				if row := a.final(id); row.Outcome != models.OutcomeRejected || row.Reason != "budget_exceeded" {
					t.Fatalf("refused row: %+v", row)
				}
				break
			}
			final := spent()
			if final > proofBudget || final < proofBudget-reservation {
				t.Fatalf("%s: spent %d, want between %d and %d", scope, final, proofBudget-reservation, proofBudget)
			}
			var rows, rejected int64
			a.DB.Model(&models.Usage{}).Where("user_id = ?", user.ID).Count(&rows)
			a.DB.Model(&models.Usage{}).Where("user_id = ? AND reason = ?", user.ID, "budget_exceeded").Count(&rejected)
			if rejected < refused.Load()+1 || rows < 301 {
				t.Fatalf("rows %d (rejected %d) for %d requests refused in the burst", rows, rejected, refused.Load())
			}
		})
	}
}
