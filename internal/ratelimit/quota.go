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
//     (a refund, as for tokens: Reservation.refund) when its timer runs;
//   - only one run per key is taken at a time.
//
// A busy key never has more than that one call to Redis in flight. Its next
// run is taken ahead, in the background, once half of the current one is
// handed out, and what it brings joins what is left; a request that finds
// the run used up while a take is in flight waits for that take instead of
// asking Redis for itself. So a key that keeps sending finds a run nearly
// every time. Before, a take sat on a request's path when the last run ran
// out, and every request that came during its round trip asked Redis too:
// on a busy gateway whose core Redis or the database shares, one slow round
// trip became a queue for the client's connections that grew as fast as
// requests came, and stalled every request for up to a second at
// 4,000–5,000 req/s (BENCHMARKS.md §32). What is left of a run when the
// next one joins it is used up to runFor after that one was taken: a
// replica may hold what it took up to twice runFor, never more than its
// key's limit admitted.
//
// A run ends runFor after it was taken, used up or not. A key still sending
// then has its next run taken at once, in the background, as its leftover
// goes back: before, its next request found no run and asked Redis on its
// own path. A chat client streaming one answer after another (a request
// every quarter of a second, runs of four) had every fourth request wait
// on Redis that way and every fourth share the gateway's core with a take
// ahead: a stream's first byte came ~0.1 ms later at the median with
// Redis than without (BENCHMARKS.md §35). Only a key that sent a request
// in the last runFor gets one, so a key that stopped sending gets one run
// more at most, given back when it ends.
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
	// giveBack refunds n requests of a run taken under rate; takeAhead
	// takes key's next run of n in the background and records it with
	// takenAhead; now is the clock. Set by New.
	giveBack  func(key string, rate, n int)
	takeAhead func(key string, rate, n int)
	now       func() time.Time
}

type runShard struct {
	mu        sync.Mutex
	keys      map[string]*keyRun
	lastSweep time.Time
}

// keyRun is one key's run, and its recent demand.
type keyRun struct {
	rate      int           // the limit the run was taken under
	left      int           // requests of the run still to hand out
	size      int           // how many the last take from Redis brought
	remaining int           // the shared bucket's Remaining right after the take
	resetAt   time.Time     // when the shared bucket is whole again, as of the take
	expires   time.Time     // when what is left goes back
	gen       uint64        // tells a run's expiry timer whether its run is still current
	taking    chan struct{} // while a take for this key is in flight; closed when it is recorded

	// Demand: requests seen in the current runFor period and the one
	// before, and when the last one came.
	period           time.Time
	inPeriod, before int
	last             time.Time
}

func newRuns(giveBack, takeAhead func(key string, rate, n int), now func() time.Time) *runs {
	r := &runs{seed: maphash.MakeSeed(), giveBack: giveBack, takeAhead: takeAhead, now: now}
	for i := range r.shards {
		r.shards[i].keys = make(map[string]*keyRun)
	}
	return r
}

func (r *runs) shard(key string) *runShard {
	return &r.shards[maphash.String(r.seed, key)%memShards]
}

// next serves one request of key from its run if it can; then n > 0 asks
// the caller to take the next run of n ahead, in the background, starting
// after (aheadDelay), and to report it with takenAhead. Otherwise, when a take for the busy key is in
// flight, it returns wait, closed once that take is recorded: the caller
// waits, then calls next again with again set (the request is counted in
// the key's demand once). Otherwise it returns how many requests the caller
// should take from Redis for its own: 1, or a run of n > 1, which the
// caller must then report with taken.
func (r *runs) next(key string, rate int, again bool, now time.Time) (d Decision, served bool, n int, after time.Duration, wait <-chan struct{}) {
	sh := r.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.sweepLocked(now)
	k := sh.keys[key]
	if k == nil {
		k = &keyRun{period: now}
		sh.keys[key] = k
	}
	k.age(now)
	if !again {
		k.inPeriod++
		k.last = now
	}
	n = k.runSize(rate)
	// A run serves until its expiry timer has given back what is left
	// (expire sets left to 0), even a little past runFor when a busy
	// process runs the timer late: its requests were admitted when it was
	// taken, and a request that found it expired would ask Redis on its
	// own path.
	if k.left > 0 && k.rate == rate {
		k.left--
		d = Decision{Allowed: true, Limit: rate, Remaining: k.remaining + k.left, ResetAfter: max(k.resetAt.Sub(now), 0)}
		if k.left > k.size/2 || n <= 1 || k.taking != nil {
			return d, true, 0, 0, nil
		}
		k.startTake()
		return d, true, n, aheadDelay(now.Sub(k.expires.Add(-runFor))), nil
	}
	switch {
	case k.taking != nil && k.size > 1:
		// Not when the last take brought one request or none (the key is
		// at its limit): its requests would be refused one after another.
		return Decision{}, false, 0, 0, k.taking
	case n <= 1 || k.taking != nil:
		return Decision{}, false, 1, 0, nil
	}
	k.startTake()
	return Decision{}, false, n, 0, nil
}

