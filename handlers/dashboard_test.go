package handlers

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"moonji/models"
)

// usageView splits the same points both ways: requests and tokens by
// outcome and by model, the models past the first eight added up in one
// "other models" column, and each bucket's total the same in either split.
func TestUsageViewSplitsBothWays(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 30, 0, 0, time.UTC)
	w := models.LastDay(now)
	h := func(hour int) time.Time { return time.Date(2026, 11, 30, hour, 0, 0, 0, time.UTC) }
	var points []models.UsagePoint
	// Ten models, m00 with the most tokens (1001, 901, … 101 at 10:00, and
	// m08 and m09 a few more later): m08 and m09 are folded.
	for k := range 10 {
		points = append(points, models.UsagePoint{Start: h(10), Model: fmt.Sprintf("m%02d", k), Outcome: models.OutcomeSuccess,
			Requests: 1, PromptTokens: int64(1000 - 100*k), CompletionTokens: 1})
	}
	points = append(points,
		models.UsagePoint{Start: h(11), Model: "m08", Outcome: models.OutcomeError, Requests: 2, PromptTokens: 5},
		models.UsagePoint{Start: h(11), Model: "m00", Outcome: models.OutcomeRejected, Requests: 3},
		models.UsagePoint{Start: h(12), Model: "m09", Outcome: models.OutcomeCancelled, Requests: 1, PromptTokens: 4, CompletionTokens: 6},
		// Outside the window, and an outcome the dashboard does not know: left out.
		models.UsagePoint{Start: h(12).Add(-48 * time.Hour), Model: "m00", Outcome: models.OutcomeSuccess, Requests: 50},
		models.UsagePoint{Start: h(12), Model: "m00", Outcome: models.OutcomePending, Requests: 50},
	)
	u := usageView(points, w, range24h, "/admin")

	if len(u.Models) != 9 || u.Models[8].Other != 2 || u.Models[0].Name != "m00" {
		t.Fatalf("models = %+v, want m00…m07 and 2 others", u.Models)
	}
	i10, i11, i12 := 21, 22, 23 // the window ends with the 12:00 bucket
	if !u.Buckets[i10].Start.Equal(h(10)) || !u.Buckets[i12].Start.Equal(h(12)) {
		t.Fatalf("buckets %v … %v", u.Buckets[i10].Start, u.Buckets[i12].Start)
	}
	// Outcomes: success, error, cancelled, stopped, rejected.
	for _, c := range []struct {
		what string
		got  []int64
		want []int64
	}{
		{"requests by outcome at 10", u.Requests[i10], []int64{10, 0, 0, 0, 0}},
		{"requests by outcome at 11", u.Requests[i11], []int64{0, 2, 0, 0, 3}},
		{"requests by outcome at 12", u.Requests[i12], []int64{0, 0, 1, 0, 0}},
		{"tokens by outcome at 10", u.TokensByOutcome[i10], []int64{5500 + 10, 0, 0, 0, 0}},
		{"tokens by outcome at 11", u.TokensByOutcome[i11], []int64{0, 5, 0, 0, 0}},
		{"tokens by outcome at 12", u.TokensByOutcome[i12], []int64{0, 0, 10, 0, 0}},
		{"requests by model at 10", u.RequestsByModel[i10], []int64{1, 1, 1, 1, 1, 1, 1, 1, 2}},
		{"requests by model at 11", u.RequestsByModel[i11], []int64{3, 0, 0, 0, 0, 0, 0, 0, 2}},
		{"requests by model at 12", u.RequestsByModel[i12], []int64{0, 0, 0, 0, 0, 0, 0, 0, 1}},
		{"tokens by model at 10", u.Tokens[i10], []int64{1001, 901, 801, 701, 601, 501, 401, 301, 201 + 101}},
		{"tokens by model at 11", u.Tokens[i11], []int64{0, 0, 0, 0, 0, 0, 0, 0, 5}},
		{"tokens by model at 12", u.Tokens[i12], []int64{0, 0, 0, 0, 0, 0, 0, 0, 10}},
	} {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	sum := func(v []int64) (n int64) {
		for _, x := range v {
			n += x
		}
		return n
	}
	for i := range u.Buckets {
		if sum(u.Requests[i]) != sum(u.RequestsByModel[i]) || sum(u.Tokens[i]) != sum(u.TokensByOutcome[i]) {
			t.Errorf("bucket %d: the splits disagree on its total", i)
		}
	}
}
