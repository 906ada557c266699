// Package sysmon keeps the Go runtime's system monitor thread out of its
// deep sleep, which costs a gateway at moderate load a quarter of its CPU.
//
// The monitor (the runtime's sysmon) sleeps between 20 µs and 10 ms at a
// time; when every P is idle it sleeps deeply instead, until the next
// system call wakes it. A gateway at 1,000 req/s on one core is idle most
// of the time between requests, so each request woke the monitor (a futex
// call on the request's own path), which then polled every 20 µs for a
// while and slept deeply again: three to four system calls and as many
// context switches a request, on the request's core. With deep sleep off,
// the monitor settles at one wake-up every 10 ms: the gateway's CPU at
// 1,000 req/s went from 19–26 % of its core to 14–17 % in alternated runs
// (BENCHMARKS.md §27), for ~3 ms of CPU a second while idle. The runtime has no knob for this
// (golang/go#18236) other than GODEBUG's schedtrace, whose side effect is
// that sysmon does not sleep deeply; with the largest interval it prints
// its trace line at most every 24.8 days (and once at start on a machine
// up longer than that).
//
// GODEBUG is read once, when the runtime starts, so KeepAwake runs the
// program again, in the same process, with the setting added.
package sysmon

import "strings"

// Setting is the GODEBUG setting KeepAwake adds: schedtrace at its largest
// value, in milliseconds.
const Setting = "schedtrace=2147483647"

// Environ returns env with Setting added to GODEBUG, and whether anything
// was added. An operator's own schedtrace stands, so GODEBUG=schedtrace=0
// restores the runtime's default.
func Environ(env []string) ([]string, bool) {
	for i, kv := range env {
		v, ok := strings.CutPrefix(kv, "GODEBUG=")
		if !ok {
			continue
		}
		for s := range strings.SplitSeq(v, ",") {
			if strings.HasPrefix(s, "schedtrace=") { // as the runtime reads it: no spaces
				return env, false
			}
		}
		out := append([]string(nil), env...)
		if v == "" {
			out[i] = "GODEBUG=" + Setting
		} else {
			out[i] = kv + "," + Setting
		}
		return out, true
	}
	return append(env[:len(env):len(env)], "GODEBUG="+Setting), true
}
