// Package spareproc lends a process confined to one CPU a second P while it
// runs SQLite, or writes a batch of the ledger's rows.
//
// SQLite is compiled Go here (modernc.org/sqlite), so a statement runs on
// whichever goroutine calls it and keeps its P until it returns: with
// GOMAXPROCS 1, a batch of the ledger's rows (milliseconds of work) makes
// every request that arrives meanwhile wait. The ledger writes its batches
// on a thread of the lowest priority, which the kernel preempts for request
// threads on the same core — but a request thread needs a P of its own to
// run Go code, hence a second P. (With the ledger in PostgreSQL the batch's
// CPU is the driver's, less of it, but held the same way.)
//
// A second P that is always there costs the requests themselves: when a
// goroutine is woken (a socket became readable, a channel was sent on), the
// runtime starts another thread to run it on the idle P, and on one core
// that thread and the one that woke it take turns. A sequential request
// took ~40 µs longer with two Ps than with one, and at 1,000 req/s the
// gateway used 5–15 points more of its core (BENCHMARKS.md §18). So the P is
// lent only while SQLite works: Lend before, Return after.
//
// Changing GOMAXPROCS stops the world, which is cheap with so few Ps but not
// free, so a Return takes the P back only after returnAfter without a new
// Lend, and on a goroutine of its own: never on the ledger's low-priority
// thread, where a stop of the world could be left waiting behind a busy
// neighbour process.
package spareproc

import (
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// returnAfter is how long the P stays lent after the last Return. The
// ledger's batches are 100 ms apart at most; statements of a transaction,
// or the rows a page reads one query after another, come much closer.
const returnAfter = 2 * time.Millisecond

var (
	enabled atomic.Bool

	mu      sync.Mutex
	users   int         // Lends not yet returned
	lent    bool        // GOMAXPROCS was raised by Lend and not yet restored
	timer   *time.Timer // restores GOMAXPROCS after delay
	lendsTo = 2
	delay   = returnAfter // tests lengthen it

	// raise and restore change GOMAXPROCS; tests replace them.
	raise   = func(n int) { runtime.GOMAXPROCS(n) }
	restore = func() { runtime.SetDefaultGOMAXPROCS() }
	current = func() int { return runtime.GOMAXPROCS(0) }
)

// Enable turns lending on for this process, unless the operator chose
// GOMAXPROCS: then their choice stands. Lend and Return change nothing
// until Enable is called, and nothing while GOMAXPROCS is already 2 or
// more.
// Between lends, the runtime keeps adjusting GOMAXPROCS to the CPUs the
// process may use (taskset, a cgroup limit), as it does by default.
func Enable() {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	enabled.Store(true)
}

// Enabled reports whether Enable turned lending on.
func Enabled() bool { return enabled.Load() }

// Lend makes sure the process has a second P until the matching Return.
// Calls nest. Lends are counted even before Enable, so that a statement
// that began before it ends with a matching Return.
func Lend() {
	mu.Lock()
	defer mu.Unlock()
	users++
	if lent || !enabled.Load() || current() >= lendsTo {
		return
	}
	raise(lendsTo)
	lent = true
}

// Return ends one Lend. When it was the last, the P is taken back
// returnAfter later, unless another Lend came meanwhile.
func Return() {
	mu.Lock()
	defer mu.Unlock()
	if users == 0 {
		panic("spareproc: Return without Lend")
	}
	users--
	if users > 0 || !lent {
		return
	}
	if timer == nil {
		timer = time.AfterFunc(delay, takeBack)
		return
	}
	timer.Reset(delay)
}

// takeBack runs on the timer's own goroutine.
func takeBack() {
	mu.Lock()
	defer mu.Unlock()
	if users > 0 || !lent {
		return
	}
	restore()
	lent = false
}

// Lent reports whether a P is lent now (for tests and metrics).
func Lent() bool {
	mu.Lock()
	defer mu.Unlock()
	return lent
}
