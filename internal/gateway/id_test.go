package gateway

import (
	"regexp"
	"testing"
	"time"
)

// Inference ids keep their public form and sort by the time they were made,
// so that the ledger's unique index grows at its right edge.
func TestInferenceIDsSortByTime(t *testing.T) {
	form := regexp.MustCompile(`^inf_[0-9a-hjkmnp-tv-z]{26}$`)
	seen := map[string]bool{}
	prev := newID()
	for i := 0; i < 2000; i++ {
		if i%500 == 0 {
			time.Sleep(2 * time.Millisecond) // cross a millisecond for certain
		}
		id := newID()
		if !form.MatchString(id) {
			t.Fatalf("id %q is not inf_ and 26 base32 characters", id)
		}
		if seen[id] {
			t.Fatalf("id %q made twice", id)
		}
		seen[id] = true
		// The first 9 characters are the time's top 45 bits (the 10th
		// mixes its last 3 with random bits): they never go back.
		if id[:4+9] < prev[:4+9] {
			t.Fatalf("id %q sorts before the earlier %q", id, prev)
		}
		prev = id
	}
	a := newID()
	time.Sleep(2 * time.Millisecond)
	if b := newID(); b <= a {
		t.Errorf("id %q made 2 ms later does not sort after %q", b, a)
	}
}
