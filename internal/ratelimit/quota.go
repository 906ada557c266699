package ratelimit

import (
	"context"
	"hash/maphash"
	"sync"
	"time"
)

// A busy key's requests are counted against its shared limit in runs: one
// Redis call takes a run of up to maxRun requests (redis_rate's
// AllowAtMost, as many as the bucket holds), and this replica hands them
// out to the key's next requests without asking Redis again. A Redis round
// trip is a good part of what a request costs the gateway (~75 µs of its
// CPU on a small machine, and a wait on Redis; BENCHMARKS.md §19), and
// most keys that send many requests send them from one program.
//
// Runs never let a key past its limit: every request of a run was admitted
// by the shared GCRA, at the moment the run was taken. What they cost is
// that a run's unused requests are unavailable to other replicas until it
// is given back, so runs are kept small and short:
//   - a run is at most 1/runShare of the key's per-minute limit (a key
//     allowed 100 requests a minute or fewer never runs: each of its
//     requests asks Redis, as before);
//   - it is sized to what the key sent in the last runFor, so a key that
//     sends one request now and then takes one at a time;
//   - what is left of it runFor after it was taken goes back to Redis
//     (a refund, as for tokens: Reservation.refund);
//   - only one run per key is taken at a time; requests that arrive
//     meanwhile each ask Redis for themselves.
//
// The x-ratelimit-remaining header of a request served from a run counts
// what Redis had left when the run was taken plus what is left of the run.
//
// runFor is a second rather than less so that a program sending a few
// requests a second, one after the other (a chat client streaming one
// answer after another), also gets runs: each of its requests would
// otherwise wait on a Redis that, idle between them, is slow to answer
// (0.4–0.9 ms on a small VM, BENCHMARKS.md §18).
const (
	runFor   = time.Second
	runShare = 100
	maxRun   = 64
)

// runs holds this replica's runs, one per key at most.
type runs struct {
	seed   maphash.Seed
	shards [memShards]runShard
	// giveBack refunds n requests of a run taken under rate; set by New.
	giveBack func(key string, rate, n int)
}

type runShard struct {
	mu        sync.Mutex
	keys      map[string]*keyRun
	lastSweep time.Time
}

// keyRun is one key's run, and its recent demand.
type keyRun struct {
	rate      int       // the limit the run was taken under
	left      int       // requests of the run still to hand out
	remaining int       // the shared bucket's Remaining right after the take
	resetAt   time.Time // when the shared bucket is whole again, as of the take
	expires   time.Time // when what is left goes back
	gen       uint64    // tells a run's expiry timer whether its run is still current
	taking    bool      // a take for this key is in flight

	// Demand: requests seen in the current runFor period and the one before.
	period           time.Time
	inPeriod, before int
}

func newRuns(giveBack func(key string, rate, n int)) *runs {
	r := &runs{seed: maphash.MakeSeed(), giveBack: giveBack}
	for i := range r.shards {
		r.shards[i].keys = make(map[string]*keyRun)
	}
	return r
}

func (r *runs) shard(key string) *runShard {
	return &r.shards[maphash.String(r.seed, key)%memShards]
}

// next serves one request of key from its run if it can. Otherwise it
// returns how many requests the caller should take from Redis: 1, or a run
// of n > 1, which the caller must then report with taken.
func (r *runs) next(key string, rate int, now time.Time) (d Decision, served bool, n int) {
	sh := r.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.sweepLocked(now)
	k := sh.keys[key]
	if k == nil {
		k = &keyRun{period: now}
		sh.keys[key] = k
	}
	switch age := now.Sub(k.period); {
	case age >= 2*runFor:
		k.period, k.before, k.inPeriod = now, 0, 0
	case age >= runFor:
		k.period, k.before, k.inPeriod = now, k.inPeriod, 0
	}
	k.inPeriod++
	if k.left > 0 && k.rate == rate && now.Before(k.expires) {
		k.left--
		return Decision{Allowed: true, Limit: rate, Remaining: k.remaining + k.left, ResetAfter: max(k.resetAt.Sub(now), 0)}, true, 0
	}
	n = min(max(k.before, k.inPeriod), rate/runShare, maxRun)
	if n <= 1 || k.taking {
		return Decision{}, false, 1
	}
	k.taking = true
	return Decision{}, false, n
}

// taken records the answer to a take of n requests that next asked for:
// res.allowed of them were admitted, one for the caller's own request. It
// returns the caller's Decision. shared tells that Redis answered; a run
// the in-memory fallback admitted is not kept (while Redis is unreachable
// every request asks memory, which costs nothing).
func (r *runs) taken(key string, rate int, res result, shared bool, now time.Time) Decision {
	sh := r.shard(key)
	sh.mu.Lock()
	k := sh.keys[key]
	if k == nil { // swept meanwhile (a take that took over a minute)
		k = &keyRun{period: now}
		sh.keys[key] = k
	}
	k.taking = false
	d := decision(res, rate)
	if !shared || res.allowed <= 1 {
		sh.mu.Unlock()
		return d
	}
	oldLeft, oldRate := k.left, k.rate
	k.gen++
	k.rate, k.left, k.remaining = rate, res.allowed-1, res.remaining
	k.resetAt, k.expires = now.Add(res.resetAfter), now.Add(runFor)
	gen := k.gen
	sh.mu.Unlock()
	if oldLeft > 0 {
		// What is left of the run this one replaces (its limit changed,
		// or it ended and its timer has not run yet) goes back now; the
		// timer finds a newer run and does nothing.
		r.giveBack(key, oldRate, oldLeft)
	}
	time.AfterFunc(runFor, func() { r.expire(key, gen) })
	d.Remaining = res.remaining + res.allowed - 1
	return d
}

// expire gives back what is left of key's run gen, if it is still current.
func (r *runs) expire(key string, gen uint64) {
	sh := r.shard(key)
	sh.mu.Lock()
	k := sh.keys[key]
	if k == nil || k.gen != gen || k.left == 0 {
		sh.mu.Unlock()
		return
	}
	n, rate := k.left, k.rate
	k.left = 0
	sh.mu.Unlock()
	r.giveBack(key, rate, n)
}

// giveBackAll gives back what is left of every run, for Close.
func (r *runs) giveBackAll() {
	type left struct {
		key     string
		rate, n int
	}
	var all []left
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.Lock()
		for key, k := range sh.keys {
			if k.left > 0 {
				all = append(all, left{key, k.rate, k.left})
				k.left = 0
			}
		}
		sh.mu.Unlock()
	}
	for _, l := range all {
		r.giveBack(l.key, l.rate, l.n)
	}
}

// sweepLocked forgets keys that sent nothing for a minute and hold no run,
// so that a replica that sees many keys does not grow without bound.
func (sh *runShard) sweepLocked(now time.Time) {
	if now.Sub(sh.lastSweep) < sweepEvery {
		return
	}
	sh.lastSweep = now
	for key, k := range sh.keys {
		if k.left == 0 && !k.taking && now.Sub(k.period) > sweepEvery {
			delete(sh.keys, key)
		}
	}
}

// giveBackRun refunds n requests of a run to Redis. A refund that fails is
// lost, which errs towards limiting: the key gets them back as its bucket
// refills.
func (l *Limiter) giveBackRun(key string, rate, n int) {
	if l.isClosed() {
		return // Close gave back what was left; the client may be closed now
	}
	res := &Reservation{l: l, key: key, limit: rate, applied: rate, reserved: n, st: l.shared}
	if err := res.refund(context.Background(), n); err != nil {
		l.log.Debug("ratelimit: unused requests of a run not given back", "err", err)
	}
}
