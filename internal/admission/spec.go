package admission

import (
	"context"
	"log/slog"
	"time"

	"moonji/internal/lease"
)

// BackendSpec is one backend a Scheduler hands slots of.
type BackendSpec struct {
	Name string
	// MaxConcurrency is how many requests it serves at once; values below 1
	// are treated as 1. With a Shared limit it is the limit of the whole
	// deployment, not of this replica.
	MaxConcurrency int
	// Weight scales its share of the traffic for uneven hardware (default
	// 1): the least loaded backend is the one with the fewest requests in
	// flight relative to MaxConcurrency×Weight, and ties go to one at random
	// in proportion to Weight.
	Weight float64
	// Up, when set, tells whether the backend takes traffic now (a
	// health.Checker's Up). A backend that is down gets no new request
	// while another backend of the same pool is up; when every backend of a
	// pool is down they all take requests again, because refusing every
	// request of the model is worse than trying (nginx and Envoy do the
	// same).
	Up func() bool
}

// PoolSpec is one queue: the requests of the models served by the same set
// of backends wait in it, oldest first, for a slot on any of them.
type PoolSpec struct {
	Name     string
	Backends []string
	// MaxQueue is how many requests may wait; 0 means none.
	MaxQueue int
	// QueueTimeout bounds the time spent queued; 0 means until the
	// caller's context ends.
	QueueTimeout time.Duration
}

// Shared is a concurrency limit kept outside this process, so that several
// replicas together never exceed a backend's MaxConcurrency (lease.Store
// over Redis). Every call may fail while its store is unreachable; the
// Scheduler then serves from a per-replica share of each limit.
type Shared interface {
	Acquire(ctx context.Context, req lease.Request) (int, lease.Lease, error)
	// ReleaseSoon gives a lease back without blocking; failures are the
	// store's to handle (a lease not given back lapses).
	ReleaseSoon(l lease.Lease)
	ClearWait(ctx context.Context, queue string, backends []string) error
	// LiveReplicas is the number of replicas sharing the limits, as last
	// seen, for the per-replica share while the store is unreachable.
	LiveReplicas() int
	// Ping tells whether the store answers again.
	Ping(ctx context.Context) error
	// Adopt takes leases for slots handed out while the store was
	// unreachable (counts per backend), granted whatever is held already,
	// and holds back every replica's grants for fence.
	Adopt(ctx context.Context, counts map[string]int, fence time.Duration) (map[string][]lease.Lease, error)
}

// Config configures a Scheduler.
type Config struct {
	Backends []BackendSpec
	Pools    []PoolSpec
	// Shared, when set, makes each MaxConcurrency a limit for every replica
	// together; call Start so that waiting requests are served.
	Shared Shared
	// OnChange, when set, is called with a backend's new counts after every
	// change of its in-flight or queued requests (queued: the requests of
	// every pool it serves). It runs under the scheduler's lock, which keeps
	// the calls in the order of the changes; it must be fast and must not
	// call back into the Scheduler.
	OnChange func(backend string, inFlight, queued int)
	// OnDegraded, when set, is called when the Shared limit becomes
	// unreachable (true) and when it answers again (false).
	OnDegraded func(degraded bool)
	Log        *slog.Logger
}

// Timing of the shared path. sharedCallTimeout bounds one call to the
// shared store (and the ping that confirms a failure), so that a store that
// hangs costs a request at most twice that before the per-replica share
// takes over; it is long enough that a loaded machine's pauses are not
// taken for an outage. pollEvery is how often a replica
// with waiting requests asks again without being told that a slot was freed:
// a notification can be lost, and a dead replica's leases expire without
// one. recoverEvery is how often a degraded scheduler checks the store.
// adoptFence is how long the store grants nothing after a replica comes
// back from its share: every other replica that served its share meanwhile
// finds the store again within recoverEvery and a call, and adopts its
// slots (takes leases for them) before anything is granted on top.
const (
	sharedCallTimeout = time.Second
	pollEvery         = 200 * time.Millisecond
	recoverEvery      = time.Second
	adoptFence        = 2*recoverEvery + sharedCallTimeout
	// downPings is how many pings in a row must fail after a failed call
	// before the store counts as unreachable: a store slow enough to miss
	// one ping is still the others' limit.
	downPings = 3
)
