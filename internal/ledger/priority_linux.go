package ledger

import (
	"bytes"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// background puts the calling goroutine on an OS thread of its own with
// the lowest CPU priority, for the rest of its life, and tells whether it
// could. On Linux, priority is a property of the thread, and a thread id
// sets it for that thread alone. It helps only with GOMAXPROCS ≥ 2: a
// locked thread still holds a P while it runs.
//
// The thread goes to nice 19, and then to the SCHED_IDLE policy where the
// kernel allows it (any unprivileged thread may lower itself to it). Nice
// 19 alone was not enough: Linux's scheduler (EEVDF, 6.6 on) lets the
// running thread finish its slice before a woken one takes the core,
// whatever their nice values, and a request thread woken during a batch
// waited 1–4.5 ms (the next tick, at HZ 250) behind SQLite work
// (BENCHMARKS.md §26, measured with perf sched). A SCHED_IDLE thread is
// preempted as soon as any other thread wakes on its core. The price is a
// smaller share beside a process that keeps the core busy (a weight of 3
// against nice 19's 15, and nice 0's 1,024): slowCommits takes the
// batches off such a thread.
func background() bool {
	runtime.LockOSThread()
	tid := syscall.Gettid()
	if syscall.Setpriority(syscall.PRIO_PROCESS, tid, 19) != nil {
		return false
	}
	_ = unix.SchedSetAttr(tid, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE, Nice: 19}, 0)
	return true
}

// processCPU is the CPU time all of this process's threads have used.
func processCPU() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// waitClock reads how long one thread has waited for a CPU while runnable
// (on a run queue, not running): the second field of its schedstat file
// (CONFIG_SCHED_INFO, which distribution kernels have). The committer keeps
// its own open, so that reading it is one pread, not an open, read and
// close.
type waitClock struct {
	f   *os.File
	buf [96]byte
}

// openWaitClock opens the calling thread's clock; the goroutine must stay
// locked to its thread for as long as the clock is read. Nil if the kernel
// does not keep it.
func openWaitClock() *waitClock {
	f, err := os.Open("/proc/thread-self/schedstat")
	if err != nil {
		return nil
	}
	c := &waitClock{f: f}
	if _, ok := c.read(); !ok {
		f.Close()
		return nil
	}
	return c
}

// read returns the thread's total wait so far, and whether it could be read.
func (c *waitClock) read() (time.Duration, bool) {
	if c == nil {
		return 0, false
	}
	n, err := c.f.ReadAt(c.buf[:], 0)
	if n == 0 && err != nil {
		return 0, false
	}
	// "<ns on CPU> <ns waiting> <slices>\n"
	fields := bytes.Fields(c.buf[:n])
	if len(fields) < 2 {
		return 0, false
	}
	ns, err := strconv.ParseInt(string(fields[1]), 10, 64)
	if err != nil {
		return 0, false
	}
	return time.Duration(ns), true
}

// close closes the clock's file.
func (c *waitClock) close() {
	if c != nil {
		c.f.Close()
	}
}
