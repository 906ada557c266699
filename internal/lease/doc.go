// Package lease makes each backend's max_concurrency a limit for the whole
// deployment rather than for each replica: with Redis configured, a slot on
// a backend is a lease kept in Redis, taken and given back atomically by Lua
// scripts, and shared by every gateway replica.
//
// # Why leases
//
// A counter (INCR on admission, DECR on completion) leaks a slot for ever
// whenever a replica dies between the two. A lease instead carries an
// expiry that its holder keeps pushing forward; when a replica dies, its
// leases lapse within TTL and the slots come back on their own. Renewal is
// per replica, not per request: one script every TTL/3 extends everything
// the replica holds, so a request costs one EVALSHA to acquire and at most
// one to release, whatever its length, and nothing per token.
//
// A release given with ReleaseSoon usually costs no call of its own: the
// lease stops being renewed at once and its release is queued; the
// replica's next acquire carries the queued releases in its script, ahead
// of its own choice (so a waiter on this replica can take the slot just
// freed), and when no acquire comes within 2 ms the store sends them, all
// in one call. Until then the slot looks taken to the other replicas,
// which is why that wait is short and fixed.
//
// # Cross-replica FIFO
//
// Each replica queues waiting requests locally (package admission). To stop
// a newcomer on one replica from taking a freed slot while an older request
// waits on another, every local queue that is waiting for a backend leaves
// a wait entry on it: the arrival time of its oldest request. A slot counts
// as free for a request only if it is not owed to an older queue:
//
//	free = Max − live leases − (live wait entries of other queues with an older arrival)
//
// Each queue is owed at most one slot at a time (its head); when the head is
// served, its entry moves to the next request's arrival. When a slot is
// freed and someone waits, the releasing script publishes the backend's name
// on the release channel, to which every store subscribes (package redissub
// keeps the subscription alive), and every replica's Options.OnReleased
// retries its queues at once; the oldest head wins because the others still
// see it ahead of them. The order is approximate, and the unfairness
// bounded: arrivals come from each replica's wall clock, so the order
// across replicas is only as good as the clocks agree (NTP assumed;
// arrivals are compared in milliseconds), and a burst of several freed
// slots can go to newer heads of other queues while the older queue re-asks
// for its second request.
//
// # Redis data layout
//
// Every name starts with Options.Prefix (P below):
//
//	P lease:<backend>          sorted set: member "<replica>|<nonce>|<n>", score = expiry (ms, Redis clock)
//	P lease-wait:<backend>     sorted set: member "<replica>/<queue>", score = arrival of the queue's head (ms, replica clock)
//	P lease-waitexp:<backend>  sorted set: same members, score = expiry of the wait entry (ms, Redis clock)
//	P lease-replicas           sorted set: member = replica, score = expiry of its liveness (ms, Redis clock)
//	P lease-fence              string: until when (ms, Redis clock) nothing is granted (Adopt)
//	P lease-released           pub/sub channel: payload = backend name (a slot freed that someone waits for)
//
// Every script reads the time with Redis TIME, so replica clock skew cannot
// shorten or lengthen a lease; only arrivals (an ordering, not a duration)
// come from the replicas. Scripts remove the expired members they meet, and
// each write pushes the key's own expiry to at least 2×TTL ahead, so the
// keys of a backend removed from the configuration disappear by themselves.
// The nonce in lease members keeps a restarted replica that reuses its id
// from colliding with leases its previous process left behind.
//
// The scripts:
//
//   - acquire: first release the leases ReleaseSoon queued (as release
//     does); then, for each candidate, drop expired leases and wait
//     entries, compute free as above and, among candidates with free > 0,
//     pick the least loaded relative to Max×Weight, ties broken by a random
//     number from Go weighted by Weight. On a grant it adds the lease and
//     moves the queue's wait entry on every candidate to the next request's
//     arrival (or removes it); on a refusal it sets the entry to this
//     request's arrival.
//   - release: for each lease, ZREM it and, if anyone waits on the
//     backend, PUBLISH its name. An uncontended deployment sends no
//     pub/sub traffic at all: the channel carries only what someone waits
//     for.
//   - renew (every TTL/3, one call for all backends): refresh the replica's
//     liveness and count the live replicas, then extend the leases and wait
//     entries this store holds; a lease found gone (it expired while the
//     replica could not renew it, or Redis lost its data) is added again,
//     since its request still runs and Redis must count it (a wait entry
//     found gone is not); and ZREM leases whose acquire or release failed
//     half-way.
//   - acquire answers its first grant again when sent again after a lost
//     reply (its lease member is already there), and grants nothing while
//     the fence stands.
//   - adopt: add leases whatever a backend holds, for slots a replica
//     handed out while Redis was unreachable, and raise the fence (P
//     lease-fence, a key with an expiry) so that the other replicas adopt
//     theirs before anything more is granted.
//   - clear, leave and count: remove wait entries; remove everything the
//     replica holds (Close); count live leases.
//
// Whenever a script frees capacity that someone waits for (expired leases
// or wait entries removed, a queue's entry dropped or moved later), it
// publishes the backend's name as release does.
//
// # Files
//
// store.go holds the types, Start and Close; acquire.go, Acquire and
// ClearWait; release.go, Release, ReleaseSoon and the flusher that sends
// queued releases; renew.go, the renewal loop and its housekeeping
// (leases found gone, orphans: leases whose acquire or release got no
// answer); scripts.go, the Lua.
//
// # Limitations
//
// Redis Cluster is not supported: the scripts touch the keys of several
// backends at once and the key names carry no hash tags. Pub/sub delivers at
// most once (a replica reconnecting misses what was published meanwhile), and
// a lease that lapses because its holder died publishes nothing until some
// script meets it, so callers must also retry waiting queues on a timer. A
// replica cut off from Redis for longer than TTL loses its leases while its
// requests still run; others may then use those slots, so the backend can
// be over its limit until those requests end (its next renewal counts them
// again, so that nothing more is granted on top of them).
package lease
