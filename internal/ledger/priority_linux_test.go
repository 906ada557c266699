package ledger

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
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
