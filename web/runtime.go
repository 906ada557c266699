package web

import (
	"os"
	"runtime/debug"
)

// gcPercent is the garbage collector's target for a gateway process. A
// gateway's live heap is small (connections, a few buffers per stream), and
// with Go's default of 100 it collects very often under load; each cycle
// takes CPU from requests on a small machine and shows up in the latency
// tail. At 400 the heap may grow to five times the live heap — still tens of
// megabytes — and the added p99 latency at 500 req/s drops by about a third
// (BENCHMARKS.md §1).
const gcPercent = 400

// TuneRuntime sets the garbage collector for serving, unless the operator
// chose a GOGC of their own.
func TuneRuntime() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
}
