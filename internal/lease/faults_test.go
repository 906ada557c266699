package lease

import (
	"testing"
	"time"

	"moonji/internal/testredis"
)

// TestAcquireSentAgainGrantsOnce: an acquire whose reply was lost and that
// the client sends again (go-redis retries once) answers the first grant
// again: not a second slot, and not a refusal that would leave the first
// held by nobody until it lapses.
func TestAcquireSentAgainGrantsOnce(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		r := newReplica(t, be, "r", replicaConfig{})
		s := r.store
		keys := []string{s.leaseKey("gpu"), s.waitKey("gpu"), s.waitExpKey("gpu"), s.fenceKey()}
		args := []any{s.waitMember("p"), s.memberID + "again", time.Now().UnixMilli(), "0",
			s.o.TTL.Milliseconds(), 0.5, s.channel, 0, "gpu", 1, 1}
		for try := range 2 {
			chosen, err := acquireScript.Run(testCtx(t), r.client, keys, args...).Int()
			if err != nil {
				t.Fatal(err)
			}
			if chosen != 1 {
				t.Fatalf("call %d answered %d, want the grant (1) both times", try+1, chosen)
			}
		}
		if n, err := s.Count(testCtx(t), "gpu"); err != nil || n != 1 {
			t.Fatalf("%d leases (err %v), want 1", n, err)
		}
		if n := be.Admin.ZCard(testCtx(t), s.waitKey("gpu")).Val(); n != 0 {
			t.Fatalf("%d wait entries left by a granted request", n)
		}
	})
}

// TestAdoptCountsSlotsAndFences: slots a replica handed out without Redis
// are counted once adopted, whatever the backend holds already, and the
// fence holds back every grant until it expires.
func TestAdoptCountsSlotsAndFences(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		a := newReplica(t, be, "a", replicaConfig{})
		b := newReplica(t, be, "b", replicaConfig{})
		_, held := mustAcquire(t, b, Request{Queue: "p", Candidates: one("gpu", 3)})
		fence := 400 * time.Millisecond
		raised := time.Now()
		adopted, err := a.store.Adopt(testCtx(t), map[string]int{"gpu": 3}, fence)
		if err != nil {
			t.Fatal(err)
		}
		if len(adopted["gpu"]) != 3 || a.store.Held("gpu") != 3 {
			t.Fatalf("adopted %d, held %d; want 3", len(adopted["gpu"]), a.store.Held("gpu"))
		}
		if n, _ := a.store.Count(testCtx(t), "gpu"); n != 4 {
			t.Fatalf("Redis counts %d leases, want 4 (over the limit of 3: the requests run anyway)", n)
		}
		if err := b.store.Release(testCtx(t), held); err != nil {
			t.Fatal(err)
		}
		for _, l := range adopted["gpu"][:2] {
			if err := a.store.Release(testCtx(t), l); err != nil {
				t.Fatal(err)
			}
		}
		// One lease held of 3: a slot is free, but the fence stands.
		start := time.Now()
		if i, _ := mustAcquire(t, b, Request{Queue: "p", Candidates: one("gpu", 3)}); i >= 0 && time.Since(start) < fence/2 {
			t.Fatal("granted while the fence stood")
		}
		if !testredis.WaitFor(5*time.Second, func() bool {
			i, l := mustAcquire(t, b, Request{Queue: "p", Candidates: one("gpu", 3)})
			if i >= 0 {
				_ = b.store.Release(testCtx(t), l)
			}
			return i >= 0
		}) {
			t.Fatal("nothing granted after the fence")
		}
		if since := time.Since(raised); since < fence-20*time.Millisecond {
			t.Fatalf("granted %s after the fence rose, before it fell", since)
		}
	})
}
