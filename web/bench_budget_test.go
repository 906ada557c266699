//go:build bench

package web_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"moonji/internal/config"
	"moonji/internal/mockllm"
	"moonji/internal/testredis"
	"moonji/models"
)

// BenchmarkBudgetOverhead measures what three budgets (the key's, its
// person's and a team's) add to a request on Redis, against a request under
// none: sequential whole answers of a priced model through one gateway on a
// private redis-server, MOONJI_BENCH_N (default 2000) a round, the two keys
// alternated for three rounds. It reports each round's p50 and the Redis
// commands a budgeted request runs (one script call at admission, one at
// its end):
//
//	go test -tags bench ./web -run '^$' -bench BudgetOverhead -benchtime 1x
func BenchmarkBudgetOverhead(b *testing.B) {
	n := envInt("MOONJI_BENCH_N", 2000)
	b.Setenv(testredis.EnvURL, testredis.Start(b))
	be := testredis.Real(b)
	mock := mockllm.New(mockllm.Options{Models: []string{"m1"}, Tokens: 16, MaxRecords: 1000, Logger: quietLog()})
	ms := httptest.NewServer(mock)
	defer ms.Close()
	env := startBenchGateway(b, ms.URL, nil, func(c *config.Config) {
		c.RedisURL, c.RedisPrefix = be.URL, be.Prefix
		c.Models[0].Price = &config.Price{Input: 0.15, Output: 0.6}
	})
	ctx := context.Background()
	plenty := int64(1_000_000) * 1_000_000_000
	free := randomIDKey(b, env.testEnv, "free@example.com", 0)
	held := randomIDKey(b, env.testEnv, "held@example.com", 0)
	user, err := models.UserByEmail(ctx, env.DB, "held@example.com")
	if err != nil {
		b.Fatal(err)
	}
	var heldKey models.APIKey
	env.DB.Where("user_id = ?", user.ID).Take(&heldKey)
	for _, err := range []error{
		models.SetKeyBudget(ctx, env.DB, heldKey.ID, &plenty, models.BudgetDay),
		models.SetPersonBudget(ctx, env.DB, user.ID, &plenty, models.BudgetMonth),
	} {
		if err != nil {
			b.Fatal(err)
		}
	}
	team, err := models.CreateTeam(ctx, env.DB, "bench", models.Limits{Budget: &plenty, BudgetPeriod: models.BudgetTotal})
	if err != nil {
		b.Fatal(err)
	}
	if err := models.AddTeamMember(ctx, env.DB, team.ID, user.ID); err != nil {
		b.Fatal(err)
	}
	env.srv.Policies.Forget()

	client := benchClient()
	url := env.URL + "/v1/chat/completions"
	body := `{"model":"m1","max_tokens":16,"messages":[{"role":"user","content":"Hello there"}]}`
	round := func(key string) time.Duration {
		lat := make([]time.Duration, 0, n)
		for range n {
			start := time.Now()
			if s := do(client, url, key, body); s != http.StatusOK {
				b.Fatalf("status %d", s)
			}
			lat = append(lat, time.Since(start))
		}
		return pct(lat, 50)
	}
	for b.Loop() {
		round(free) // warm-up
		round(held)
		var none, three []time.Duration
		for range 3 {
			none = append(none, round(free))
			three = append(three, round(held))
		}
		// Script calls a request adds with its budgets: a budgeted round's
		// against a free one's (the rate limit and the lease run scripts
		// too). The last settle of a round may land just after it.
		scripts := func(key string) float64 {
			before := be.CommandStats(b)["evalsha"]
			round(key)
			env.settled(user.ID, &heldKey.ID)
			return float64(be.CommandStats(b)["evalsha"]-before) / float64(n)
		}
		perRequest := scripts(held) - scripts(free)
		fmt.Fprintf(os.Stderr, "p50 without budgets %v, with three %v; script calls a budgeted request adds %.2f\n", none, three, perRequest)
		added := (three[0] + three[1] + three[2] - none[0] - none[1] - none[2]) / 3
		b.ReportMetric(us(added), "added-p50-µs")
		b.ReportMetric(perRequest, "evalsha/req")
	}
}