// aheadDelay is how long a take ahead waits before it starts, given how
// long ago the current run was taken. Started at once, its goroutine runs
// as soon as the request that asked for it waits on its engine, and on a
// gateway with one core holds up that request's answer while it encodes,
// writes and reads its Redis call: for a chat client streaming one answer
// after another, every fourth answer's first byte ~0.1–0.3 ms later
// (BENCHMARKS.md §38). A couple of milliseconds later the answer has
// begun. At most a quarter of the time the run's first half lasted, so that
// a busy key's second half (lasting about as long) still outlasts the wait
// and the round trip.
func aheadDelay(runAge time.Duration) time.Duration {
	return min(maxAheadDelay, runAge/4)
}

// maxAheadDelay bounds aheadDelay.
const maxAheadDelay = 2 * time.Millisecond

// age moves k's demand periods on to now.
func (k *keyRun) age(now time.Time) {
	switch age := now.Sub(k.period); {
	case age >= 2*runFor:
		k.period, k.before, k.inPeriod = now, 0, 0
	case age >= runFor:
		k.period, k.before, k.inPeriod = now, k.inPeriod, 0
	}
}

// runSize is how many requests k's next run takes under rate: what the
// key sent in the last period or the current one, within the bounds.
func (k *keyRun) runSize(rate int) int {
	return min(max(k.before, k.inPeriod), rate/runShare, maxRun)
}

// startTake marks a take of a run in flight. Called with the shard locked.
func (k *keyRun) startTake() {
	k.taking = make(chan struct{})
}

// endTake marks the take recorded and wakes the requests that waited for
// it. Called with the shard locked.
func (k *keyRun) endTake() {
	if k.taking != nil {
		close(k.taking)
		k.taking = nil
	}
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
	k.endTake()
	d := decision(res, rate)
	if shared {
		k.size = res.allowed
	}
	if !shared || res.allowed <= 1 {
		sh.mu.Unlock()
		return d
	}
	r.startLocked(key, k, rate, res, res.allowed-1, false, now)
	d.Remaining = res.remaining + res.allowed - 1
	return d
}

// takenAhead records the answer to a take of the next run that next asked
// for: what it admitted joins what is left of the current run. ok tells
// that Redis answered.
func (r *runs) takenAhead(key string, rate int, res result, ok bool, now time.Time) {
	sh := r.shard(key)
	sh.mu.Lock()
	k := sh.keys[key]
	if k == nil {
		k = &keyRun{period: now}
		sh.keys[key] = k
	}
	k.endTake()
	if ok {
		k.size = res.allowed
	}
	if !ok || res.allowed == 0 {
		sh.mu.Unlock()
		return
	}
	r.startLocked(key, k, rate, res, res.allowed, true, now)
}

// startLocked makes n requests admitted by res key's run, runFor from now,
// with what is left of the current run when join is true and it is still
// good, and unlocks the shard. What is left of a run it replaces (its
// limit changed, or it ended and its timer has not run yet) goes back now;
// the timer finds a newer run and does nothing.
func (r *runs) startLocked(key string, k *keyRun, rate int, res result, n int, join bool, now time.Time) {
	sh := r.shard(key)
	oldLeft, oldRate := k.left, k.rate
	if join && k.rate == rate && now.Before(k.expires) {
		n += k.left
		oldLeft = 0
	}
	k.gen++
	k.rate, k.left, k.size, k.remaining = rate, n, res.allowed, res.remaining
	k.resetAt, k.expires = now.Add(res.resetAfter), now.Add(runFor)
	gen := k.gen
	sh.mu.Unlock()
	if oldLeft > 0 {
		r.giveBack(key, oldRate, oldLeft)
	}
	time.AfterFunc(runFor, func() { r.expire(key, gen) })
}

// expire gives back what is left of key's run gen, if it is still current,
// and takes the next run of a key still sending.
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
	now := r.now()
	k.age(now)
	next := 0
	if size := k.runSize(rate); size > 1 && k.taking == nil && now.Sub(k.last) < runFor {
		next = size
		k.startTake()
	}
	sh.mu.Unlock()
	r.giveBack(key, rate, n)
	if next > 0 {
		r.takeAhead(key, rate, next)
	}
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
		if k.left == 0 && k.taking == nil && now.Sub(k.period) > sweepEvery {
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
