// Package spareproc lends a process confined to one CPU a second P while it
// runs SQLite, writes a batch of the ledger's rows, or waits in a blocking
// system call.
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
// neighbour process. ReturnAtOnce takes it back at once, for the ledger's
// writer, whose next steps take locks requests take too.
//
// A system call that blocks for milliseconds (the journal's fsync, SQLite's
// checkpoint) holds its P just the same, and may overlap a batch: Blocking
// lends a P of its own for each such call, on top of the shared one.
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

	mu       sync.Mutex
	users    int           // Lends not yet returned
	shared   bool          // the P that Lend lends is out (until taken back)
	blockers int           // Blocking calls under way, a P each
	lentTo   int           // GOMAXPROCS as raised; 0 when nothing is lent
	timer    *time.Timer   // takes the shared P back after delay
	delay    = returnAfter // tests lengthen it

	// raise and restore change GOMAXPROCS; tests replace them.
	raise   = func(n int) { runtime.GOMAXPROCS(n) }
	restore = func() { runtime.SetDefaultGOMAXPROCS() }
	current = func() int { return runtime.GOMAXPROCS(0) }
)

// Enable turns lending on for this process, unless the operator chose
// GOMAXPROCS: then their choice stands. Lend, Return and Blocking change
// nothing until Enable is called, and nothing while GOMAXPROCS is already 2
// or more.
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
	if shared || !canLend() {
		return
	}
	shared = true
	setLevel()
}

// Return ends one Lend. When it was the last, the P is taken back
// returnAfter later, unless another Lend came meanwhile.
func Return() {
	mu.Lock()
	defer mu.Unlock()
	if !endLend() {
		return
	}
	if timer == nil {
		timer = time.AfterFunc(delay, takeBack)
		return
	}
	timer.Reset(delay)
}

// ReturnAtOnce ends one Lend as Return does, but when it was the last the
// P is taken back now: for a caller that knows nothing follows soon and
// whose next steps take locks that requests take too. While the P is lent
// and nothing else holds it, two threads of the one core run requests, and
// the kernel preempts them for each other: one preempted holding a lock (a
// batch's journal entries cleared, say) stalls the other's requests for a
// scheduler slice, 1.5–3 ms here (BENCHMARKS.md §31). Taking the P back
// stops the world for ~0.1 ms.
func ReturnAtOnce() {
	mu.Lock()
	defer mu.Unlock()
	if !endLend() {
		return
	}
	if timer != nil {
		timer.Stop()
	}
	shared = false
	setLevel()
}

// endLend counts one Lend returned and reports whether it was the last
// while the shared P is out. Called with mu held.
func endLend() bool {
	if users == 0 {
		panic("spareproc: Return without Lend")
	}
	users--
	return users == 0 && shared
}

// Blocking runs fn, which blocks its thread in the kernel (an fsync), with
// a P of its own lent to the process meanwhile, on top of any Lend's. A
// goroutine in a system call keeps its P until the call returns or the
// runtime's monitor hands the P on, up to 10 ms later (it wakes that
// seldom in a busy gateway, package sysmon); on one core with one P every
// request waits that long (BENCHMARKS.md §31). Calls share nothing: each,
// nested or concurrent, lends its own P; and changing GOMAXPROCS stops the
// world (~0.1 ms), so it is for calls of a millisecond or more, not for
// every write.
func Blocking(fn func()) {
	mu.Lock()
	lend := canLend()
	if lend {
		blockers++
		setLevel()
	}
	mu.Unlock()
	defer func() {
		if !lend {
			return
		}
		mu.Lock()
		blockers--
		setLevel()
		mu.Unlock()
	}()
	fn()
}

// canLend tells whether lending is on and the process has one P of its own
// (or has been lent more by this package). Called with mu held.
func canLend() bool {
	return enabled.Load() && (lentTo != 0 || current() < 2)
}

// setLevel sets GOMAXPROCS to one, plus the shared P if it is out, plus a
// P per blocking call. Called with mu held.
func setLevel() {
	extra := blockers
	if shared {
		extra++
	}
	switch {
	case extra == 0 && lentTo != 0:
		restore()
		lentTo = 0
	case extra > 0 && 1+extra != lentTo:
		raise(1 + extra)
		lentTo = 1 + extra
	}
}

// takeBack runs on the timer's own goroutine.
func takeBack() {
	mu.Lock()
	defer mu.Unlock()
	if users > 0 || !shared {
		return
	}
	shared = false
	setLevel()
}

// Lent reports whether a P is lent now (for tests and metrics).
func Lent() bool {
	mu.Lock()
	defer mu.Unlock()
	return lentTo != 0
}
