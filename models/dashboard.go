package models

import (
	"context"
	"fmt"
	"math"
	"time"

	"gorm.io/gorm"
)

// Outcomes are the final outcomes of the ledger, in the order the dashboard
// shows them.
var Outcomes = []string{OutcomeSuccess, OutcomeError, OutcomeCancelled, OutcomeStopped, OutcomeRejected}

// Window is a span of time cut into equal buckets: From and To are aligned
// to Step (an hour or a day, in UTC) and To is the end of the bucket that
// holds now.
type Window struct {
	From, To time.Time
	Step     time.Duration
}

// Day is one UTC day.
const Day = 24 * time.Hour

// LastDay is the last 24 hours by hour: 24 buckets, the last one the
// current hour.
func LastDay(now time.Time) Window {
	to := now.UTC().Truncate(time.Hour).Add(time.Hour)
	return Window{From: to.Add(-24 * time.Hour), To: to, Step: time.Hour}
}

// LastMonth is the last 30 days by day: 30 buckets, the last one today (UTC).
func LastMonth(now time.Time) Window {
	to := now.UTC().Truncate(Day).Add(Day)
	return Window{From: to.Add(-30 * Day), To: to, Step: Day}
}

// Buckets returns the start of every bucket of w, oldest first.
func (w Window) Buckets() []time.Time {
	var out []time.Time
	for t := w.From; t.Before(w.To); t = t.Add(w.Step) {
		out = append(out, t)
	}
	return out
}

// UsagePoint is the requests, tokens and cost of one bucket, model and
// outcome.
type UsagePoint struct {
	Start            time.Time // the bucket's start, UTC
	Model            string    // "" for requests refused before a model was read
	Outcome          string
	Requests         int64
	PromptTokens     int64
	CompletionTokens int64
	Cost             int64 // nano-units of the currency (internal/money)
}

// Percentiles of a latency in milliseconds. Values come from a histogram
// with buckets 10 % wide, and each is the upper bound of its bucket: the
// true value is at most it and more than 1/1.1 of it.
type Percentiles struct {
	Count         int64
	P50, P95, P99 int64
}

// ModelLatency is one model's time to first token (streams that produced
// one) and queue wait (requests that reached admission).
type ModelLatency struct {
	Model string
	TTFT  Percentiles
	Queue Percentiles
}

// UserTotal is one person's requests, tokens and cost over a window.
type UserTotal struct {
	UserID   uint
	Email    string
	Requests int64
	Tokens   int64
	Cost     int64
}

// KeyTotal is one key's requests, tokens and cost over a window (KeyID 0:
// a person's web chat).
type KeyTotal struct {
	KeyID            uint
	Name, Prefix     string
	Owner            string // the key owner's email
	Requests         int64
	PromptTokens     int64
	CompletionTokens int64
	Cost             int64
}

// Tokens is the key's prompt and completion tokens together.
func (k KeyTotal) Tokens() int64 { return k.PromptTokens + k.CompletionTokens }

// span is the rollup span a window reads: hourly buckets or daily ones.
func (w Window) span() string {
	if w.Step >= Day {
		return SpanDay
	}
	return SpanHour
}

// UsageOverTime returns requests and tokens per bucket of w, model and
// outcome, of everyone (userID 0) or of one person, ordered by bucket, model
// and outcome. Buckets without requests are left out.
func UsageOverTime(ctx context.Context, db *gorm.DB, w Window, userID uint) ([]UsagePoint, error) {
	q := db.WithContext(ctx).Model(&UsageRollup{})
	if userID != 0 {
		q = db.WithContext(ctx).Model(&UsageOfPerson{}).Where("user_id = ?", userID)
	}
	var out []UsagePoint
	err := q.Select("start, model, outcome, SUM(requests) AS requests, SUM(prompt_tokens) AS prompt_tokens, SUM(completion_tokens) AS completion_tokens, SUM(cost) AS cost").
		Where("span = ? AND start >= ? AND start < ?", w.span(), w.From.UTC(), w.To.UTC()).
		Group("start, model, outcome").Order("start, model, outcome").Scan(&out).Error
	if err != nil {
		return nil, fmt.Errorf("usage over time: %w", err)
	}
	for i := range out {
		out[i].Start = out[i].Start.UTC()
	}
	return out, nil
}

