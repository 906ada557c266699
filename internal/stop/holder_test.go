package stop

import (
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// waitFor polls cond until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestHolderStopStopped(t *testing.T) {
	h := NewHolder(0)
	defer h.Close()
	if h.TTL() != DefaultTTL {
		t.Fatalf("TTL = %v, want default %v", h.TTL(), DefaultTTL)
	}
	if h.Stopped("inf_a") {
		t.Fatal("inf_a stopped before Stop")
	}
	if !h.Stop("inf_a") {
		t.Fatal("first Stop returned false")
	}
	if h.Stop("inf_a") {
		t.Fatal("second Stop returned true")
	}
	if !h.Stopped("inf_a") || h.Stopped("inf_b") {
		t.Fatal("Stopped wrong after Stop(inf_a)")
	}
	if h.Len() != 1 {
		t.Fatalf("Len = %d, want 1", h.Len())
	}
}

func TestHolderTTLExpiry(t *testing.T) {
	const ttl = 60 * time.Millisecond
	h := NewHolder(ttl)
	defer h.Close()
	start := time.Now()
	h.Stop("inf_x")
	if !h.Stopped("inf_x") {
		t.Fatal("not stopped right after Stop")
	}
	waitFor(t, 2*time.Second, "expiry", func() bool { return !h.Stopped("inf_x") })
	// Never forgotten early; at most one sweep (ttl/4) late, plus scheduling.
	if age := time.Since(start); age < ttl {
		t.Fatalf("forgotten after %v, before the TTL %v", age, ttl)
	}
	if h.Len() != 0 {
		t.Fatalf("Len = %d after expiry", h.Len())
	}
	// Stopping again after expiry is a first stop again.
	if !h.Stop("inf_x") {
		t.Fatal("Stop after expiry should be first")
	}
}

