package main

import (
	"strings"
	"testing"
	"time"
)

// TestRead: a wake-up's delay runs to the switch that runs the thread, and
// is charged to the thread switched out then; a thread woken while it still
// ran waited for nothing; a skipped thread's wake-ups (14291, the idle one)
// are not counted.
func TestRead(t *testing.T) {
	trace := `
          vegeta 14315 [000]  2212.447232: sched:sched_waking: comm=moonji pid=14294 prio=120 target_cpu=001
          moonji 14291 [001]  2212.447732: sched:sched_switch: prev_comm=moonji prev_pid=14291 prev_prio=139 prev_state=R ==> next_comm=moonji next_pid=14294 next_prio=120
          mockup 14278 [000]  2212.447800: sched:sched_waking: comm=moonji pid=14294 prio=120 target_cpu=001
          moonji 14294 [001]  2212.447900: sched:sched_switch: prev_comm=moonji prev_pid=14294 prev_prio=120 prev_state=S ==> next_comm=swapper/1 next_pid=0 next_prio=120
          vegeta 14315 [000]  2212.448000: sched:sched_waking: comm=moonji pid=14294 prio=120 target_cpu=001
          <idle> 0 [001]  2212.448020: sched:sched_switch: prev_comm=swapper/1 prev_pid=0 prev_prio=120 prev_state=R ==> next_comm=moonji next_pid=14294 next_prio=120
          vegeta 14315 [000]  2212.448100: sched:sched_waking: comm=vegeta pid=14316 prio=120 target_cpu=000
          moonji 14294 [001]  2212.448200: sched:sched_waking: comm=moonji pid=14291 prio=139 target_cpu=001
          moonji 14294 [001]  2212.449200: sched:sched_switch: prev_comm=moonji prev_pid=14294 prev_prio=120 prev_state=S ==> next_comm=moonji next_pid=14291 next_prio=139
`
	r, err := read(strings.NewReader(trace), "moonji", func(tid string) bool { return tid == "14291" })
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{500 * time.Microsecond, 20 * time.Microsecond}
	if len(r.delays) != len(want) || r.delays[0] != want[0] || r.delays[1] != want[1] {
		t.Fatalf("delays %v, want %v", r.delays, want)
	}
	if got := r.longBy["moonji/14291"]; got != 500*time.Microsecond || r.longCount["moonji/14291"] != 1 || len(r.longBy) != 1 {
		t.Fatalf("long waits charged %v (%v), want 500µs to moonji/14291", r.longBy, r.longCount)
	}
}

func TestSeconds(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"2212.447232": 2212*time.Second + 447232*time.Microsecond,
		"1.5":         1500 * time.Millisecond,
		"7":           7 * time.Second,
	} {
		if got, err := seconds(in); err != nil || got != want {
			t.Errorf("seconds(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
}
