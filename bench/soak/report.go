package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// summary is the run's JSON report.
type summary struct {
	Commit     string         `json:"commit"`
	Started    time.Time      `json:"started"`
	Duration   string         `json:"duration"`
	Warmup     string         `json:"warmup"`
	Replicas   int            `json:"replicas"`
	Workers    int            `json:"workers"`
	Requests   int            `json:"requests"`
	Kinds      map[string]int `json:"kinds"` // "kind saw" → requests
	Faults     []injection    `json:"faults"`
	Ledger     ledgerCheck    `json:"ledger"`
	GaugesIdle bool           `json:"gauges_idle"`
	Growth     []growth       `json:"growth"`
	LogErrors  map[string]int `json:"log_errors"` // the replicas' level=ERROR lines by msg
	Violations []violation    `json:"violations"`
	Samples    []sample       `json:"samples"`
	Pass       bool           `json:"pass"`
}

func writeJSON(path string, s summary) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func sortedKeys(m map[string]int) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func writeMarkdown(path, svgName string, s summary) error {
	var b strings.Builder
	verdict := "PASS"
	if !s.Pass {
		verdict = "FAIL"
	}
	fmt.Fprintf(&b, "## Soak: %s, %d replicas, %d workers — %s\n\n", s.Duration, s.Replicas, s.Workers, verdict)
	fmt.Fprintf(&b, "Commit %s, started %s, warm-up %s. %d requests; %d ledger rows.\n\n",
		s.Commit, s.Started.UTC().Format(time.RFC3339), s.Warmup, s.Requests, s.Ledger.Rows)
	b.WriteString("| fault | from (s) | to (s) | what | error |\n|---|---:|---:|---|---|\n")
	for _, f := range s.Faults {
		fmt.Fprintf(&b, "| %s | %.0f | %.0f | %s | %s |\n", f.Name, f.Offsetf, f.Offsett, f.What, f.Error)
	}
	b.WriteString("\n| fault when the request began | requests with an id | no row | left pending | outcome mismatched |\n|---|---:|---:|---:|---:|\n")
	for _, f := range append([]injection{{Name: ""}}, s.Faults...) {
		if t := s.Ledger.ByFault[f.Name]; t != nil {
			name := f.Name
			if name == "" {
				name = "(none: warm-up, recovery)"
			}
			fmt.Fprintf(&b, "| %s | %d | %d | %d | %d |\n", name, t.Requests, t.Missing, t.Pending, t.Mismatched)
		}
	}
	b.WriteString("\n| request → what its client saw → its row | n |\n|---|---:|\n")
	for _, k := range sortedKeys(s.Ledger.Agreement) {
		fmt.Fprintf(&b, "| %s | %d |\n", k, s.Ledger.Agreement[k])
	}
	fmt.Fprintf(&b, "\nIds seen %d, rows missing %d, pending %d, outcome mismatched %d, rows no client saw %d (requests without an id %d). Gauges back to 0: %v.\n\n",
		s.Ledger.Seen, s.Ledger.Missing, s.Ledger.Pending, s.Ledger.Mismatched, s.Ledger.Extra, s.Ledger.NoID, s.GaugesIdle)
	b.WriteString("| replica | RSS after warm-up → end (MiB) | growth | goroutines after warm-up → end | growth |\n|---:|---|---:|---|---:|\n")
	for _, g := range s.Growth {
		fmt.Fprintf(&b, "| %d | %.1f → %.1f | %+.1f %% | %d → %d | %+.1f %% |\n", g.Replica, g.RSSBefore, g.RSSAfter, 100*g.RSSGrowth,
			g.GoroutineBefore, g.GoroutineAfter, 100*g.GoroutineGrowth)
	}
	if len(s.LogErrors) > 0 {
		b.WriteString("\n| replicas' logged errors | n |\n|---|---:|\n")
		for _, k := range sortedKeys(s.LogErrors) {
			fmt.Fprintf(&b, "| %s | %d |\n", k, s.LogErrors[k])
		}
	}
	if svgName != "" {
		fmt.Fprintf(&b, "\n![RSS and goroutines over time](%s)\n", svgName)
	}
	if len(s.Violations) > 0 {
		b.WriteString("\nViolations:\n\n")
		for _, v := range s.Violations {
			fmt.Fprintf(&b, "- **%s**: %s\n", v.Invariant, v.Detail)
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// writeSVG plots each replica's RSS (top) and goroutines (bottom) over the
// run, with the faults' holds shaded and named.
func writeSVG(path string, s summary) error {
	const w, h, left, right, top, panel, gap = 760, 480, 50, 20, 20, 160, 40
	tmax := 1.0
	var rssMax, gMax float64 = 1, 1
	for _, x := range s.Samples {
		tmax = math.Max(tmax, x.T)
		rssMax = math.Max(rssMax, x.RSSMiB)
		gMax = math.Max(gMax, float64(x.Goroutines))
	}
	rssMax, gMax = rssMax*1.1, gMax*1.1
	px := func(t float64) float64 { return left + t/tmax*(w-left-right) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="10">`+"\n", w, h)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	for _, f := range s.Faults {
		x0, x1 := px(f.Offsetf), px(math.Max(f.Offsett, f.Offsetf+tmax/200))
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" fill="#f4c7c3" opacity="0.6"/>`+"\n", x0, top, x1-x0, 2*panel+gap)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" transform="rotate(90 %.1f %d)" fill="#a33">%s</text>`+"\n", x0+2, top+2*panel+gap+4, x0+2, top+2*panel+gap+4, f.Name)
	}
	colors := []string{"#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"}
	panels := []struct {
		name string
		y0   float64
		max  float64
		val  func(sample) float64
	}{
		{"RSS (MiB)", top, rssMax, func(x sample) float64 { return x.RSSMiB }},
		{"goroutines", top + panel + gap, gMax, func(x sample) float64 { return float64(x.Goroutines) }},
	}
	for _, p := range panels {
		fmt.Fprintf(&b, `<rect x="%d" y="%.0f" width="%d" height="%d" fill="none" stroke="#888"/>`+"\n", left, p.y0, w-left-right, panel)
		fmt.Fprintf(&b, `<text x="%d" y="%.0f">%s</text>`+"\n", left+4, p.y0+12, p.name)
		fmt.Fprintf(&b, `<text x="%d" y="%.0f" text-anchor="end">%.0f</text>`+"\n", left-4, p.y0+8, p.max)
		fmt.Fprintf(&b, `<text x="%d" y="%.0f" text-anchor="end">0</text>`+"\n", left-4, p.y0+panel)
		for r := range s.Replicas {
			var pts []string
			for _, x := range s.Samples {
				if x.Replica != r || x.Err != "" && x.Goroutines == 0 {
					continue
				}
				y := p.y0 + panel - p.val(x)/p.max*panel
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(x.T), y))
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", colors[r%len(colors)], strings.Join(pts, " "))
			fmt.Fprintf(&b, `<text x="%d" y="%.0f" fill="%s">replica %d</text>`+"\n", w-right-60, p.y0+12+float64(r)*11, colors[r%len(colors)], r)
		}
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="end">%.0f s</text>`+"\n", w-right, h-2, tmax)
	b.WriteString("</svg>\n")
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

var reLogMsg = regexp.MustCompile(`level=ERROR msg=("[^"]*"|\S+)`)

// logErrors counts the replicas' logged errors by message.
func logErrors(dir string, replicas int) map[string]int {
	out := map[string]int{}
	for i := range replicas {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("replica%d.log", i)))
		if err != nil {
			continue
		}
		for _, m := range reLogMsg.FindAllSubmatch(b, -1) {
			out[strings.Trim(string(m[1]), `"`)]++
		}
	}
	return out
}
