package web_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"moonji/internal/apikey"
	"moonji/internal/config"
	"moonji/internal/money"
	"moonji/models"
)

// priced gives m1 a price that makes costs easy to read: an input token
// costs 1,000 nano-units, an output token 2,000.
func priced(c *config.Config) {
	for i := range c.Models {
		if c.Models[i].Name == "m1" {
			c.Models[i].Price = &config.Price{Input: 1, Output: 2}
		}
	}
}

// limitedKey issues a key for email with limits.
func (e *testEnv) limitedKey(email string, limits models.Limits) (string, uint) {
	e.t.Helper()
	u, err := models.EnsureUser(context.Background(), e.DB, email)
	if err != nil {
		e.t.Fatal(err)
	}
	secret, k, err := apikey.CreateLimited(context.Background(), e.DB, u.ID, "limited", 0, 0, limits)
	if err != nil {
		e.t.Fatal(err)
	}
	return secret, k.ID
}

func amount(t testing.TB, s string) *int64 {
	t.Helper()
	n, err := money.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return &n
}

// settled waits until no request of person user (sending with key, nil
// for their chat) holds a reservation against their budgets: a request's
// reservation is replaced by its cost just after it ends, off its path, so
// a request sent at once could find the last one's still held.
func (e *testEnv) settled(user uint, key *uint) {
	e.t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p, err := e.srv.Policies.For(ctx, user, key)
		if err != nil {
			e.t.Fatal(err)
		}
		states, err := e.srv.Budgets.Status(ctx, p.Limits, time.Now())
		held := err != nil
		for _, s := range states {
			held = held || s.Reserved != 0
		}
		if !held {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("reservations still held after 10 s: %+v, %v", states, err)
		}
		time.Sleep(time.Millisecond)
	}
}

type apiErrorBody struct {
	Error struct {
		Message, Type, Code string
	}
}

func decodeError(t testing.TB, resp *http.Response) apiErrorBody {
	t.Helper()
	defer resp.Body.Close()
	var e apiErrorBody
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
		t.Fatalf("decode error body: %v", err)
	}
	return e
}

// TestEveryRowHasItsCost: a priced model's rows cost their tokens at its
// price, streamed or not, with or without the client's include_usage; a
// free model's cost nothing.
func TestEveryRowHasItsCost(t *testing.T) {
	eachDatabase(t, func(t *testing.T, dbURL string) {
		e := startEnv(t, dbURL, priced)
		for _, body := range []string{
			`{"model":"m1","messages":[{"role":"user","content":"hi there"}],"max_tokens":7}`,
			`{"model":"m1","messages":[{"role":"user","content":"hi there"}],"max_tokens":7,"stream":true}`,
			`{"model":"m1","messages":[{"role":"user","content":"hi there"}],"max_tokens":7,"stream":true,"stream_options":{"include_usage":true}}`,
			`{"model":"renamed","messages":[{"role":"user","content":"hi there"}],"max_tokens":7}`,
		} {
			resp := e.post(body)
			readAll(t, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s: status %d", body, resp.StatusCode)
			}
			row := e.final(resp.Header.Get("X-Inference-Id"))
			if row.PromptTokens == 0 || row.CompletionTokens != 7 {
				t.Fatalf("%s: tokens %d/%d", body, row.PromptTokens, row.CompletionTokens)
			}
			want := int64(row.PromptTokens)*1000 + int64(row.CompletionTokens)*2000
			if row.Model == "renamed" {
				want = 0
			}
			if row.Cost != want {
				t.Errorf("%s: cost %d, want %d", body, row.Cost, want)
			}
		}
	})
}

