package spareproc

import (
	"runtime"
	"testing"
	"time"

	"moonji/internal/testcpu"
)

// fakeProcs replaces the runtime calls with a counter, for the tests that
// check when the P is lent and taken back.
type fakeProcs struct {
	n        int // GOMAXPROCS as the package sees it
	raises   int
	restores int
}

func useFake(t *testing.T, n int) *fakeProcs {
	t.Helper()
	f := &fakeProcs{n: n}
	oldRaise, oldRestore, oldCurrent, oldDelay := raise, restore, current, delay
	// Long enough that "not yet" holds on a loaded machine.
	delay = 200 * time.Millisecond
	raise = func(n int) { f.raises++; f.n = n }
	restore = func() { f.restores++; f.n = 1 }
	current = func() int { return f.n }
	enabled.Store(true)
	t.Cleanup(func() {
		waitReturned(t)
		raise, restore, current, delay = oldRaise, oldRestore, oldCurrent, oldDelay
		enabled.Store(false)
	})
	return f
}

// waitReturned waits until no P is lent (the timer has run).
func waitReturned(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for Lent() {
		if time.Now().After(deadline) {
			t.Fatal("the P was never taken back")
		}
		time.Sleep(time.Millisecond)
	}
}

func (f *fakeProcs) get() (n, raises, restores int) {
	mu.Lock()
	defer mu.Unlock()
	return f.n, f.raises, f.restores
}

func TestLendNestsAndTakesBackLater(t *testing.T) {
	f := useFake(t, 1)
	Lend()
	Lend() // nested: no second raise
	if n, raises, _ := f.get(); n != 2 || raises != 1 {
		t.Fatalf("after two Lends: GOMAXPROCS %d, %d raises; want 2, 1", n, raises)
	}
	Return()
	Return()
	// Taken back returnAfter later, not at once.
	if n, _, restores := f.get(); n != 2 || restores != 0 {
		t.Fatalf("right after the last Return: GOMAXPROCS %d, %d restores; want 2, 0", n, restores)
	}
	waitReturned(t)
	if n, raises, restores := f.get(); n != 1 || raises != 1 || restores != 1 {
		t.Fatalf("later: GOMAXPROCS %d, %d raises, %d restores; want 1, 1, 1", n, raises, restores)
	}
}

func TestLendSoonAfterReturnKeepsTheP(t *testing.T) {
	f := useFake(t, 1)
	// Back-to-back statements, as in a transaction: one raise in all.
	for range 50 {
		Lend()
		Return()
	}
	waitReturned(t)
	if _, raises, restores := f.get(); raises != 1 || restores != 1 {
		t.Fatalf("50 quick Lends: %d raises, %d restores; want 1, 1", raises, restores)
	}
	// A Lend after the P was taken back raises again.
	Lend()
	Return()
	waitReturned(t)
	if _, raises, restores := f.get(); raises != 2 || restores != 2 {
		t.Fatalf("one more Lend: %d raises, %d restores; want 2, 2", raises, restores)
	}
}

func TestNothingToLendWithTwoCPUs(t *testing.T) {
	f := useFake(t, 2)
	Lend()
	Return()
	time.Sleep(2 * delay)
	if _, raises, restores := f.get(); raises != 0 || restores != 0 {
		t.Fatalf("with GOMAXPROCS 2 already: %d raises, %d restores; want none", raises, restores)
	}
}

func TestOperatorsGOMAXPROCSStands(t *testing.T) {
	t.Setenv("GOMAXPROCS", "1")
	Enable()
	if Enabled() {
		enabled.Store(false)
		t.Fatal("Enable turned lending on although GOMAXPROCS was set")
	}
}

