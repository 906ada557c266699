package main

import (
	"time"

	"golang.org/x/sys/unix"
)

// sleepFor sleeps in nanosleep, which wakes this (locked) thread to the
// microsecond rather than to the millisecond of Go's timers.
func sleepFor(d time.Duration) {
	ts := unix.NsecToTimespec(d.Nanoseconds())
	for unix.Nanosleep(&ts, &ts) == unix.EINTR {
	}
}
