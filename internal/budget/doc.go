// Package budget accounts spending against budgets — per key, person or
// team, per day, calendar month (UTC) or in total — atomically across
// gateway replicas. Before a request runs, Store.Reserve holds its
// estimated cost against every budget that applies; when it ends,
// Reservation.Settle replaces the estimate with the real cost.
//
// # Why scripts
//
// A request usually answers to three budgets at once (its key's, its
// person's, its team's), and it must fit all of them or take nothing from
// any: a check followed by separate writes would let two replicas both see
// the last unit free. So each window's state lives in Redis and one Lua
// script checks every limit and reserves on all of them, or none, in one
// EVALSHA; another settles in one more. Nothing is cached locally: two
// replicas would each spend the same remainder. Per limit and window the
// keys are (P the store's prefix):
//
//	P budget:<scope>:<id>:<period>:<window start, unix s; 0 for total>:spent  settled cost
//	…:res   hash, reservation id → amount
//	…:dl    sorted set, reservation id → deadline (unix ms)
//	…:rsum  Σ res
//
// A day's or month's keys expire two days after its end, so that late
// settles still land; a total budget's keys live a day from when they were
// built and are then rebuilt from the database. Reservation keys stay
// between requests with an expiry of their own, pushed when it runs low,
// so that a request costs one PTTL of upkeep rather than three PEXPIREs.
// Redis Cluster is not supported: one script touches the keys of several
// budgets.
//
// # Why deadlines
//
// A replica that dies mid-request never settles. Each reservation carries a
// deadline (Reserve's ttl, longer than a request may run), and every
// script that reads a window first purges the reservations past it, so a
// dead replica's holds come back by themselves, with no sweeper and no
// heartbeat. Deadlines come from the replicas' clocks (the now the caller
// passes): skew between them only moves when a lapsed hold is purged. A
// request that outruns its ttl loses its hold early; its settle still adds
// its cost.
//
// # Where spent comes from
//
// The database's ledger is the truth. When a window's spent key is absent
// — its first request, or after Redis lost its data — the script changes
// nothing and says so; the store asks its Spender for the final rows since
// the window's start, writes that with SET NX (another replica may have
// been quicker, and its value is as good) and runs the script again. A
// settle never creates a spent key: the database already has, or will
// have, the row a new one would be built from. A request counts in the
// window it was reserved in, the window its ledger row is dated in; a new
// day or month is simply new keys, built from the database on first use.
//
// The rebuild has a small gap. The ledger commits a request's row within
// ~0.1–0.5 s of its end, so a spent key rebuilt just then can miss the
// rows of requests that ended in that moment (their settle found no key to
// add to), or count twice one whose row was committed before the query but
// whose settle came after the key was written. Both are bounded by what
// finished in that half second, once per window, and the budget is only
// ever that close.
//
// # Failing closed
//
// When Redis does not answer, or the database cannot say what was spent,
// Reserve and Status return an error wrapping ErrUnavailable. The caller
// then refuses requests that have a budget and admits those without: a
// budget is a promise about money, which an outage must not break. A
// settle that fails is logged; its reservation lapses at its deadline and
// its cost is missing from Redis until the window's spent key is rebuilt:
// at the next day or month, and within a day for a total budget.
//
// NewMemory is the same accounting inside one process, for a single
// replica without Redis: exact, under a mutex, rebuilt from the database
// after a restart.
package budget
