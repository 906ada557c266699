package web_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

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
		body := `{"model":"m1","messages":[{"role":"user","content":"hi"}],"max_tokens":20}`
		reservation := int64(len(body)+256)*1000 + 20*2000
		var spent int64
		for i := 0; ; i++ {
			if i > 100 {
				t.Fatal("never refused")
			}
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
	e := startEnv(t, "sqlite://"+t.TempDir()+"/m.db")
	key, _ := e.limitedKey("models@example.com", models.Limits{Models: "renamed"})
	resp := e.postWith(context.Background(), key, `{"model":"m1","messages":[{"role":"user","content":"hi"}]}`)
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if ae := decodeError(t, resp); ae.Error.Code != "model_not_found" || !strings.Contains(ae.Error.Message, "`m1` does not exist") {
		t.Fatalf("refusal: %+v", ae)
	}
	resp = e.postWith(context.Background(), key, `{"model":"renamed","messages":[{"role":"user","content":"hi"}]}`)
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
