package ledger

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestSQLiteCommitterRunsAtLowPriority: on SQLite, batches are written by
// a thread at nice 19, so that the kernel runs request threads first.
func TestSQLiteCommitterRunsAtLowPriority(t *testing.T) {
	before := nicedThreads(t)
	l := open(t)
	l.Record(row("low-priority-1"))
	if err := l.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := get(t, l, "low-priority-1"); got.InferenceID != "low-priority-1" {
		t.Fatalf("row not written: %+v", got)
	}
	if after := nicedThreads(t); after <= before {
		t.Fatalf("%d threads at nice 19 with a SQLite ledger open, %d before: the committer's thread was not lowered", after, before)
	}
}

// nicedThreads counts this process's threads at nice 19 (field 19 of
// /proc/self/task/TID/stat).
func nicedThreads(t *testing.T) int {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Skip("no /proc:", err)
	}
	n := 0
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + task.Name() + "/stat")
		if err != nil {
			continue // the thread exited
		}
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		if nice, err := strconv.Atoi(fields[16]); err == nil && nice == 19 {
			n++
		}
	}
	return n
}

func TestSlowCommitsObserve(t *testing.T) {
	now := time.Now()
	for _, c := range []struct {
		wall, cpu time.Duration
		starved   bool
	}{
		{10 * time.Millisecond, 0, false},                      // quick
		{100 * time.Millisecond, 60 * time.Millisecond, false}, // slow, but the process was busy: its own requests came first
		{100 * time.Millisecond, 20 * time.Millisecond, true},  // slow while the process idled: others had the CPU
		{900 * time.Millisecond, 10 * time.Millisecond, true},
	} {
		var s slowCommits
		if got := s.observe(c.wall, c.cpu, now); got != c.starved {
			t.Errorf("observe(%v, %v) = %v, want %v", c.wall, c.cpu, got, c.starved)
		}
		if got := s.active(now.Add(slowFor / 2)); got != c.starved {
			t.Errorf("after observe(%v, %v): active = %v, want %v", c.wall, c.cpu, got, c.starved)
		}
		if s.active(now.Add(slowFor)) {
			t.Errorf("after observe(%v, %v): still active after %v", c.wall, c.cpu, slowFor)
		}
	}
}

// A batch the committer took long over while the process idled (here it
// waited for SQLite's write lock, held by another connection, which is
// indistinguishable from a thread starved by other processes) sends the
// next batches around the committer, at normal priority.
func TestStarvedCommitterIsBypassed(t *testing.T) {
	l := open(t)
	other, err := l.db.DB()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conn, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	release := time.AfterFunc(150*time.Millisecond, func() { _, _ = conn.ExecContext(ctx, "COMMIT") })
	defer release.Stop()
	start, cpu := time.Now(), processCPU()
	l.Record(row("starved-1"))
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	wall, used := time.Since(start), processCPU()-cpu
	if slowRatio*used > wall {
		t.Skipf("the process itself was busy during the slow batch (%v of CPU in %v): this test's premise does not hold now", used, wall)
	}
	if n := l.slow.bypassed.Load(); n != 0 {
		t.Fatalf("%d batches bypassed the committer before it was ever slow", n)
	}
	// The Flush is answered from inside the batch; the committer judges
	// the batch just after.
	for deadline := time.Now().Add(2 * time.Second); !l.slow.active(time.Now()); {
		if time.Now().After(deadline) {
			t.Fatalf("a batch that waited 150 ms with the process idle did not mark the committer slow (took %v, the process used %v of CPU meanwhile)", wall, used)
		}
		time.Sleep(time.Millisecond)
	}
	l.Record(row("starved-2"))
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if n := l.slow.bypassed.Load(); n != 1 {
		t.Errorf("the batch after a starved one went through the committer (bypassed %d)", n)
	}
	for _, id := range []string{"starved-1", "starved-2"} {
		if got := get(t, l, id); got.InferenceID != id {
			t.Errorf("row %s not written", id)
		}
	}
}
