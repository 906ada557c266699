package handlers

import (
	"cmp"
	"slices"
	"time"

	"moonji/models"
	"moonji/views"
)

// Dashboard ranges (?range=).
const (
	range24h = "24h"
	range30d = "30d"
)

// maxChartModels is how many models the token chart and the totals show
// one by one; the rest add up to one "other models". Model names come from
// callers (a refused request keeps the name it asked for), so their number
// has no bound of its own.
const maxChartModels = 8

// dashboardWindow reads ?range=: 24h (by hour) or 30d (by day). Anything
// else is the page's default: a bookmark with a stale or mistyped range
// still shows a dashboard.
func dashboardWindow(param, def string, now time.Time) (string, models.Window) {
	if param != range24h && param != range30d {
		param = def
	}
	if param == range30d {
		return param, models.LastMonth(now)
	}
	return param, models.LastDay(now)
}

// usageView arranges the usage points of window w as the charts and tables
// show them (and their cost, per bucket and model): every bucket (empty ones too), every outcome, the models with
// the most use and one "other models" for the rest. path is the page the
// range links go to.
func usageView(points []models.UsagePoint, w models.Window, rng, path string) views.UsageView {
	u := views.UsageView{Outcomes: models.Outcomes}
	for _, r := range []struct{ value, label string }{{range24h, "24 hours"}, {range30d, "30 days"}} {
		u.Ranges = append(u.Ranges, views.RangeLink{Label: r.label, URL: path + "?range=" + r.value, Current: r.value == rng})
	}
	day := w.Step >= models.Day
	u.Span = "the last 24 hours, by hour"
	if day {
		u.Span = "the last 30 days, by day"
	}
	starts := w.Buckets()
	u.Buckets = make([]views.Bucket, len(starts))
	for i, t := range starts {
		if day {
			u.Buckets[i] = views.Bucket{Start: t, Label: t.Format("Jan 2"), Full: t.Format("2006-01-02")}
		} else {
			u.Buckets[i] = views.Bucket{Start: t, Label: t.Format("15:04"), Full: t.Format("2006-01-02 15:04")}
		}
	}
	outcome := make(map[string]int, len(models.Outcomes))
	for j, o := range models.Outcomes {
		outcome[o] = j
	}
	// bucket finds a point's bucket by arithmetic, not by equal times: the
	// database may hand back another location or precision.
	bucket := func(t time.Time) (int, bool) {
		if t.Before(w.From) || !t.Before(w.To) || w.Step <= 0 {
			return 0, false
		}
		return int(t.Sub(w.From) / w.Step), true
	}

	// Totals per model first, to choose which are shown one by one.
	totals := map[string]*views.ModelTotal{}
	for _, p := range points {
		j, ok := outcome[p.Outcome]
		if _, in := bucket(p.Start); !ok || !in {
			continue
		}
		t := totals[p.Model]
		if t == nil {
			t = &views.ModelTotal{Model: views.ModelName{Name: p.Model}, Requests: make([]int64, len(models.Outcomes))}
			totals[p.Model] = t
		}
		t.Requests[j] += p.Requests
		t.AllRequests += p.Requests
		t.PromptTokens += p.PromptTokens
		t.CompletionTokens += p.CompletionTokens
		t.Cost += p.Cost
	}
	ranked := make([]*views.ModelTotal, 0, len(totals))
	for _, t := range totals {
		ranked = append(ranked, t)
	}
	slices.SortFunc(ranked, func(a, b *views.ModelTotal) int {
		return cmp.Or(
			cmp.Compare(b.PromptTokens+b.CompletionTokens, a.PromptTokens+a.CompletionTokens),
			cmp.Compare(b.AllRequests, a.AllRequests),
			cmp.Compare(a.Model.Name, b.Model.Name))
	})
	column := map[string]int{}
	var other *views.ModelTotal
	for i, t := range ranked {
		if i < maxChartModels || len(ranked) == maxChartModels+1 {
			// (Nine models show as nine: "1 other model" would say less.)
			column[t.Model.Name] = len(u.ByModel)
			u.ByModel = append(u.ByModel, *t)
			continue
		}
		if other == nil {
			other = &views.ModelTotal{Requests: make([]int64, len(models.Outcomes))}
		}
		other.Model.Other++
		for j := range t.Requests {
			other.Requests[j] += t.Requests[j]
		}
		other.AllRequests += t.AllRequests
		other.PromptTokens += t.PromptTokens
		other.CompletionTokens += t.CompletionTokens
		other.Cost += t.Cost
	}
	if other != nil {
		u.ByModel = append(u.ByModel, *other)
	}
	u.Total = views.ModelTotal{Requests: make([]int64, len(models.Outcomes))}
	for _, t := range u.ByModel {
		u.Models = append(u.Models, t.Model)
		for j := range t.Requests {
			u.Total.Requests[j] += t.Requests[j]
		}
		u.Total.AllRequests += t.AllRequests
		u.Total.PromptTokens += t.PromptTokens
		u.Total.CompletionTokens += t.CompletionTokens
		u.Total.Cost += t.Cost
	}

	// Every bucket's requests and tokens, split by outcome and by model:
	// the points are per model and outcome, so both splits come from the
	// same rollup rows.
	grid := func(cols int) [][]int64 {
		g := make([][]int64, len(starts))
		for i := range g {
			g[i] = make([]int64, cols)
		}
		return g
	}
	u.Requests, u.TokensByOutcome = grid(len(models.Outcomes)), grid(len(models.Outcomes))
	u.RequestsByModel, u.Tokens = grid(len(u.Models)), grid(len(u.Models))
	u.Cost = make([]int64, len(starts))
	for _, p := range points {
		j, ok := outcome[p.Outcome]
		i, in := bucket(p.Start)
		if !ok || !in {
			continue
		}
		k, shown := column[p.Model]
		if !shown {
			k = len(u.Models) - 1 // the "other models" column
		}
		tokens := p.PromptTokens + p.CompletionTokens
		u.Requests[i][j] += p.Requests
		u.RequestsByModel[i][k] += p.Requests
		u.Tokens[i][k] += tokens
		u.TokensByOutcome[i][j] += tokens
		u.Cost[i] += p.Cost
	}
	return u
}

// viewKeyTotals are key totals as a table shows them.
func viewKeyTotals(keys []models.KeyTotal) []views.KeyTotal {
	out := make([]views.KeyTotal, len(keys))
	for i, k := range keys {
		out[i] = views.KeyTotal{ID: k.KeyID, Name: k.Name, Prefix: k.Prefix, Owner: k.Owner, Requests: k.Requests,
			PromptTokens: k.PromptTokens, CompletionTokens: k.CompletionTokens, Cost: k.Cost}
	}
	return out
}
