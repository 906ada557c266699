package views

import (
	"fmt"
	"strconv"
	"time"
)

// RangeLink is one choice of a dashboard's time span.
type RangeLink struct {
	Label   string
	URL     string
	Current bool
}

// UsageView is requests and tokens over a window, cut into buckets: what
// the charts draw, and the same numbers as tables.
type UsageView struct {
	// Span says what the window is ("the last 24 hours, by hour").
	Span     string
	Ranges   []RangeLink
	Buckets  []Bucket
	Outcomes []string
	// Models name the token series: the models with the most use, then at
	// most one Other that adds up the rest.
	Models []ModelName
	// Requests[i][j] is bucket i's requests with outcome j, and
	// RequestsByModel[i][k] its requests of Models[k]: the same requests,
	// split the other way.
	Requests        [][]int64
	RequestsByModel [][]int64
	// Tokens[i][k] is bucket i's tokens (prompt and completion) of
	// Models[k], and TokensByOutcome[i][j] its tokens of outcome j.
	Tokens          [][]int64
	TokensByOutcome [][]int64
	// Cost[i] is bucket i's cost, every model and outcome, in nano-units.
	Cost []int64
	// ByModel are the window's totals per model, in the order of Models.
	ByModel []ModelTotal
	Total   ModelTotal
	// Currency is the code every cost is in (USD).
	Currency string
}

// Bucket is one span of a window.
type Bucket struct {
	Start time.Time
	// Label is short, for a chart's axis; Full is for a table.
	Label, Full string
}

// ModelName is a model as the dashboards name it: one the ledger holds,
// or the sum of those not shown one by one (Other).
type ModelName struct {
	Name  string
	Other int // when > 0: this stands for Other models, that many
}

// Label is how the model is shown.
func (m ModelName) Label() string {
	switch {
	case m.Other > 0:
		return fmt.Sprintf("%d other models", m.Other)
	case m.Name == "":
		return "(no model)" // refused before the body named one
	default:
		return m.Name
	}
}

// ModelTotal is one model's requests (by outcome) and tokens over a window.
type ModelTotal struct {
	Model ModelName
	// Requests are by outcome, in the order of UsageView.Outcomes.
	Requests         []int64
	AllRequests      int64
	PromptTokens     int64
	CompletionTokens int64
	Cost             int64
}

// AdminDashboard is /admin.
type AdminDashboard struct {
	Page
	Usage     UsageView
	Latencies []Latency
	TopUsers  []UserTotal
	TopKeys   []KeyTotal
	TopTeams  []TeamTotal
	Rejected  []UsageEvent
	Errors    []UsageEvent
	Backends  BackendsView
	Config    ConfigView
}

// Latency is one model's time to first token and queue wait.
type Latency struct {
	Model string
	TTFT  Percentiles
	Queue Percentiles
}

// Percentiles of a latency in milliseconds; each value is an upper bound
// (the histogram's buckets are 10 % wide).
type Percentiles struct {
	Count         int64
	P50, P95, P99 int64
}

// UserTotal is one row of the top users.
type UserTotal struct {
	Email    string
	Requests int64
	Tokens   int64
	Cost     int64
}

// TeamTotal is one row of the teams by cost: what its present members
// used in the window.
type TeamTotal struct {
	ID       uint
	Name     string
	Requests int64
	Tokens   int64
	Cost     int64
}

// KeyTotal is one row of a key table.
type KeyTotal struct {
	ID               uint
	Name, Prefix     string
	Owner            string
	Requests         int64
	PromptTokens     int64
	CompletionTokens int64
	Cost             int64
}

// UsageEvent is one recent ledger row: a rejection or an error.
type UsageEvent struct {
	At          time.Time
	Who         string
	KeyPrefix   string // "" when the request came with no known key
	Model       string
	Status      int
	Reason      string
	InferenceID string
}

// BackendsView is the live backends fragment.
type BackendsView struct {
	Backends []BackendLive
	Updated  time.Time
}

// BackendLive is one backend's state now.
type BackendLive struct {
	Name, Kind     string
	Models         []string
	InFlight       int
	MaxConcurrency int
	Queued         int
	MaxQueue       int
	OldestWait     time.Duration
	// Down tells that the backend failed and takes no traffic until a
	// probe passes.
	Down bool
}