// Latencies returns p50/p95/p99 of time to first token and queue wait per
// model over w, ordered by model.
func Latencies(ctx context.Context, db *gorm.DB, w Window) ([]ModelLatency, error) {
	var counts []struct {
		Model, Metric string
		Bucket        int
		Count         int64
	}
	err := db.WithContext(ctx).Model(&UsageLatency{}).
		Select("model, metric, bucket, SUM(count) AS count").
		Where("span = ? AND start >= ? AND start < ?", w.span(), w.From.UTC(), w.To.UTC()).
		Group("model, metric, bucket").Order("model, metric, bucket").Scan(&counts).Error
	if err != nil {
		return nil, fmt.Errorf("latencies: %w", err)
	}
	var out []ModelLatency
	for i := 0; i < len(counts); {
		m := ModelLatency{Model: counts[i].Model}
		for i < len(counts) && counts[i].Model == m.Model {
			metric, j := counts[i].Metric, i
			for j < len(counts) && counts[j].Model == m.Model && counts[j].Metric == metric {
				j++
			}
			hist := make([]bucketCount, 0, j-i)
			for _, c := range counts[i:j] {
				hist = append(hist, bucketCount{c.Bucket, c.Count})
			}
			switch metric {
			case metricTTFT:
				m.TTFT = percentiles(hist)
			case metricQueue:
				m.Queue = percentiles(hist)
			}
			i = j
		}
		out = append(out, m)
	}
	return out, nil
}

type bucketCount struct {
	bucket int
	count  int64
}

// percentiles reads p50, p95 and p99 from a histogram ordered by bucket, by
// nearest rank: pN is the smallest value with at least N % of the requests
// at or below it.
func percentiles(hist []bucketCount) Percentiles {
	var p Percentiles
	for _, b := range hist {
		p.Count += b.count
	}
	if p.Count == 0 {
		return p
	}
	at := func(q float64) int64 {
		rank := int64(math.Ceil(q * float64(p.Count)))
		var seen int64
		for _, b := range hist {
			if seen += b.count; seen >= rank {
				return bucketMax(b.bucket)
			}
		}
		return bucketMax(hist[len(hist)-1].bucket)
	}
	p.P50, p.P95, p.P99 = at(0.50), at(0.95), at(0.99)
	return p
}

// TopUsers returns the people with the most tokens over w, most first.
func TopUsers(ctx context.Context, db *gorm.DB, w Window, limit int) ([]UserTotal, error) {
	var top []UserTotal
	err := db.WithContext(ctx).Model(&UsageByPerson{}).
		Select("user_id, SUM(requests) AS requests, SUM(prompt_tokens + completion_tokens) AS tokens, SUM(cost) AS cost").
		Where("span = ? AND start >= ? AND start < ?", w.span(), w.From.UTC(), w.To.UTC()).
		Group("user_id").Order("tokens DESC, requests DESC, user_id").Limit(limit).Scan(&top).Error
	if err != nil {
		return nil, fmt.Errorf("top users: %w", err)
	}
	if len(top) == 0 {
		return nil, nil
	}
	ids := make([]uint, len(top))
	for i := range top {
		ids[i] = top[i].UserID
	}
	var users []User
	if err := db.WithContext(ctx).Select("id, email").Where("id IN ?", ids).Find(&users).Error; err != nil {
		return nil, fmt.Errorf("top users' emails: %w", err)
	}
	email := make(map[uint]string, len(users))
	for _, u := range users {
		email[u.ID] = u.Email
	}
	for i := range top {
		top[i].Email = email[top[i].UserID]
	}
	return top, nil
}