func heapInUse() uint64 {
	var ms runtime.MemStats
	for range 3 {
		runtime.GC()
	}
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func TestHolderJanitorBoundsMemory(t *testing.T) {
	const n = 10_000
	// Long enough that no entry expires while the 10,000 go in, even on a
	// loaded machine (at 100 ms, a busy CI machine lost a thousand).
	const ttl = time.Second
	h := NewHolder(ttl)
	defer h.Close()
	base := heapInUse()
	for i := range n {
		h.Stop("inf_" + strconv.Itoa(i) + "_0123456789abcdef")
	}
	if got := h.Len(); got != n {
		t.Fatalf("Len = %d, want %d", got, n)
	}
	full := heapInUse()
	waitFor(t, 10*time.Second, "janitor to empty the holder", func() bool { return h.Len() == 0 })
	// One more sweep so that the shards' maps have been rebuilt small.
	time.Sleep(2 * h.sweep)
	after := heapInUse()
	t.Logf("heap: baseline %d B, with %d stops %d B (+%d), after TTL %d B", base, n, full, int64(full)-int64(base), after)
	if full <= base+n*32 {
		t.Fatalf("heap barely grew with %d entries (%d -> %d); measurement is not meaningful", n, base, full)
	}
	// Loose bound: within 64 KiB of the baseline, against ~1 MiB when full.
	if after > base+64<<10 {
		t.Fatalf("heap after expiry %d B, baseline %d B: memory not given back", after, base)
	}
}

func TestHolderWatch(t *testing.T) {
	h := NewHolder(0)
	defer h.Close()

	var calls atomic.Int32
	unwatch := h.Watch("inf_w", func() { calls.Add(1) })
	if calls.Load() != 0 {
		t.Fatal("onStop called before Stop")
	}
	h.Stop("inf_w")
	h.Stop("inf_w")
	if calls.Load() != 1 {
		t.Fatalf("onStop called %d times, want 1", calls.Load())
	}
	unwatch() // harmless after firing
	unwatch()

	// Watching an id that is already stopped calls onStop at once.
	var now atomic.Int32
	h.Watch("inf_w", func() { now.Add(1) })()
	if now.Load() != 1 {
		t.Fatalf("Watch of a stopped id called onStop %d times, want 1", now.Load())
	}

	// Unwatch before Stop: never called, and nothing left behind.
	var never atomic.Int32
	un := h.Watch("inf_u", func() { never.Add(1) })
	un()
	h.Stop("inf_u")
	if never.Load() != 0 {
		t.Fatal("onStop called after unwatch")
	}
	for i := range h.shards {
		if n := len(h.shards[i].watchers); n != 0 {
			t.Fatalf("shard %d still holds %d watcher lists", i, n)
		}
	}

	// Several watchers of one id each fire once; an unwatched one does not.
	var a, b, c atomic.Int32
	h.Watch("inf_m", func() { a.Add(1) })
	unB := h.Watch("inf_m", func() { b.Add(1) })
	h.Watch("inf_m", func() { c.Add(1) })
	unB()
	h.Stop("inf_m")
	if a.Load() != 1 || b.Load() != 0 || c.Load() != 1 {
		t.Fatalf("calls a=%d b=%d c=%d, want 1 0 1", a.Load(), b.Load(), c.Load())
	}
}

func TestHolderWatchConcurrentStop(t *testing.T) {
	h := NewHolder(0)
	defer h.Close()
	for round := range 200 {
		id := fmt.Sprintf("inf_c%d", round)
		var calls atomic.Int32
		un := h.Watch(id, func() { calls.Add(1) })
		var wg sync.WaitGroup
		var firsts atomic.Int32
		for range 8 {
			wg.Go(func() {
				if h.Stop(id) {
					firsts.Add(1)
				}
				_ = h.Stopped(id)
			})
		}
		wg.Go(un)
		wg.Wait()
		if firsts.Load() != 1 {
			t.Fatalf("round %d: %d first stops, want 1", round, firsts.Load())
		}
		if calls.Load() > 1 {
			t.Fatalf("round %d: onStop called %d times", round, calls.Load())
		}
	}
}

func TestHolderStoppedAllocatesNothing(t *testing.T) {
	h := NewHolder(0)
	defer h.Close()
	h.Stop("inf_hit")
	hit, miss := "inf_hit", "inf_miss"
	if n := testing.AllocsPerRun(1000, func() { _ = h.Stopped(hit) }); n != 0 {
		t.Fatalf("Stopped(hit) allocates %v per call", n)
	}
	if n := testing.AllocsPerRun(1000, func() { _ = h.Stopped(miss) }); n != 0 {
		t.Fatalf("Stopped(miss) allocates %v per call", n)
	}
}

// BenchmarkStopped measures the per-token check: serially, and with every
// CPU checking at once while stops trickle in, for one RWMutex and for the
// default shard count.
func BenchmarkStopped(b *testing.B) {
	for _, shards := range []int{1, defaultShards} {
		h := newHolder(0, shards)
		ids := make([]string, 1024)
		for i := range ids {
			ids[i] = "inf_" + strconv.Itoa(i) + "_0123456789abcdef"
			if i%8 == 0 {
				h.Stop(ids[i])
			}
		}
		b.Run(fmt.Sprintf("shards=%d/serial", shards), func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				_ = h.Stopped(ids[i&1023])
				i++
			}
		})
		b.Run(fmt.Sprintf("shards=%d/parallel", shards), func(b *testing.B) {
			b.ReportAllocs()
			var next atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				i := int(next.Add(1)) * 97
				for pb.Next() {
					_ = h.Stopped(ids[i&1023])
					i++
				}
			})
		})
		b.Run(fmt.Sprintf("shards=%d/parallel-with-stops", shards), func(b *testing.B) {
			b.ReportAllocs()
			var next atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				g := next.Add(1)
				i := int(g) * 97
				for pb.Next() {
					// One goroutine in 64 writes now and then, as stops and
					// watches do in production.
					if g%64 == 1 && i%256 == 0 {
						h.Stop("inf_new_" + strconv.Itoa(i))
					} else {
						_ = h.Stopped(ids[i&1023])
					}
					i++
				}
			})
		})
		h.Close()
	}
}