// TestKeyBudgetRefusesWhatDoesNotFit: requests one by one on a key with a
// budget until one is refused: the key spent no more than its budget, and
// at least the budget less one request's reservation; the refusal is a 429
// in OpenAI's shape naming the key's budget and its renewal, with a
// rejected row, and the engine never saw it.
func TestKeyBudgetRefusesWhatDoesNotFit(t *testing.T) {
	eachDatabase(t, func(t *testing.T, dbURL string) {
		e := startEnv(t, dbURL, priced)
		key, keyID := e.limitedKey("budget@example.com", models.Limits{Budget: amount(t, "0.002"), BudgetPeriod: models.BudgetDay})
		owner, err := models.UserByEmail(context.Background(), e.DB, "budget@example.com")
		if err != nil {
			t.Fatal(err)
		}
		body := `{"model":"m1","messages":[{"role":"user","content":"hi"}],"max_tokens":20}`
		reservation := int64(len(body)+256)*1000 + 20*2000
		var spent int64
		for i := 0; ; i++ {
			if i > 100 {
				t.Fatal("never refused")
			}
			e.settled(owner.ID, &keyID)
			before := len(e.Mock.Requests())
			resp := e.postWith(context.Background(), key, body)
			if resp.StatusCode == http.StatusOK {
				readAll(t, resp.Body)
				resp.Body.Close()
				spent += e.final(resp.Header.Get("X-Inference-Id")).Cost
				continue
			}
			id := resp.Header.Get("X-Inference-Id")
			if resp.StatusCode != http.StatusTooManyRequests {
				t.Fatalf("status %d", resp.StatusCode)
			}
			ae := decodeError(t, resp)
			if ae.Error.Type != "insufficient_quota" || ae.Error.Code != "budget_exceeded" ||
				!strings.Contains(ae.Error.Message, "key") || !strings.Contains(ae.Error.Message, "renews") {
				t.Fatalf("refusal: %+v", ae)
			}
			if resp.Header.Get("Retry-After") == "" {
				t.Error("no Retry-After on a day budget's refusal")
			}
			if n := len(e.Mock.Requests()); n != before {
				t.Fatalf("the engine saw the refused request (%d → %d)", before, n)
			}
			row := e.final(id)
			if row.Outcome != models.OutcomeRejected || row.Reason != "budget_exceeded" || row.Cost != 0 || row.Status != 429 {
				t.Fatalf("refused row: %+v", row)
			}
			break
		}
		budget := int64(2_000_000)
		if spent > budget || spent < budget-reservation {
			t.Fatalf("spent %d of a budget of %d (reservation %d)", spent, budget, reservation)
		}
		var sum int64
		if err := e.DB.Model(&models.Usage{}).Where("key_id = ?", keyID).Select("COALESCE(SUM(cost), 0)").Scan(&sum).Error; err != nil {
			t.Fatal(err)
		}
		if sum != spent {
			t.Fatalf("ledger says %d, answers said %d", sum, spent)
		}
	})
}

// TestModelListHidesTheRest: a key limited to one model gets 404
// model_not_found for another, as for an unknown one, and /v1/models lists
// only its own.
func TestModelListHidesTheRest(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db", priced, func(c *config.Config) {
		c.Backends[0].APIs = []string{"chat", "completions", "responses", "embeddings"}
	})
	key, _ := e.limitedKey("models@example.com", models.Limits{Models: "renamed"})
	zero := int64(0)
	broke, _ := e.limitedKey("broke@example.com", models.Limits{Budget: &zero, BudgetPeriod: models.BudgetTotal})
	for path, body := range map[string]string{
		"/v1/chat/completions": `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`,
		"/v1/completions":      `{"model":"m1","prompt":"hi"}`,
		"/v1/responses":        `{"model":"m1","input":"hi"}`,
		"/v1/embeddings":       `{"model":"m1","input":"hi"}`,
	} {
		for _, c := range []struct {
			key    string
			status int
			code   string
		}{{key, http.StatusNotFound, "model_not_found"}, {broke, http.StatusTooManyRequests, "budget_exceeded"}} {
			e.Key = c.key
			resp := e.postPath(context.Background(), path, body)
			if resp.StatusCode != c.status {
				t.Fatalf("%s: status %d, want %d", path, resp.StatusCode, c.status)
			}
			if ae := decodeError(t, resp); ae.Error.Code != c.code || c.code == "model_not_found" && !strings.Contains(ae.Error.Message, "`m1` does not exist") {
				t.Fatalf("%s: refusal %+v", path, ae)
			}
		}
	}
	resp := e.postWith(context.Background(), key, `{"model":"renamed","messages":[{"role":"user","content":"hi"}]}`)
	readAll(t, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("allowed model: status %d", resp.StatusCode)
	}
	for path, want := range map[string]string{"/v1/models": `"renamed"`, "/v1/models/m1": "model_not_found", "/v1/models/renamed": `"renamed"`} {
		req, _ := http.NewRequest(http.MethodGet, e.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got := readAll(t, resp.Body)
		resp.Body.Close()
		if !strings.Contains(got, want) || (path == "/v1/models" && strings.Contains(got, `"m1"`)) {
			t.Errorf("%s: %s", path, got)
		}
	}
}

// tokenFrame is a stream frame that carries text: a chat chunk's content, a
// completion's text, a Responses text delta.
var tokenFrame = regexp.MustCompile(`"(content|text|delta)":"[^"]`)

