package journal

import (
	"fmt"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"

	"moonji/models"
)

// Begin's copies land on pages the journal's goroutine made writable ahead
// of them, and made writable again after a sync wrote them back: the thread
// that calls Begin takes no page fault there. Without the prefault the same
// rows fault once a page (the first leg shows the count can see them).
func TestBeginTakesNoPageFault(t *testing.T) {
	// A window of many pages, for a count well above the heap's noise.
	defer func(was int64) { prefaultAhead = was }(prefaultAhead)
	prefaultAhead = 512 << 10
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// The heap Begin's map and buffers grow into is faulted in first, by a
	// journal of its own, so that the count below is the segment's.
	warm, _, err := Open(t.TempDir(), "w", nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4000 {
		if err := warm.Begin(row(fmt.Sprintf("inf_warm_%06d", i))); err != nil {
			t.Fatal(err)
		}
	}
	warm.Close()
	runtime.GC() // what it used is free for the journals below
	for _, c := range []struct {
		name     string
		prefault bool
	}{{"without prefault", false}, {"prefaulted", true}, {"prefaulted further on", true}, {"prefaulted after a sync", true},
		{"prefaulted after an idle sync", true}} {
		prefaultSegments = c.prefault
		j, _, err := Open(t.TempDir(), "r", nil)
		prefaultSegments = true
		if err != nil {
			t.Fatal(err)
		}
		if j.cur.mem == nil {
			j.Close()
			t.Skip("segments are not mapped here")
		}
		j.mu.Lock()
		j.where = make(map[string]*segment, 4096) // no growth while counting
		j.mu.Unlock()
		rows := make([]*models.Usage, 4000)
		for i := range rows {
			rows[i] = row(fmt.Sprintf("inf_%s_%06d", c.name[:3], i))
		}
		n := 0
		begin := func(bytes int64) {
			t.Helper()
			start := j.cur.size
			for j.cur.size-start < bytes {
				if err := j.Begin(rows[n]); err != nil {
					t.Fatal(err)
				}
				n++
			}
		}
		if c.name == "prefaulted further on" {
			// Twice past the half that asks for more: each time the next
			// part is prefaulted from where the last one ended.
			for range 2 {
				begin(prefaultAhead * 5 / 8)
				waitPrefaulted(t, j)
			}
		}
		if c.name == "prefaulted after a sync" {
			begin(prefaultAhead / 4)
			j.sync() // writes the pages back (write-protecting them) and prefaults anew
		}
		if c.name == "prefaulted after an idle sync" {
			begin(prefaultAhead / 4)
			j.sync()
			j.sync() // nothing written since: the pages go back read-only, and stay so
			begin(1) // the next Begin asks again
		}
		if c.prefault {
			waitPrefaulted(t, j)
		}
		begin(256) // the map and buffers Begin uses have grown
		before := threadFaults(t)
		bytes := prefaultAhead * 3 / 8 // under the half that asks for more
		begin(bytes)
		faults := threadFaults(t) - before
		pages := bytes / int64(pageSize)
		t.Logf("%s: %d faults writing %d pages' worth of rows", c.name, faults, pages)
		switch {
		case !c.prefault && faults < pages/2:
			t.Errorf("%s: %d faults for %d pages: the count does not see the faults", c.name, faults, pages)
		case c.prefault && faults > pages/8:
			t.Errorf("%s: %d faults for %d pages written", c.name, faults, pages)
		}
		j.mu.Lock()
		refused := c.prefault && j.noPrefault
		j.mu.Unlock()
		if refused {
			t.Errorf("%s: the kernel refused a prefault", c.name)
		}
		j.Close()
	}
}

// waitPrefaulted waits until the current segment is prefaulted a whole
// window past its last record.
func waitPrefaulted(t *testing.T, j *Journal) {
	t.Helper()
	eventually(t, "the segment prefaulted", func() bool {
		return held(j, func() bool {
			return j.cur.ready >= min(j.cur.size+j.window, int64(len(j.cur.mem))) && !j.cur.busy
		})
	})
}

// threadFaults is the calling thread's count of minor page faults.
func threadFaults(t *testing.T) int64 {
	t.Helper()
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &ru); err != nil {
		t.Fatal(err)
	}
	return ru.Minflt
}