// TopKeys returns the keys with the most tokens over w, most first: of
// everyone (userID 0) or of one person.
func TopKeys(ctx context.Context, db *gorm.DB, w Window, userID uint, limit int) ([]KeyTotal, error) {
	q := db.WithContext(ctx).Model(&UsageByPerson{}).
		Select("key_id, SUM(requests) AS requests, SUM(prompt_tokens) AS prompt_tokens, SUM(completion_tokens) AS completion_tokens, SUM(cost) AS cost").
		Where("span = ? AND start >= ? AND start < ? AND key_id <> 0", w.span(), w.From.UTC(), w.To.UTC())
	if userID != 0 {
		q = q.Where("user_id = ?", userID)
	}
	var top []KeyTotal
	err := q.Group("key_id").Order("SUM(prompt_tokens + completion_tokens) DESC, requests DESC, key_id").Limit(limit).Scan(&top).Error
	if err != nil {
		return nil, fmt.Errorf("top keys: %w", err)
	}
	if len(top) == 0 {
		return nil, nil
	}
	ids := make([]uint, len(top))
	for i := range top {
		ids[i] = top[i].KeyID
	}
	var keys []APIKey
	if err := db.WithContext(ctx).Preload("User").Where("id IN ?", ids).Find(&keys).Error; err != nil {
		return nil, fmt.Errorf("top keys' names: %w", err)
	}
	byID := make(map[uint]*APIKey, len(keys))
	for i := range keys {
		byID[keys[i].ID] = &keys[i]
	}
	for i := range top {
		if k := byID[top[i].KeyID]; k != nil {
			top[i].Name, top[i].Prefix, top[i].Owner = k.Name, k.Prefix, k.User.Email
		}
	}
	return top, nil
}

// ChatTotal returns one person's use of the web chat over w (their
// requests without a key), Requests 0 when there was none. TopKeys leaves
// it out: it ranks keys, and the chat is no key.
func ChatTotal(ctx context.Context, db *gorm.DB, w Window, userID uint) (KeyTotal, error) {
	t := KeyTotal{}
	if userID == 0 {
		return t, fmt.Errorf("chat total of user 0: %w", ErrInvalid)
	}
	err := db.WithContext(ctx).Model(&UsageByPerson{}).
		Select("COALESCE(SUM(requests), 0) AS requests, COALESCE(SUM(prompt_tokens), 0) AS prompt_tokens, "+
			"COALESCE(SUM(completion_tokens), 0) AS completion_tokens, COALESCE(SUM(cost), 0) AS cost").
		Where("span = ? AND start >= ? AND start < ? AND user_id = ? AND key_id = 0", w.span(), w.From.UTC(), w.To.UTC(), userID).
		Scan(&t).Error
	if err != nil {
		return t, fmt.Errorf("chat total: %w", err)
	}
	return t, nil
}

// TeamTotal is one team's requests, tokens and cost over a window.
type TeamTotal struct {
	TeamID   uint
	Name     string
	Requests int64
	Tokens   int64
	Cost     int64
}

// TopTeams returns the teams whose present members spent the most over w,
// most first: each member's whole use (every key and the chat), under
// each team they are in now — what the team's budget counts (SpentSince),
// so a person who joined yesterday brings last week with them. Teams whose
// members used nothing are left out. One query over the people rollup.
func TopTeams(ctx context.Context, db *gorm.DB, w Window, limit int) ([]TeamTotal, error) {
	var top []TeamTotal
	err := db.WithContext(ctx).Table("usage_people AS p").
		Joins("JOIN team_members AS m ON m.user_id = p.user_id").
		Select("m.team_id AS team_id, SUM(p.requests) AS requests, SUM(p.prompt_tokens + p.completion_tokens) AS tokens, SUM(p.cost) AS cost").
		Where("p.span = ? AND p.start >= ? AND p.start < ?", w.span(), w.From.UTC(), w.To.UTC()).
		Group("m.team_id").Order("cost DESC, tokens DESC, team_id").Limit(limit).Scan(&top).Error
	if err != nil {
		return nil, fmt.Errorf("top teams: %w", err)
	}
	if len(top) == 0 {
		return nil, nil
	}
	ids := make([]uint, len(top))
	for i := range top {
		ids[i] = top[i].TeamID
	}
	var teams []Team
	if err := db.WithContext(ctx).Select("id, name").Where("id IN ?", ids).Find(&teams).Error; err != nil {
		return nil, fmt.Errorf("top teams' names: %w", err)
	}
	name := make(map[uint]string, len(teams))
	for _, t := range teams {
		name[t.ID] = t.Name
	}
	for i := range top {
		top[i].Name = name[top[i].TeamID]
	}
	return top, nil
}

// RecentUsage returns the newest final rows with this outcome (rejected,
// error, …), newest first, read through idx_usage_outcome_created.
func RecentUsage(ctx context.Context, db *gorm.DB, outcome string, limit int) ([]Usage, error) {
	var rows []Usage
	err := db.WithContext(ctx).Where("outcome = ?", outcome).Order("created_at DESC").Limit(limit).Find(&rows).Error
	if err != nil {
		return nil, fmt.Errorf("recent %s requests: %w", outcome, err)
	}
	return rows, nil
}
