// Command wakeups reads `perf script` output of the sched:sched_waking and
// sched:sched_switch events and reports how long one process's threads
// waited for a CPU after they were woken: the delay from a thread's wake-up
// to the switch that ran it, and who held the CPU meanwhile.
//
//	perf record -e sched:sched_switch -e sched:sched_waking -a -o perf.data -- sleep 5
//	perf script -i perf.data | wakeups -comm moonji -policies tasks.txt
//
// A request crosses several of these wake-ups (its bytes arrive, the
// engine's answer arrives, a goroutine is handed to another thread), so a
// thread that keeps the CPU for milliseconds shows in a gateway's p99 even
// when its own CPU use is small. -policies names a file of "TID POLICY NICE"
// lines (from /proc/PID/task/TID/stat, fields 41 and 19) so that the threads
// holding the CPU are shown with their scheduling policy and nice value, and
// the wake-ups of threads of the idle policy, which wait by design, are left
// out; bench/bench-wakeups.sh writes it.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// longWait is where a wake-up delay counts as long: a third of a
// millisecond, a third of the whole p99 target at 1,000 req/s.
const longWait = 300 * time.Microsecond

func main() {
	comm := flag.String("comm", "moonji", "the woken threads' command name (a prefix)")
	policyFile := flag.String("policies", "", `a file of "TID POLICY NICE" lines for the threads holding the CPU`)
	flag.Parse()
	policies := map[string]string{}
	if *policyFile != "" {
		b, err := os.ReadFile(*policyFile)
		if err != nil {
			log.Fatal(err)
		}
		for line := range strings.Lines(string(b)) {
			if f := strings.Fields(line); len(f) == 3 {
				policies[f[0]] = policyName(f[1]) + ", nice " + f[2]
			}
		}
	}
	// A thread of the idle policy (the ledger's committer, in builds before
	// issue 43) waits for the core by design: its wake-ups are not counted.
	idle := func(tid string) bool { return strings.HasPrefix(policies[tid], "idle") }
	r, err := read(os.Stdin, *comm, idle)
	if err != nil {
		log.Fatal(err)
	}
	r.print(os.Stdout, policies)
}

// policyName names a Linux scheduling policy number.
func policyName(n string) string {
	switch n {
	case "0":
		return "normal"
	case "3":
		return "batch"
	case "5":
		return "idle"
	}
	return "policy " + n
}

// report is what read found.
type report struct {
	delays []time.Duration
	// longBy sums the long delays by the thread that held the CPU
	// ("comm/tid"), and longCount counts them.
	longBy    map[string]time.Duration
	longCount map[string]int
}

// read parses perf script lines such as
//
//	vegeta 14315 [000]  2212.447232: sched:sched_waking: comm=moonji pid=14294 prio=120 target_cpu=001
//	moonji 14294 [001]  2212.447342: sched:sched_switch: prev_comm=moonji prev_pid=14294 prev_prio=120 prev_state=S ==> next_comm=moonji next_pid=14289 next_prio=120
//
// Wake-ups of threads for which skip is true are not counted.
func read(in io.Reader, comm string, skip func(tid string) bool) (*report, error) {
	r := &report{longBy: map[string]time.Duration{}, longCount: map[string]int{}}
	woken := map[string]time.Duration{} // tid → when it was woken, until it runs
	running := map[string]bool{}        // tid → on a CPU now
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		head, rest, ok := strings.Cut(line, ": sched:")
		if !ok {
			continue
		}
		f := strings.Fields(head)
		if len(f) < 3 {
			continue
		}
		at, err := seconds(strings.TrimSuffix(f[len(f)-1], ":"))
		if err != nil {
			continue
		}
		event, args, _ := strings.Cut(rest, ": ")
		kv := fields(args)
		switch event {
		case "sched_waking":
			tid := kv["pid"]
			if strings.HasPrefix(kv["comm"], comm) && !running[tid] && !skip(tid) {
				if _, seen := woken[tid]; !seen {
					woken[tid] = at
				}
			}
		case "sched_switch":
			prev, next := kv["prev_pid"], kv["next_pid"]
			running[prev], running[next] = false, true
			delete(woken, prev) // it ran: a wake-up while it ran cost no wait
			at0, ok := woken[next]
			if !ok {
				continue
			}
			delete(woken, next)
			d := at - at0
			r.delays = append(r.delays, d)
			if d >= longWait {
				holder := kv["prev_comm"] + "/" + prev
				r.longBy[holder] += d
				r.longCount[holder]++
			}
		}
	}
	return r, sc.Err()
}

// fields splits "a=1 b=x y=2" into its pairs. A value may not contain a
// space (a command name may, and is then cut: it is only shown).
func fields(s string) map[string]string {
	kv := map[string]string{}
	for _, f := range strings.Fields(s) {
		if k, v, ok := strings.Cut(f, "="); ok {
			kv[k] = v
		}
	}
	return kv
}

// seconds parses perf's "2212.447232" into a duration since its clock's
// start.
func seconds(s string) (time.Duration, error) {
	whole, frac, _ := strings.Cut(s, ".")
	w, err := strconv.ParseInt(whole, 10, 64)
	if err != nil {
		return 0, err
	}
	frac = (frac + "000000000")[:9]
	n, err := strconv.ParseInt(frac, 10, 64)
	if err != nil {
		return 0, err
	}
	return time.Duration(w)*time.Second + time.Duration(n), nil
}

func (r *report) print(w io.Writer, policies map[string]string) {
	n := len(r.delays)
	if n == 0 {
		fmt.Fprintln(w, "no wake-ups of the given command")
		return
	}
	slices.Sort(r.delays)
	at := func(q float64) time.Duration { return r.delays[min(n-1, int(float64(n)*q))] }
	var long time.Duration
	for _, d := range r.longBy {
		long += d
	}
	fmt.Fprintf(w, "wake-ups %d: p50 %v p90 %v p99 %v p99.9 %v max %v; waits over %v: %v in all\n",
		n, at(0.5), at(0.9), at(0.99), at(0.999), r.delays[n-1], longWait, long.Round(time.Microsecond))
	holders := make([]string, 0, len(r.longBy))
	for h := range r.longBy {
		holders = append(holders, h)
	}
	slices.SortFunc(holders, func(a, b string) int { return int(r.longBy[b] - r.longBy[a]) })
	for _, h := range holders[:min(len(holders), 8)] {
		policy := ""
		if _, tid, ok := strings.Cut(h, "/"); ok && policies[tid] != "" {
			policy = " (" + policies[tid] + ")"
		}
		fmt.Fprintf(w, "  behind %-28s %4d waits, %v\n", h+policy, r.longCount[h], r.longBy[h].Round(time.Microsecond))
	}
}
