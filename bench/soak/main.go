// Command soak runs issue 46's soak: three gateway replicas (bin/moonji
// serve) sharing PostgreSQL and Redis, mixed traffic (the chat page's
// answers, /v1 streams and whole answers, stops, client aborts) while each
// fault is injected in turn — PostgreSQL restarted and down; Redis
// restarted, down, silent, slow and lossy; the engine stalling and
// resetting mid-stream; the engine link cut — then the invariants: one
// usage row per id a client saw, its outcome as the client saw it, no row
// left pending, in-flight and queued gauges at 0, RSS and goroutines flat
// (≤ 10 %) from the idle state after warm-up to the idle state at the end.
//
//	soak [-duration 3m] [-workers 16] [-out DIR] [-faults pg_down,redis_slow,…]
//	     [-front-cmd CMD] [-fault-hook CMD]
//
// The machine's PostgreSQL and Redis are never stopped: PostgreSQL is
// reached through a fault proxy (a schema of the run's own, dropped at the
// end), Redis is a private redis-server (restarted for real) behind another.
// -front-cmd starts something in front of the replicas (an nginx with idle
// timeouts) told their addresses in SOAK_REPLICAS; the first line it prints
// is the base URLs the clients then use. -fault-hook adds a fault of the
// caller's own (`CMD start`, then `CMD stop`, with SOAK_REPLICAS too). It writes report.md, report.svg
// and summary.json to -out and exits 1 when an invariant is broken.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func run() error {
	defDur, err := time.ParseDuration(envOr("SOAK_DURATION", "3m"))
	if err != nil {
		return fmt.Errorf("SOAK_DURATION: %w", err)
	}
	duration := flag.Duration("duration", defDur, "the whole run's traffic (SOAK_DURATION)")
	warmup := flag.Duration("warmup", 0, "traffic before the first fault (default 10 % of -duration, 20 s to 3 m)")
	workers := flag.Int("workers", 16, "clients sending at once")
	replicas := flag.Int("replicas", 3, "gateway replicas")
	bin := flag.String("bin", "bin/moonji", "the moonji binary")
	out := flag.String("out", "", "directory for logs and reports (default a new temporary one)")
	pg := flag.String("pg", envOr("MOONJI_TEST_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
		"the PostgreSQL to make a schema in (never stopped: a fault proxy goes in front)")
	only := flag.String("faults", "", "comma-separated faults to inject (default all)")
	maxHold := flag.Duration("max-hold", 60*time.Second, "longest a fault is held")
	every := flag.Duration("sample", 0, "how often RSS and goroutines are sampled (default duration/60, at least 2 s)")
	front := flag.String("front-cmd", "", "a command run for the whole soak in front of the replicas (SOAK_REPLICAS: their addresses); its first line of output: the base URLs clients use")
	hook := flag.String("fault-hook", "", "a command run with `start` and `stop` as one more fault")
	keep := flag.Bool("keep", false, "keep the PostgreSQL schema for a look")
	maxRSS := flag.Float64("max-rss-growth", maxGrowth, "largest RSS growth from idle after warm-up to idle at the end (0.10: the issue's bound, for a long run)")
	flag.Parse()

	if *warmup == 0 {
		*warmup = min(max(*duration/10, 20*time.Second), 3*time.Minute)
	}
	if *every == 0 {
		*every = max(*duration/60, 2*time.Second)
	}
	if *out == "" {
		if *out, err = os.MkdirTemp("", "moonji-soak-"); err != nil {
			return err
		}
	}
	if *out, err = filepath.Abs(*out); err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	absBin, err := filepath.Abs(*bin)
	if err != nil {
		return err
	}
	faults, err := selectFaults(*only, *hook)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	log.Info("soak", "duration", *duration, "warmup", *warmup, "workers", *workers, "out", *out)

	c := &cluster{dir: *out, bin: absBin, log: log, pgAdmin: *pg}
	defer c.stop(*keep)
	ctx := context.Background()
	if err := c.start(ctx, *replicas); err != nil {
		return fmt.Errorf("start the cluster (logs in %s): %w", *out, err)
	}
	start := time.Now()
	mon := &monitor{c: c, start: start}
	in := &injector{c: c, faults: faults, maxHold: *maxHold, start: start}
	tr := &traffic{c: c, fault: in.current,
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, ResponseHeaderTimeout: 90 * time.Second}}}
	for _, r := range c.replicas {
		tr.bases = append(tr.bases, r.base())
	}
	if *front != "" {
		if tr.bases, err = c.startFront(*front); err != nil {
			return err
		}
	}
	monCtx, monStop := context.WithCancel(ctx)
	monDone := make(chan struct{})
	go func() { mon.run(monCtx, *every); close(monDone) }()

	// Warm-up, then a pause to read every replica's idle state: the baseline.
	trCtx, trStop := context.WithTimeout(ctx, *warmup)
	tr.run(trCtx, *workers)
	trStop()
	before, err := mon.idle(60 * time.Second)
	if err != nil {
		log.Warn("after warm-up", "err", err)
	}
	log.Info("baseline", "samples", before)

	// The faults in turn, under traffic.
	phase := *duration - *warmup
	trCtx, trStop = context.WithTimeout(ctx, phase)
	trDone := make(chan struct{})
	go func() { tr.run(trCtx, *workers); close(trDone) }()
	in.run(trCtx, phase)
	<-trDone
	trStop()
	c.healAll()

	// Quiescence: gauges at 0, every row written.
	after, idleErr := mon.idle(3 * time.Minute)
	monStop()
	<-monDone
	var vs []violation
	if idleErr != nil {
		vs = append(vs, violation{"gauges back to 0", idleErr.Error()})
	}
	for _, r := range c.replicas {
		if !r.proc.alive() {
			vs = append(vs, violation{"every replica alive", fmt.Sprintf("replica %d exited (log %s/replica%d.log)", r.n, *out, r.n)})
		}
	}
	db, err := openDirect(c.pgDirect)
	if err != nil {
		return fmt.Errorf("open the ledger: %w", err)
	}
	defer closeDB(db)
	recs := tr.records
	rows := settle(db, recs, 90*time.Second)
	lc, lv := checkLedger(recs, rows)
	vs = append(vs, lv...)
	gs, gv := checkGrowth(before, after, *maxRSS)
	vs = append(vs, gv...)

	kinds := map[string]int{}
	for _, r := range recs {
		kinds[r.Kind+" "+r.Saw]++
	}
	s := summary{Commit: commit(), Started: start, Duration: duration.String(), Warmup: warmup.String(), Replicas: *replicas,
		Workers: *workers, Requests: len(recs), Kinds: kinds, Faults: in.done, Ledger: lc, GaugesIdle: idleErr == nil,
		Growth: gs, LogErrors: logErrors(*out, *replicas), Violations: vs, Samples: mon.samples(), Pass: len(vs) == 0}
	if err := writeJSON(filepath.Join(*out, "summary.json"), s); err != nil {
		return err
	}
	if err := writeSVG(filepath.Join(*out, "report.svg"), s); err != nil {
		return err
	}
	if err := writeMarkdown(filepath.Join(*out, "report.md"), "report.svg", s); err != nil {
		return err
	}
	if err := writeRecords(filepath.Join(*out, "requests.jsonl"), recs); err != nil {
		return err
	}
	md, _ := os.ReadFile(filepath.Join(*out, "report.md"))
	fmt.Println(string(md))
	fmt.Println("reports and logs:", *out)
	if !s.Pass {
		c.stop(*keep)
		os.Exit(1)
	}
	return nil
}

func selectFaults(only, hook string) ([]fault, error) {
	fs := allFaults
	if only != "" {
		fs = nil
		for name := range strings.SplitSeq(only, ",") {
			found := false
			for _, f := range allFaults {
				if f.name == strings.TrimSpace(name) {
					fs, found = append(fs, f), true
				}
			}
			if !found && strings.TrimSpace(name) != "" {
				return nil, fmt.Errorf("-faults: unknown fault %q", name)
			}
		}
	}
	if hook != "" {
		fs = append(fs, hookFault(hook))
	}
	return fs, nil
}

func writeRecords(path string, recs []record) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, r := range recs {
		b, _ := json.Marshal(r)
		f.Write(append(b, '\n'))
	}
	return nil
}

func commit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}
