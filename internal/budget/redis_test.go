package budget

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"moonji/internal/testredis"
)

func TestRedisUnavailable(t *testing.T) {
	limits := []Limit{{Scope: ScopeKey, ID: 1, Name: "k", Amount: 100, Period: PeriodDay}}
	check := func(t *testing.T, s *Store) {
		t.Helper()
		if _, _, err := s.Reserve(ctxT(t), "a", limits, 1, time.Minute, at); !errors.Is(err, ErrUnavailable) {
			t.Errorf("Reserve: %v, want ErrUnavailable", err)
		}
		if _, err := s.Status(ctxT(t), limits, at); !errors.Is(err, ErrUnavailable) {
			t.Errorf("Status: %v, want ErrUnavailable", err)
		}
	}

	t.Run("closed port", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		_ = ln.Close()
		rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1})
		defer rdb.Close()
		check(t, NewRedis(rdb, testredis.RandomPrefix(), newSpender(), testredis.Logger(t)))
	})

	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		gate := &testredis.Gate{}
		s := newRedisStore(t, be, newSpender(), func(o *redis.Options) {
			o.Dialer = gate.Dial
			o.MaxRetries, o.DialerRetries = -1, 1
		})
		r := mustReserve(t, s, "before", limits, 10, at)
		gate.Cut()
		check(t, s)
		r.Settle(ctxT(t), 10) // logged, not fatal
		gate.Heal()
		// The failed settle's hold lapses at its deadline; its cost is
		// lost to Redis (see doc.go).
		if got := status(t, s, limits, at.Add(time.Minute)); got != "0/0" {
			t.Errorf("after the outage: %s, want 0/0", got)
		}
	})
}

// TestRedisCommandsPerCall holds Reserve and Settle to one round trip
// each, an EVALSHA, once a window is built and the scripts are cached.
func TestRedisCommandsPerCall(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		counter := &testredis.Counter{Match: func(cmd redis.Cmder) bool { return cmd.Name() == "evalsha" }}
		rdb := redis.NewClient(be.Options())
		t.Cleanup(func() { _ = rdb.Close() })
		rdb.AddHook(counter)
		s := NewRedis(rdb, be.Prefix, newSpender(), testredis.Logger(t))
		limits := []Limit{
			{Scope: ScopeKey, ID: 1, Name: "k", Amount: 1000, Period: PeriodDay},
			{Scope: ScopePerson, ID: 1, Name: "p", Amount: 1000, Period: PeriodMonth},
			{Scope: ScopeTeam, ID: 1, Name: "t", Amount: 1000, Period: PeriodTotal},
		}
		mustReserve(t, s, "warm", limits, 1, at).Settle(ctxT(t), 1)

		count := func(what string, f func()) {
			t.Helper()
			n, matched := counter.N.Load(), counter.Matched.Load()
			f()
			if dn, dm := counter.N.Load()-n, counter.Matched.Load()-matched; dn != 1 || dm != 1 {
				last := ""
				if p := counter.LastOther.Load(); p != nil {
					last = *p
				}
				t.Errorf("%s sent %d commands, %d of them EVALSHA (last other: %q); want one EVALSHA", what, dn, dm, last)
			}
		}
		var r *Reservation
		count("Reserve", func() { r = mustReserve(t, s, "steady", limits, 5, at) })
		count("Settle", func() { r.Settle(ctxT(t), 4) })
		count("a refused Reserve", func() { mustRefuse(t, s, "big", limits, 5000, at) })
	})
}

func TestRedisKeys(t *testing.T) {
	testredis.ForEach(t, func(t *testing.T, be *testredis.Backend) {
		sp := newSpender()
		s := newRedisStore(t, be, sp, nil)
		ctx := ctxT(t)
		day := Limit{Scope: ScopeKey, ID: 9, Name: "k", Amount: 1000, Period: PeriodDay}
		total := Limit{Scope: ScopeTeam, ID: 9, Name: "t", Amount: 1000, Period: PeriodTotal}
		r := mustReserve(t, s, "a", []Limit{day, total}, 10, at)

		dayKey := be.Prefix + "budget:key:9:day:1796515200:" // 2026-12-06T00:00:00Z
		totalKey := be.Prefix + "budget:team:9:total:0:"
		// A day's keys last until two days after it ends: 8 h 56 min
		// from at to midnight, then 48 h.
		want := 56*time.Hour + 56*time.Minute
		for _, suffix := range []string{"spent", "res", "dl", "rsum"} {
			ttl, err := be.Admin.PTTL(ctx, dayKey+suffix).Result()
			if err != nil || ttl < want-time.Minute || ttl > want {
				t.Errorf("PTTL %s = %v, %v; want about %v", dayKey+suffix, ttl, err, want)
			}
		}
		// A total's state lives a day, then is rebuilt from the database.
		for _, suffix := range []string{"spent", "res"} {
			if ttl, err := be.Admin.PTTL(ctx, totalKey+suffix).Result(); err != nil || ttl < totalKeep-time.Minute || ttl > totalKeep {
				t.Errorf("PTTL of the total's %s = %v, %v; want about %v", suffix, ttl, err, totalKeep)
			}
		}

		// A settle does not create a spent key that is gone: the next
		// reserve rebuilds it from the database.
		if err := be.Admin.Del(ctx, dayKey+"spent").Err(); err != nil {
			t.Fatal(err)
		}
		r.Settle(ctx, 10)
		if n, err := be.Admin.Exists(ctx, dayKey+"spent").Result(); err != nil || n != 0 {
			t.Errorf("EXISTS spent after a settle = %d, %v; want 0", n, err)
		}
		// The total's reservation keys hold nothing once settled.
		if n := be.Admin.HLen(ctx, totalKey+"res").Val(); n != 0 || be.Admin.Get(ctx, totalKey+"rsum").Val() != "0" {
			t.Errorf("the total's reservations after a settle: %d held, rsum %q", n, be.Admin.Get(ctx, totalKey+"rsum").Val())
		}
		if got := be.Admin.Get(ctx, totalKey+"spent").Val(); got != "10" {
			t.Errorf("the total's spent = %q, want 10", got)
		}
		sp.set(ScopeKey, 9, 10)
		if got := status(t, s, []Limit{day}, at); got != "10/0" {
			t.Errorf("rebuilt: %s, want 10/0 from the Spender", got)
		}
		if calls := sp.Calls(); len(calls) != 3 || !strings.HasPrefix(calls[2], "key:9 ") {
			t.Errorf("Spender calls %q, want the day's asked again", calls)
		}
	})
}
