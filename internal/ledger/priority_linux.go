package ledger

import (
	"runtime"
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
