// Package retention deletes what is older than the operator keeps
// (config retention): usage rows, conversations and, pruned by the usage
// age too, whatever else registers (the audit log). It runs in every
// replica, a minute after start and then hourly; its deletes are
// idempotent, so replicas running it at once only share the work.
//
// It deletes in small batches chosen through an index on the rows' age,
// with a pause between batches, so that a lock is held for one batch at a
// time and the ledger's writer is never starved. The pause grows with what
// the batch cost (as pt-archiver's --sleep-coef does), so that a run takes
// at most a share of one core and of the database's write lock however
// slow the machine or large the rows: the requests served meanwhile keep
// their latency, and a first run over a year of rows simply takes longer.
// On SQLite it then gives the freed pages back to the file system a little
// at a time (incremental vacuum), paced the same way. The rollups the
// dashboards and budgets read are never touched.
package retention

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gorm.io/gorm"

	"moonji/models"
)

// Prune deletes at most limit rows (or conversations) older than before
// and returns how many it deleted: 0 when none is left.
type Prune func(ctx context.Context, db *gorm.DB, before time.Time, limit int) (int64, error)

// Table is one kind of rows retention deletes.
type Table struct {
	// Name labels its metric and its log lines.
	Name  string
	Prune Prune
	// Batch bounds one Prune (0: the job's Batch).
	Batch int
}

// Names of the built-in tables.
const (
	TableUsage         = "usage"
	TableConversations = "conversations"
)

// Defaults of a Job's knobs.
const (
	// DefaultBatch: deleting 500 ledger rows (and their index entries)
	// takes ~15 ms on SQLite, in which the pure-Go SQLite holds a core and
	// the write lock; measured at 10 million rows under 500 req/s, smaller
	// slices of work hurt the requests served beside them less than large
	// ones, and 500 keeps the per-statement overhead small (BENCHMARKS.md,
	// Retention at scale).
	DefaultBatch = 500
	// DefaultConversationBatch: a conversation takes its messages and
	// attachments with it.
	DefaultConversationBatch = 50
	// DefaultPause is the least pause between batches.
	DefaultPause = 10 * time.Millisecond
	// DefaultShare: a run works at most a twentieth of the time; after a
	// batch that took d it pauses 19d. On a loaded 2-core machine a share
	// of 0.1 raised the p99 of the requests served meanwhile 1.8×, 0.05
	// 1.2–1.3×. A backlog of millions of rows takes hours; an hour's rows,
	// minutes.
	DefaultShare = 0.05
	DefaultEvery = time.Hour
	DefaultDelay = time.Minute
	// DefaultVacuumPages is one step of SQLite's incremental vacuum: 32
	// pages of 4 KiB, ~12 ms at the 0.38 ms a page measured on a 3 GB
	// database (each page moved rewrites its parent's pointer), about a
	// delete batch's time, paced by the same share.
	DefaultVacuumPages = 32
)

