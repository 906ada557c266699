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

// spareProc gives the process at least two Ps, unless the operator set
// GOMAXPROCS. With the ledger in SQLite, its commits run on a thread of the
// lowest priority (ledger.committer), which the kernel preempts for request
// threads on the same core, but only if the requests have a P of their own
// to run on: with one P, a commit holds it and they wait. At 1,000 req/s on
// one core the p99 fell from 6-8 ms to 3-4 ms (BENCHMARKS.md §16), at about
// the same CPU. It is set even when there are two CPUs already: Go lowers
// GOMAXPROCS by itself when the process is later confined to one (taskset,
// a cgroup limit) unless it was set explicitly — which also ends that
// automatic adjustment for this process.
func spareProc() {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(max(2, runtime.GOMAXPROCS(0)))
	}
}