// TestCostOfEveryEnding: whatever way a request ends — an answer, an
// engine's error before or during it, a client that left, a Stop, an engine
// that hung up, a refusal — on every API, streamed or whole, with or
// without the client's include_usage, its row costs exactly its tokens at
// the model's price, and the same tokens cost the same on every route.
func TestCostOfEveryEnding(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/c.db", priced, func(c *config.Config) {
		c.Backends[0].APIs = []string{"chat", "completions", "responses", "embeddings"}
	})
	price := money.Price{Input: 1_000_000_000, Output: 2_000_000_000} // 1 and 2 per million (priced)
	type ending struct {
		name, mock string
		stream     bool
		act        func(resp *http.Response, id string)
	}
	readToEnd := func(resp *http.Response, _ string) { readAll(t, resp.Body) }
	// readSome reads the first frames of a stream, past its first tokens.
	readSome := func(resp *http.Response, _ string) {
		sc := bufio.NewScanner(resp.Body)
		for frames := 0; frames < 3 && sc.Scan(); {
			if line := sc.Text(); strings.HasPrefix(line, "data:") && tokenFrame.MatchString(line) {
				frames++
			}
		}
	}
	stop := func(resp *http.Response, id string) {
		readSome(resp, id)
		cancelVia(t, e, e.Key, id)
		readAll(t, resp.Body)
	}
	endings := []ending{
		{"answer", `{"tps":2000}`, false, readToEnd},
		{"answer", `{"tps":2000}`, true, readToEnd},
		{"engine error before", `{"fail_status":400}`, false, readToEnd},
		{"engine error during", `{"tps":2000,"stream_error_after":3}`, true, readToEnd},
		{"engine hung up", `{"tps":2000,"disconnect_after":4}`, true, readToEnd},
		{"stopped", `{"tps":50}`, true, stop},
		{"client left", `{"tps":50}`, true, nil},
	}
	paths := map[string]string{
		"/v1/chat/completions": `{"model":"m1","messages":[{"role":"user","content":"how much is this"}],"max_tokens":12%s,"mock":%s}`,
		"/v1/completions":      `{"model":"m1","prompt":"how much is this","max_tokens":12%s,"mock":%s}`,
		"/v1/responses":        `{"model":"m1","input":"how much is this","max_output_tokens":12%s,"mock":%s}`,
	}
	answers := map[string]int64{} // route and tokens → cost
	for path, tmpl := range paths {
		for _, end := range endings {
			for _, usage := range []string{"", `,"stream_options":{"include_usage":true}`} {
				if path == "/v1/responses" && usage != "" || !end.stream && usage != "" {
					continue // Responses streams always end with usage; a whole answer has no stream options
				}
				streamField := ""
				if end.stream {
					streamField = `,"stream":true` + usage
				}
				body := fmt.Sprintf(tmpl, streamField, end.mock)
				ctx, cancel := context.WithCancel(context.Background())
				resp := e.postPath(ctx, path, body)
				id := resp.Header.Get("X-Inference-Id")
				if end.act == nil {
					readSome(resp, id)
					cancel()
				} else {
					end.act(resp, id)
				}
				resp.Body.Close()
				cancel()
				row := e.final(id)
				want := money.Cost(price, money.Tokens{Prompt: int64(row.PromptTokens), Cached: int64(row.CachedTokens),
					Completion: int64(row.CompletionTokens)})
				if row.Cost != want {
					t.Errorf("%s %s stream=%t usage=%q: %s row with %d/%d tokens costs %d, want %d", path, end.name, end.stream,
						usage, row.Outcome, row.PromptTokens, row.CompletionTokens, row.Cost, want)
				}
				if end.stream && row.CompletionTokens == 0 {
					t.Errorf("%s %s: the stream made no tokens: %+v", path, end.name, row)
				}
				if end.name == "answer" {
					k := fmt.Sprintf("%s %d %d", path, row.PromptTokens, row.CompletionTokens)
					if c, ok := answers[k]; ok && c != row.Cost {
						t.Errorf("%s: the same tokens cost %d and %d", k, c, row.Cost)
					}
					answers[k] = row.Cost
					if row.Outcome != models.OutcomeSuccess || row.Cost == 0 {
						t.Errorf("%s answer: %+v", path, row)
					}
				}
			}
		}
	}
	// A refusal costs nothing, whatever it asked for.
	resp := e.post(`{"model":"m1","messages":[{"role":"user","content":"x"}],"max_tokens":100000`)
	readAll(t, resp.Body)
	resp.Body.Close()
	if row := e.final(resp.Header.Get("X-Inference-Id")); row.Outcome != models.OutcomeRejected || row.Cost != 0 {
		t.Errorf("refused row: %+v", row)
	}
}

// TestTeamModelListOnTheChatPage: a person whose team may use one model is
// offered only that one in the chat's model list.
func TestTeamModelListOnTheChatPage(t *testing.T) {
	e := startEnv(t, "sqlite://"+t.TempDir()+"/t.db")
	c := e.signedIn("member@example.com", false)
	user, err := models.UserByEmail(context.Background(), e.DB, "member@example.com")
	if err != nil {
		t.Fatal(err)
	}
	if _, page := e.fetch(c, http.MethodGet, "/", nil, nil); !strings.Contains(page, `<option value="m1"`) {
		t.Fatalf("before the team, m1 is not offered: %s", page)
	}
	team, err := models.CreateTeam(context.Background(), e.DB, "renamers", models.Limits{Models: "renamed"})
	if err != nil {
		t.Fatal(err)
	}
	if err := models.AddTeamMember(context.Background(), e.DB, team.ID, user.ID); err != nil {
		t.Fatal(err)
	}
	e.srv.Policies.Forget()
	_, page := e.fetch(c, http.MethodGet, "/", nil, nil)
	if strings.Contains(page, `<option value="m1"`) || !strings.Contains(page, `<option value="renamed"`) {
		t.Fatalf("the team's list is not the page's: %s", page)
	}
}
