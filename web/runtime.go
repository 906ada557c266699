package web

import (
	"os"
	"runtime"
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

// spareProc gives a process limited to one CPU a second P, unless the
// operator set GOMAXPROCS. With the ledger in SQLite, its commits run on a
// thread of the lowest priority (ledger.committer), which the kernel
// preempts for request threads on the same core — but only if the requests
// have a P of their own to run on: with one P, a commit holds it and they
// wait. At 1,000 req/s on one core the p99 fell from 7–8 ms to 3–4 ms
// (BENCHMARKS.md §13), at the same CPU.
func spareProc() {
	if os.Getenv("GOMAXPROCS") == "" && runtime.GOMAXPROCS(0) < 2 {
		runtime.GOMAXPROCS(2)
	}
}