// Job prunes periodically. The zero values of its knobs take the defaults.
type Job struct {
	DB *gorm.DB
	// Usage and Conversations are the ages kept; 0 keeps forever.
	Usage, Conversations time.Duration
	// WithUsage are more tables pruned at the usage age (the audit log
	// registers here).
	WithUsage []Table

	Batch, ConversationBatch int
	Pause, Every, Delay      time.Duration
	// Share is the most of its time a run spends in the database (0:
	// DefaultShare, 1: only Pause between batches).
	Share       float64
	VacuumPages int
	// Deleted counts deleted rows by table (may be nil).
	Deleted *prometheus.CounterVec
	Log     *slog.Logger
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// Result is what one run did.
type Result struct {
	Deleted    map[string]int64
	Batches    map[string]int
	FreePages  int64 // SQLite pages still free after the vacuum
	Took       time.Duration
	VacuumTook time.Duration
	// Busy is the time spent in the database's statements: Took less the
	// pauses.
	Busy time.Duration
}

// Enabled reports whether the job has anything to delete.
func (j *Job) Enabled() bool { return j.Usage > 0 || j.Conversations > 0 }

// Run runs the job after Delay and then every Every, until ctx ends.
func (j *Job) Run(ctx context.Context) {
	if !j.Enabled() {
		return
	}
	wait := orDefault(j.Delay, DefaultDelay)
	for {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		if _, err := j.RunOnce(ctx); err != nil && ctx.Err() == nil {
			j.log().Warn("retention run", "err", err)
		}
		wait = orDefault(j.Every, DefaultEvery)
	}
}

// RunOnce deletes everything older than the ages kept, batch by batch,
// then vacuums. It stops at the first error, or when ctx ends (returning
// ctx's error); a later run carries on.
func (j *Job) RunOnce(ctx context.Context) (Result, error) {
	res := Result{Deleted: map[string]int64{}, Batches: map[string]int{}}
	began := time.Now()
	now := j.now().UTC()
	var errs []error
	if j.Usage > 0 {
		// A whole UTC day: the rollups' daily buckets before it are no
		// longer in the ledger, those after it wholly are.
		cutoff := now.Add(-j.Usage).Truncate(models.Day)
		if err := models.MarkUsageKept(ctx, j.DB, cutoff); err != nil {
			return res, err
		}
		tables := append([]Table{{Name: TableUsage, Prune: models.UsagePruner()}}, j.WithUsage...)
		for _, t := range tables {
			if err := j.prune(ctx, t, cutoff, &res); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if j.Conversations > 0 && ctx.Err() == nil {
		t := Table{Name: TableConversations, Prune: models.PruneConversations, Batch: orDefault(j.ConversationBatch, DefaultConversationBatch)}
		if err := j.prune(ctx, t, now.Add(-j.Conversations), &res); err != nil {
			errs = append(errs, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return res, err
	}
	var total int64
	for _, n := range res.Deleted {
		total += n
	}
	// Even when this run deleted nothing: an earlier one may have been
	// interrupted (a restart, a deploy) between its last delete and its
	// vacuum.
	vacuumed := time.Now()
	free, err := j.vacuum(ctx, &res)
	res.FreePages, res.VacuumTook = free, time.Since(vacuumed)
	if err != nil {
		errs = append(errs, err)
	}
	res.Took = time.Since(began)
	if total > 0 || len(errs) > 0 {
		j.log().Info("retention run", "deleted", res.Deleted, "batches", res.Batches, "took", res.Took.Round(time.Millisecond), "busy", res.Busy.Round(time.Millisecond),
			"vacuum", res.VacuumTook.Round(time.Millisecond), "free_pages", res.FreePages)
	}
	return res, errors.Join(errs...)
}

// prune runs t's batches until one comes back short.
func (j *Job) prune(ctx context.Context, t Table, before time.Time, res *Result) error {
	limit := orDefault(t.Batch, orDefault(j.Batch, DefaultBatch))
	for {
		began := time.Now()
		n, err := t.Prune(ctx, j.DB, before, limit)
		took := time.Since(began)
		res.Busy += took
		if n > 0 {
			res.Deleted[t.Name] += n
			res.Batches[t.Name]++
			if j.Deleted != nil {
				j.Deleted.WithLabelValues(t.Name).Add(float64(n))
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("retention of %s: %w", t.Name, err)
		}
		if n < int64(limit) {
			return nil
		}
		if err := j.sleep(ctx, took); err != nil {
			return err
		}
	}
}

// vacuum gives SQLite's free pages back in steps of VacuumPages, pausing
// between them like the deletes (each step holds the write lock).
func (j *Job) vacuum(ctx context.Context, res *Result) (int64, error) {
	pages := orDefault(j.VacuumPages, DefaultVacuumPages)
	for {
		began := time.Now()
		free, err := models.IncrementalVacuum(ctx, j.DB, pages)
		took := time.Since(began)
		res.Busy += took
		if err != nil || free == 0 {
			return free, err
		}
		if err := j.sleep(ctx, took); err != nil {
			return free, err
		}
	}
}

// sleep pauses after a step that took busy: long enough that the run's
// busy time stays within its Share, and at least Pause.
func (j *Job) sleep(ctx context.Context, busy time.Duration) error {
	t := time.NewTimer(j.pauseAfter(busy))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (j *Job) pauseAfter(busy time.Duration) time.Duration {
	pause := orDefault(j.Pause, DefaultPause)
	share := j.Share
	if share <= 0 || share > 1 {
		share = DefaultShare
	}
	return max(pause, time.Duration(float64(busy)*(1-share)/share))
}

func (j *Job) now() time.Time {
	if j.Now != nil {
		return j.Now()
	}
	return time.Now()
}

func (j *Job) log() *slog.Logger {
	if j.Log != nil {
		return j.Log
	}
	return slog.Default()
}

func orDefault[T int | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}
