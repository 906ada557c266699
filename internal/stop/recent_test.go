package stop

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

// TestRecentSetGenerations: an id is kept through recentGenerations
// rotations (its retention) and dropped at the next.
func TestRecentSetGenerations(t *testing.T) {
	r := newRecentSet(time.Hour) // the timer never fires here
	defer r.Close()
	r.Add("inf_a", 42)
	for i := range recentGenerations {
		if v, ok := r.Get("inf_a"); !ok || v != 42 {
			t.Fatalf("after %d of %d rotations: Get = %d, %v; want 42", i, recentGenerations, v, ok)
		}
		r.rotate()
		r.Add(fmt.Sprintf("inf_later%d", i), uint64(i))
	}
	if !r.Has("inf_a") {
		t.Fatalf("forgotten after %d rotations, within its retention", recentGenerations)
	}
	r.rotate()
	if r.Has("inf_a") {
		t.Fatal("still remembered after its retention and a generation more")
	}
	for _, id := range []string{"inf_b", "", "inf_A", "inf_a "} {
		if r.Has(id) {
			t.Errorf("Has(%q) = true, never added", id)
		}
	}
	if got := r.Len(); got != recentGenerations {
		t.Errorf("Len = %d, want %d (the later ids)", got, recentGenerations)
	}
}

// TestRecentSetForgetsOnItsOwn: the rotation runs on a timer, so an idle
// replica's ids go too.
func TestRecentSetForgetsOnItsOwn(t *testing.T) {
	r := newRecentSet(40 * time.Millisecond)
	defer r.Close()
	r.Add("inf_a", 0)
	deadline := time.Now().Add(5 * time.Second)
	for r.Has("inf_a") {
		if time.Now().After(deadline) {
			t.Fatal("still remembered 5 s after a 40 ms retention")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r.Len() != 0 {
		t.Fatalf("Len = %d after the rotation emptied the set", r.Len())
	}
}

// TestRecentSetClose: after Close nothing is remembered, and Add (a run
// ending after its Service closed) is harmless.
func TestRecentSetClose(t *testing.T) {
	r := newRecentSet(time.Minute)
	r.Add("inf_a", 0)
	r.Close()
	r.Add("inf_b", 0)
	r.rotate() // a timer that fired just before Close
	if r.Has("inf_a") || r.Has("inf_b") || r.Len() != 0 {
		t.Fatal("a closed set remembers ids")
	}
	r.Close()
}

// BenchmarkRecentSetMemory reports the heap one remembered id costs, for
// a minute of 1,000 requests a second in its generations.
//
//	go test ./internal/stop -run '^$' -bench RecentSetMemory
func BenchmarkRecentSetMemory(b *testing.B) {
	const perGeneration = 15000
	ids := make([]string, perGeneration*(recentGenerations+1))
	for i := range ids {
		ids[i] = fmt.Sprintf("inf_%026d", i)
	}
	var perID float64
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		r := newRecentSet(time.Hour)
		for i, id := range ids {
			if i > 0 && i%perGeneration == 0 {
				r.rotate()
			}
			r.Add(id, uint64(i))
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		perID = float64(after.HeapAlloc-before.HeapAlloc) / float64(len(ids))
		runtime.KeepAlive(r)
		r.Close()
	}
	b.ReportMetric(perID, "B/id")
}
