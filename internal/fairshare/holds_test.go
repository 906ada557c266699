package fairshare

import (
	"slices"
	"sync"
	"sync/atomic"
	"testing"
)

func TestHoldsBoundEachPersonAlone(t *testing.T) {
	h := New(2)
	var ended atomic.Int32
	end := func() { ended.Add(1) }
	r1, ok1 := h.Take(7, end)
	_, ok2 := h.Take(7, end)
	_, ok3 := h.Take(7, end)
	if !ok1 || !ok2 || ok3 {
		t.Fatalf("takes of one person: %v %v %v, want the third refused", ok1, ok2, ok3)
	}
	if _, ok := h.Take(8, end); !ok {
		t.Fatal("another person is refused for the first one's holds")
	}
	r1()
	r1() // twice: still one release
	if _, ok := h.Take(7, end); !ok {
		t.Fatal("a released hold is not given back")
	}
	if n := h.Held(7); n != 2 {
		t.Fatalf("person 7 holds %d, want 2", n)
	}
	if got := h.People(); !slices.Equal(got, []uint{7, 8}) {
		t.Fatalf("People() = %v", got)
	}
	if n := h.EndPerson(7); n != 2 || ended.Load() != 2 {
		t.Fatalf("EndPerson(7) = %d, %d ended; want 2, 2", n, ended.Load())
	}
}

func TestHoldsUnboundedAndConcurrent(t *testing.T) {
	h := New(0)
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			release, ok := h.Take(uint(i%4), func() {})
			if !ok {
				t.Error("an unbounded take was refused")
			}
			release()
		}()
	}
	wg.Wait()
	if p := h.People(); len(p) != 0 {
		t.Fatalf("after every release %v still hold", p)
	}
}
