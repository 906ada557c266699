package main

import (
	"context"
	"fmt"
	"os/exec"
	"sync"
	"time"
)

// fault is one fault the soak injects, held for a while then cleared.
type fault struct {
	name, what string
	inject     func(c *cluster, hold time.Duration) error // returns once the fault is in place (or, for an instant one, over)
	clear      func(c *cluster) error
}

var allFaults = []fault{
	{name: "pg_restart", what: "PostgreSQL restarted: every connection cut, the address answers again at once",
		inject: func(c *cluster, _ time.Duration) error { c.pgProxy.Restart(); return nil },
		clear:  func(*cluster) error { return nil }},
	{name: "pg_down", what: "PostgreSQL down (connections cut and refused) for the hold",
		inject: func(c *cluster, _ time.Duration) error { c.pgProxy.Down(); return nil },
		clear:  func(c *cluster) error { c.pgProxy.Up(); return nil }},
	{name: "redis_restart", what: "the private redis-server stopped, down 3 s, started empty on the same port",
		inject: func(c *cluster, _ time.Duration) error { return c.restartRedis(3 * time.Second) },
		clear:  func(*cluster) error { return nil }},
	{name: "redis_down", what: "Redis down (connections cut and refused) for the hold",
		inject: func(c *cluster, _ time.Duration) error { c.redisProxy.Down(); return nil },
		clear:  func(c *cluster) error { c.redisProxy.Up(); return nil }},
	{name: "redis_blackhole", what: "Redis silent: connections open, nothing answered, for the hold",
		inject: func(c *cluster, _ time.Duration) error { c.redisProxy.Blackhole(0); return nil },
		clear:  func(c *cluster) error { c.redisProxy.Clear(); return nil }},
	{name: "redis_slow", what: "Redis 200 ms slower each way for the hold",
		inject: func(c *cluster, _ time.Duration) error { c.redisProxy.Latency(200, 0); return nil },
		clear:  func(c *cluster) error { c.redisProxy.Clear(); return nil }},
	{name: "redis_lossy", what: "Redis resets (RST) 30 % of connections once data arrives, for the hold",
		inject: func(c *cluster, _ time.Duration) error { c.redisProxy.ResetPeer(0.3, 0); return nil },
		clear:  func(c *cluster) error { c.redisProxy.Clear(); return nil }},
	{name: "engine_stall", what: "the engine's path silent (streams stall mid-answer) for the hold",
		inject: func(c *cluster, _ time.Duration) error { c.engineProxy.Blackhole(0); return nil },
		clear:  func(c *cluster) error { c.engineProxy.Clear(); return nil }},
	{name: "engine_reset", what: "the engine resets half its connections 500 ms into them (mid-stream), for the hold",
		inject: func(c *cluster, _ time.Duration) error { c.engineProxy.ResetPeer(0.5, 500); return nil },
		clear:  func(c *cluster) error { c.engineProxy.Clear(); return nil }},
	{name: "link_cut", what: "the engine link (`moonji engine`'s WebSocket) cut and refused for the hold",
		inject: func(c *cluster, _ time.Duration) error { c.linkProxy.Down(); return nil },
		clear:  func(c *cluster) error { c.linkProxy.Up(); return nil }},
}

// hookFault is a fault of the caller's own: `CMD start` then `CMD stop`
// (e.g. the idle-timeout nginx in front, with --front).
func hookFault(cmd string) fault {
	var c *cluster
	run := func(arg string) error {
		x := exec.Command("sh", "-c", cmd+" "+arg)
		x.Env = c.frontEnv()
		out, err := x.CombinedOutput()
		if err != nil {
			return fmt.Errorf("hook %q %s: %w: %s", cmd, arg, err, out)
		}
		return nil
	}
	return fault{name: "hook", what: "the --fault-hook command: `" + cmd + " start`, then `stop`",
		inject: func(cl *cluster, _ time.Duration) error { c = cl; return run("start") },
		clear:  func(*cluster) error { return run("stop") }}
}

// injection is one fault as it happened.
type injection struct {
	Name    string    `json:"name"`
	What    string    `json:"what"`
	From    time.Time `json:"from"`
	To      time.Time `json:"to"`
	Error   string    `json:"error,omitempty"`
	Offsetf float64   `json:"from_s"`
	Offsett float64   `json:"to_s"`
}

// injector runs the faults in turn over the fault phase: each gets an equal
// slot, is held for half of it (at most maxHold), and the rest of the slot
// is recovery under traffic.
type injector struct {
	c       *cluster
	faults  []fault
	maxHold time.Duration
	start   time.Time // of the run, for offsets

	mu   sync.Mutex
	now  string
	done []injection
}

func (in *injector) current() string {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.now
}

func (in *injector) set(name string) {
	in.mu.Lock()
	in.now = name
	in.mu.Unlock()
}

func (in *injector) run(ctx context.Context, phase time.Duration) {
	if len(in.faults) == 0 {
		return
	}
	slot := phase / time.Duration(len(in.faults))
	hold := min(slot/2, in.maxHold)
	for _, f := range in.faults {
		slotEnd := time.Now().Add(slot)
		inj := injection{Name: f.name, What: f.what, From: time.Now()}
		in.c.log.Info("fault", "name", f.name, "hold", hold)
		in.set(f.name)
		if err := f.inject(in.c, hold); err != nil {
			inj.Error = err.Error()
			in.c.log.Error("inject", "fault", f.name, "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(hold):
		}
		if err := f.clear(in.c); err != nil {
			inj.Error += " clear: " + err.Error()
			in.c.log.Error("clear", "fault", f.name, "err", err)
		}
		inj.To = time.Now()
		inj.Offsetf, inj.Offsett = inj.From.Sub(in.start).Seconds(), inj.To.Sub(in.start).Seconds()
		in.set("")
		in.mu.Lock()
		in.done = append(in.done, inj)
		in.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(slotEnd)):
		}
	}
}

// healAll puts every path back, whatever the schedule reached.
func (c *cluster) healAll() {
	c.pgProxy.Up()
	c.redisProxy.Up()
	c.engineProxy.Up()
	c.linkProxy.Up()
	c.pgProxy.Clear()
	c.redisProxy.Clear()
	c.engineProxy.Clear()
	c.linkProxy.Clear()
	if !c.redis.alive() {
		_ = c.startRedis()
	}
}