// UsagePage is /usage: the signed-in person's own use.
type UsagePage struct {
	Page
	Usage UsageView
	Keys  []KeyTotal
	// KeysCapped: more keys were used than the table lists.
	KeysCapped bool
	// ExportSince are the export form's choices.
	ExportSince []ExportChoice
	// Budgets are every budget the person's spending counts against: their
	// own, their teams', their active keys'. BudgetsUnknown says what they
	// spent could not be read now (the amounts are still listed).
	Budgets        []BudgetStatus
	BudgetsUnknown bool
}

// ExportChoice is one "since" of the export form.
type ExportChoice struct {
	Value, Label string
	Selected     bool
}

// The charts' splits: each chart's series are its numbers by outcome or by
// model, as the page's "Split by" control chooses (?split=, read by
// static/dashboard.js; the page carries both).
const (
	SplitOutcome = "outcome"
	SplitModel   = "model"
	// DefaultSplit is drawn when the URL names none.
	DefaultSplit = SplitOutcome
)

// chartData is what static/dashboard.js draws, read from a JSON script
// element: the x labels and, per canvas, its series in either split.
type chartData struct {
	Labels []string `json:"labels"`
	// Split is the default split: the one Palette and Series of each chart hold.
	Split  string  `json:"split"`
	Charts []chart `json:"charts"`
}

type chart struct {
	Canvas string `json:"canvas"`
	// Palette is "outcome" (each series coloured for its outcome) or
	// "model" (colours in turn, grey for Other).
	Palette string   `json:"palette"`
	Series  []series `json:"series"`
	// Splits are the chart in each split, by its name (outcome, model).
	Splits map[string]chartSplit `json:"splits"`
}

// chartSplit is one chart in one split: what to call it and its series.
type chartSplit struct {
	Caption string   `json:"caption"` // the figure's caption
	Label   string   `json:"label"`   // the canvas's accessible name
	Palette string   `json:"palette"`
	Series  []series `json:"series"`
}

type series struct {
	Label string  `json:"label"`
	Key   string  `json:"key"` // the outcome, or "other"
	Data  []int64 `json:"data"`
}

// chartCaption names a chart in a split ("Requests by model").
func chartCaption(what, split string) string {
	return what + " by " + split
}

// charts is the charts' data, from the same numbers as the tables.
func (u UsageView) charts() chartData {
	d := chartData{Labels: make([]string, len(u.Buckets)), Split: DefaultSplit}
	for i, b := range u.Buckets {
		d.Labels[i] = b.Label
	}
	table := "; the numbers are in the table below"
	mk := func(canvas, what, long string, byOutcome, byModel [][]int64) chart {
		c := chart{Canvas: canvas, Splits: map[string]chartSplit{
			SplitOutcome: {Caption: chartCaption(what, SplitOutcome), Label: chartCaption(long, SplitOutcome) + ", " + u.Span + table,
				Palette: SplitOutcome, Series: u.outcomeSeries(byOutcome)},
			SplitModel: {Caption: chartCaption(what, SplitModel), Label: chartCaption(long, SplitModel) + ", " + u.Span + table,
				Palette: SplitModel, Series: u.modelSeries(byModel)},
		}}
		c.Palette, c.Series = c.Splits[DefaultSplit].Palette, c.Splits[DefaultSplit].Series
		return c
	}
	d.Charts = []chart{
		mk("chart-requests", "Requests", "Requests", u.Requests, u.RequestsByModel),
		mk("chart-tokens", "Tokens", "Tokens (prompt and completion)", u.TokensByOutcome, u.Tokens),
	}
	return d
}

// outcomeSeries is one series per outcome of values[bucket][outcome].
func (u UsageView) outcomeSeries(values [][]int64) []series {
	out := make([]series, 0, len(u.Outcomes))
	for j, o := range u.Outcomes {
		s := series{Label: o, Key: o, Data: make([]int64, len(u.Buckets))}
		for i := range u.Buckets {
			s.Data[i] = values[i][j]
		}
		out = append(out, s)
	}
	return out
}

