package lease

import (
	"context"
	"testing"

	"moonji/internal/testredis"
)

// BenchmarkAcquireRelease measures the Redis slot path of one request: one
// Acquire and one Release, against the real Redis of MOONJI_TEST_REDIS_URL
// when set, otherwise miniredis.
func BenchmarkAcquireRelease(b *testing.B) {
	be := testredis.Best(b)
	r := newReplica(b, be, "bench", replicaConfig{})
	cands := []Backend{{Name: "x", Max: 1 << 20, Weight: 1}, {Name: "y", Max: 1 << 20, Weight: 1}}
	ctx := context.Background()
	b.Run("sequential", func(b *testing.B) {
		for b.Loop() {
			_, l, err := r.store.Acquire(ctx, Request{Queue: "p", Candidates: cands})
			if err != nil || l.IsZero() {
				b.Fatalf("acquire: %v (lease %+v)", err, l)
			}
			if err := r.store.Release(ctx, l); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_, l, err := r.store.Acquire(ctx, Request{Queue: "p", Candidates: cands})
				if err != nil || l.IsZero() {
					b.Errorf("acquire: %v", err)
					return
				}
				if err := r.store.Release(ctx, l); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
