package ledger

import (
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// background puts the calling goroutine on an OS thread of its own with
// the lowest CPU priority (nice 19), for the rest of its life, and tells
// whether it could. On Linux, nice is a property of the thread, and
// PRIO_PROCESS with a thread id sets it for that thread alone. It helps
// only with GOMAXPROCS ≥ 2: a locked thread still holds a P while it runs.
func background() bool {
	runtime.LockOSThread()
	return syscall.Setpriority(syscall.PRIO_PROCESS, syscall.Gettid(), 19) == nil
}

// processCPU is the CPU time all of this process's threads have used.
func processCPU() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}