// modelSeries is one series per model of values[bucket][model]; empty,
// never null, when nothing was used: a window without requests still
// draws its axes.
func (u UsageView) modelSeries(values [][]int64) []series {
	out := make([]series, 0, len(u.Models))
	for k, m := range u.Models {
		s := series{Label: m.Label(), Data: make([]int64, len(u.Buckets))}
		if m.Other > 0 {
			s.Key = "other"
		}
		for i := range u.Buckets {
			s.Data[i] = values[i][k]
		}
		out = append(out, s)
	}
	return out
}

// rowSum is the sum of row i of values: a bucket's total in either split.
func rowSum(values [][]int64, i int) int64 {
	var n int64
	for _, v := range values[i] {
		n += v
	}
	return n
}

// keyLabel names a key in a table; requests made signed in (the chat) have
// no key.
func keyLabel(k KeyTotal) string {
	switch {
	case k.ID == 0:
		return "Web chat"
	case k.Name == "":
		return "(unnamed)"
	default:
		return k.Name
	}
}

// costCaption names the cost table: by day or by hour, as the window.
func costCaption(u UsageView) string {
	if len(u.Buckets) > 1 && u.Buckets[1].Start.Sub(u.Buckets[0].Start) >= 24*time.Hour {
		return "Cost by day"
	}
	return "Cost by hour"
}

// keyCount is how many of a key table's rows are keys (the web chat's is
// not).
func keyCount(keys []KeyTotal) int {
	n := 0
	for _, k := range keys {
		if k.ID != 0 {
			n++
		}
	}
	return n
}

// num formats a count with thin groups (12 345).
func num(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := n < 0
	if neg {
		s = s[1:]
	}
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, "\u202f"...)
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

func i64(n int64) string { return strconv.FormatInt(n, 10) }

// ms shows a percentile: "≤ 120 ms", or a dash when nothing was measured.
func ms(p Percentiles, v int64) string {
	switch {
	case p.Count == 0:
		return "—"
	case v == 0:
		return "0 ms" // the first bucket holds exactly 0 (a request that never queued)
	case v >= 10_000:
		return fmt.Sprintf("≤ %.1f s", float64(v)/1000)
	default:
		return fmt.Sprintf("≤ %d ms", v)
	}
}

// wait shows how long the oldest request has waited.
func wait(d time.Duration) string {
	switch {
	case d <= 0:
		return "—"
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1f s", d.Seconds())
	default:
		return d.Truncate(time.Second).String()
	}
}

// queueLow and queueHigh colour a queue's meter: a queue a quarter full is
// worth a look, three quarters is close to refusing requests.
func queueLow(n int) string  { return strconv.FormatFloat(float64(n)/4, 'f', -1, 64) }
func queueHigh(n int) string { return strconv.FormatFloat(float64(n)*3/4, 'f', -1, 64) }

// clock is a time of day in UTC, for the live view.
func clock(t time.Time) string { return t.UTC().Format("15:04:05 UTC") }

// personLabel names who sent a request; a request refused before anyone was
// recognised has nobody.
func personLabel(email string) string {
	if email == "" {
		return "(unknown)"
	}
	return email
}

// statusText is an HTTP status for a table; 0 is a request cut before any.
func statusText(status int) string {
	if status == 0 {
		return "—"
	}
	return strconv.Itoa(status)
}

// capitalize upper-cases the first letter of an ASCII sentence.
func capitalize(s string) string {
	if s == "" || s[0] < 'a' || s[0] > 'z' {
		return s
	}
	return string(s[0]-'a'+'A') + s[1:]
}

// ConfigView is the admin dashboard's configuration section: the version
// this replica runs, every live replica's, and the reload button's outcome.
type ConfigView struct {
	// Enabled: the server can reload (the button is shown).
	Enabled  bool
	Version  string
	LoadedAt time.Time
	Replicas []ReplicaConfig
	// Mismatch: some live replica runs another version.
	Mismatch bool
	// Notice or Error says what the button just did.
	Notice, Error string
}

// ReplicaConfig is one live replica's configuration version.
type ReplicaConfig struct {
	ID       string
	Version  string
	LoadedAt time.Time
	Mismatch bool
}