// TestEnableBetweenLendAndReturn: a statement that began before Enable
// ends without upsetting the count (it panicked on its Return before).
func TestEnableBetweenLendAndReturn(t *testing.T) {
	f := useFake(t, 1)
	enabled.Store(false)
	Lend()
	Enable()
	Return()
	Lend()
	Return()
	waitReturned(t)
	if _, raises, restores := f.get(); raises != 1 || restores != 1 {
		t.Fatalf("%d raises, %d restores; want the second Lend's one of each", raises, restores)
	}
}

func TestReturnWithoutLendPanics(t *testing.T) {
	useFake(t, 1)
	defer func() {
		if recover() == nil {
			t.Fatal("an unmatched Return did not panic")
		}
	}()
	Return()
}

// TestLendsOnOneCPU changes the real GOMAXPROCS of a process confined to
// one CPU.
func TestLendsOnOneCPU(t *testing.T) {
	if !testcpu.OnOne(t) {
		return
	}
	Enable()
	Lend()
	if n := runtime.GOMAXPROCS(0); n != 2 {
		t.Fatalf("GOMAXPROCS while lent: %d, want 2", n)
	}
	Return()
	waitReturned(t)
	if n := runtime.GOMAXPROCS(0); n != 1 {
		t.Fatalf("GOMAXPROCS once taken back: %d, want 1", n)
	}
}

func TestReturnAtOnceTakesThePBackNow(t *testing.T) {
	f := useFake(t, 1)
	Lend()
	Lend()
	ReturnAtOnce() // not the last
	if n, _, restores := f.get(); n != 2 || restores != 0 {
		t.Fatalf("one Lend still out: GOMAXPROCS %d, %d restores; want 2, 0", n, restores)
	}
	ReturnAtOnce()
	if n, raises, restores := f.get(); n != 1 || raises != 1 || restores != 1 {
		t.Fatalf("after the last: GOMAXPROCS %d, %d raises, %d restores; want 1, 1, 1", n, raises, restores)
	}
	// A Return before it left the timer armed: ReturnAtOnce stops it, and
	// the next Lend raises again.
	Lend()
	Return()
	Lend()
	ReturnAtOnce()
	time.Sleep(2 * delay)
	if n, raises, restores := f.get(); n != 1 || raises != 2 || restores != 2 {
		t.Fatalf("later: GOMAXPROCS %d, %d raises, %d restores; want 1, 2, 2", n, raises, restores)
	}
}

// TestBlockingLendsAPOfItsOwn: a blocking call gets a P on top of the one
// Lend lends, and gives it back when it returns.
func TestBlockingLendsAPOfItsOwn(t *testing.T) {
	f := useFake(t, 1)
	Blocking(func() {
		if n, _, _ := f.get(); n != 2 {
			t.Errorf("GOMAXPROCS during a blocking call: %d, want 2", n)
		}
	})
	if n, _, _ := f.get(); n != 1 || Lent() {
		t.Fatalf("after it: GOMAXPROCS %d, lent %v; want 1, false", n, Lent())
	}
	Lend()
	Blocking(func() {
		Blocking(func() {
			if n, _, _ := f.get(); n != 4 {
				t.Errorf("two blocking calls beside a Lend: GOMAXPROCS %d, want 4", n)
			}
		})
		if n, _, _ := f.get(); n != 3 {
			t.Errorf("one blocking call beside a Lend: GOMAXPROCS %d, want 3", n)
		}
	})
	if n, _, _ := f.get(); n != 2 {
		t.Fatalf("the Lend alone: GOMAXPROCS %d, want 2", n)
	}
	ReturnAtOnce()
	if n, _, _ := f.get(); n != 1 {
		t.Fatalf("nothing lent: GOMAXPROCS %d, want 1", n)
	}
}

func TestBlockingLendsNothingWithTwoCPUs(t *testing.T) {
	f := useFake(t, 2)
	Blocking(func() {})
	if _, raises, restores := f.get(); raises != 0 || restores != 0 {
		t.Fatalf("with GOMAXPROCS 2 already: %d raises, %d restores; want none", raises, restores)
	}
}
