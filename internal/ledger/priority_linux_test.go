package ledger

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gorm.io/gorm"

	"moonji/internal/spareproc"
	"moonji/internal/testcpu"
	"moonji/internal/testdb"
	"moonji/models"
)

// TestCommitterRunsAtLowPriority: batches are written by a thread at nice
// 19 and of the SCHED_IDLE policy, so that the kernel runs request threads
// first, and at once — on SQLite, where the statements are Go code in this
// process, and on PostgreSQL, where the driver's side of a batch is.
func TestCommitterRunsAtLowPriority(t *testing.T) {
	testdb.Each(t, func(t *testing.T, dbURL string) {
		before, idleBefore := nicedThreads(t)
		db, err := models.Open(dbURL)
		if err != nil {
			t.Fatal(err)
		}
		l := New(db, nil)
		t.Cleanup(func() { l.Close(); models.Close(db) })
		l.Record(row("low-priority-1"))
		if err := l.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
		if got := get(t, l, "low-priority-1"); got.InferenceID != "low-priority-1" {
			t.Fatalf("row not written: %+v", got)
		}
		after, idleAfter := nicedThreads(t)
		if after <= before {
			t.Fatalf("%d threads at nice 19 with a ledger open, %d before: the committer's thread was not lowered", after, before)
		}
		if idleAfter <= idleBefore {
			t.Fatalf("%d threads of the SCHED_IDLE policy with a ledger open, %d before", idleAfter, idleBefore)
		}
	})
}

// nicedThreads counts this process's threads at nice 19, and those of the
// SCHED_IDLE policy (fields 19 and 41 of /proc/self/task/TID/stat).
func nicedThreads(t *testing.T) (niced, idle int) {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Skip("no /proc:", err)
	}
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + task.Name() + "/stat")
		if err != nil {
			continue // the thread exited
		}
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		if nice, err := strconv.Atoi(fields[16]); err == nil && nice == 19 {
			niced++
		}
		if policy, err := strconv.Atoi(fields[38]); err == nil && policy == unix.SCHED_IDLE {
			idle++
		}
	}
	return niced, idle
}

func TestSlowCommitsObserve(t *testing.T) {
	now := time.Now()
	ms := time.Millisecond
	for _, c := range []struct {
		wall, cpu, waited time.Duration
		starved           bool
	}{
		{10 * ms, 0, 10 * ms, false},        // quick
		{100 * ms, 60 * ms, 90 * ms, false}, // slow, but the process was busy: its own requests came first
		{100 * ms, 20 * ms, 90 * ms, true},  // slow while the process idled, waiting for a CPU: others had it
		{900 * ms, 10 * ms, 880 * ms, true},
		{100 * ms, 20 * ms, 50 * ms, true},   // half the time waiting for a CPU
		{100 * ms, 20 * ms, 10 * ms, false},  // slow, but the thread slept: a slow database
		{900 * ms, 10 * ms, 100 * ms, false}, // (a lock held by another connection)
		{900 * ms, 10 * ms, 900 * ms, true},  // the wait unknown: counted as whole
	} {
		var s slowCommits
		if _, got := s.observe(c.wall, c.cpu, c.waited, now); got != c.starved {
			t.Errorf("observe(%v, %v, %v) = %v, want %v", c.wall, c.cpu, c.waited, got, c.starved)
		}
		if got := s.active(now.Add(slowFor / 2)); got != c.starved {
			t.Errorf("after observe(%v, %v, %v): active = %v, want %v", c.wall, c.cpu, c.waited, got, c.starved)
		}
		if s.active(now.Add(slowFor)) {
			t.Errorf("after observe(%v, %v, %v): still active after %v", c.wall, c.cpu, c.waited, slowFor)
		}
	}
}

// TestSlowCommitsBackOff: a committer starved batch after batch goes
// unused for longer each time (a neighbour that keeps the CPU busy would
// otherwise cost a batch of a second or more every slowFor), and one batch
// written in time resets that.
func TestSlowCommitsBackOff(t *testing.T) {
	var s slowCommits
	now := time.Now()
	starve := func() time.Duration {
		t.Helper()
		d, starved := s.observe(500*time.Millisecond, 0, 500*time.Millisecond, now)
		if !starved {
			t.Fatal("a batch of 500 ms with the process idle was not starved")
		}
		if !s.active(now.Add(d-time.Millisecond)) || s.active(now.Add(d)) {
			t.Fatalf("bypass for %v reported, but active does not end then", d)
		}
		return d
	}
	var got []time.Duration
	for range 8 {
		got = append(got, starve())
	}
	want := []time.Duration{slowFor, 2 * slowFor, 4 * slowFor, 8 * slowFor, 16 * slowFor, slowForMax, slowForMax, slowForMax}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("bypass after each starved batch in a row: %v, want %v", got, want)
	}
	if _, starved := s.observe(time.Millisecond, 0, time.Millisecond, now); starved {
		t.Fatal("a quick batch was starved")
	}
	if d := starve(); d != slowFor {
		t.Fatalf("after a batch written in time, the next starved one bypasses for %v, want %v", d, slowFor)
	}
}

// TestStarvedCommitterIsBypassed: beside a process that keeps the CPU
// busy (here a shell's endless loop on the one CPU the test may use), the
// committer's SCHED_IDLE thread hardly runs; the batch it took long over,
// waiting for the CPU while the gateway itself idled, sends the next
// batches around it, at normal priority.
func TestStarvedCommitterIsBypassed(t *testing.T) {
	if !testcpu.OnOne(t) {
		return
	}
	if openWaitClock() == nil {
		t.Skip("this kernel does not keep a thread's wait for the CPU (/proc/thread-self/schedstat)")
	}
	spareproc.Enable()
	l := open(t)
	ctx := context.Background()
	// Written before the neighbour starts: the database's first writes
	// (its WAL created) are not what this test is about.
	l.Record(row("before-the-neighbour"))
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	busy := exec.Command("sh", "-c", "while :; do :; done")
	if err := busy.Start(); err != nil {
		t.Skip("no shell to keep the CPU busy:", err)
	}
	t.Cleanup(func() { _ = busy.Process.Kill(); _ = busy.Wait() })
	time.Sleep(50 * time.Millisecond) // the loop is running
	// A woken thread may run at once for a slice of its own even at
	// SCHED_IDLE (EEVDF places it by its lag), and a small batch can fit
	// in that: batches of 30 rows, a few slices' work, until one waits.
	var starved bool
	for attempt := 0; attempt < 10 && !starved; attempt++ {
		start := time.Now()
		for i := range 30 {
			l.Record(row(fmt.Sprintf("starved-%d-%d", attempt, i)))
		}
		if err := l.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("a batch of 30 rows beside a busy neighbour took %v", time.Since(start))
		if n := l.slow.bypassed.Load(); n != 0 {
			t.Fatalf("%d batches bypassed the committer before it was ever slow", n)
		}
		// The committer judges the batch as it hands it back; allow for
		// the hand-back.
		for deadline := time.Now().Add(100 * time.Millisecond); !starved && time.Now().Before(deadline); {
			starved = l.slow.active(time.Now())
			time.Sleep(time.Millisecond)
		}
	}
	if !starved {
		t.Fatal("in ten batches beside a busy neighbour, none marked the committer slow")
	}
	l.Record(row("starved-2"))
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if n := l.slow.bypassed.Load(); n != 1 {
		t.Errorf("the batch after a starved one went through the committer (bypassed %d)", n)
	}
	for _, id := range []string{"starved-0-0", "starved-0-29", "starved-2"} {
		if got := get(t, l, id); got.InferenceID != id {
			t.Errorf("row %s not written", id)
		}
	}
}

// TestSlowDatabaseIsNotStarvation: a batch that was slow because it waited
// for the database (here SQLite's write lock, held by another connection
// for 150 ms; a PostgreSQL server far away looks the same) keeps the
// committer in use: its thread slept rather than waited for a CPU, and
// writing at normal priority would be no quicker.
func TestSlowDatabaseIsNotStarvation(t *testing.T) {
	if openWaitClock() == nil {
		t.Skip("this kernel does not keep a thread's wait for the CPU (/proc/thread-self/schedstat)")
	}
	db, err := models.Open("sqlite://" + t.TempDir() + "/l.db")
	if err != nil {
		t.Fatal(err)
	}
	var logs lockedLog // to tell a really starved batch (a busy machine) apart
	l := New(db, slog.New(slog.NewTextHandler(&logs, nil)))
	t.Cleanup(func() { l.Close(); models.Close(db) })
	other, err := l.db.DB()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	conn, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		t.Fatal(err)
	}
	release := time.AfterFunc(150*time.Millisecond, func() { _, _ = conn.ExecContext(ctx, "COMMIT") })
	defer release.Stop()
	start := time.Now()
	l.Record(row("slow-db-1"))
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < slowWall {
		t.Fatalf("the batch took %v: the lock did not hold it up", took)
	}
	l.Record(row("slow-db-2"))
	if err := l.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if n := l.slow.bypassed.Load(); n != 0 || l.slow.active(time.Now()) {
		if got := logs.String(); waitedHalf(got) {
			t.Skipf("the committer's thread also waited for a CPU, taken by other processes (this test's premise does not hold now): %s", got)
		}
		t.Errorf("a batch slowed by the database sent %d batches around the committer", n)
	}
	for _, id := range []string{"slow-db-1", "slow-db-2"} {
		if got := get(t, l, id); got.InferenceID != id {
			t.Errorf("row %s not written", id)
		}
	}
}

// TestSQLiteWorkHasASpareP: in a process confined to one CPU, the
// committer's batches and the checkpoints run on their low-priority thread
// only once the process has a second P for requests (spareproc), lent
// before that thread was woken; the P is given back afterwards.
func TestSQLiteWorkHasASpareP(t *testing.T) {
	if !testcpu.OnOne(t) {
		return
	}
	spareproc.Enable()
	l := open(t)
	type seen struct {
		checkpoint  bool
		procs, nice int
	}
	var mu sync.Mutex
	var statements []seen
	// Wraps the statement's own Lend (models.lendWhileQuerying) to see
	// the process as the statement began.
	raw := l.db.Callback().Raw()
	lend := raw.Get("moonji:lend_proc")
	if lend == nil {
		t.Fatal("no moonji:lend_proc callback on SQLite")
	}
	// (Before("*") again: a replacement without it would sort before the
	// original and lose to it.)
	if err := raw.Before("*").Replace("moonji:lend_proc", func(db *gorm.DB) {
		mu.Lock()
		statements = append(statements, seen{strings.Contains(db.Statement.SQL.String(), "wal_checkpoint"), runtime.GOMAXPROCS(0), threadNice(t)})
		mu.Unlock()
		lend(db)
	}); err != nil {
		t.Fatal(err)
	}
	count := func() (batches, checkpoints int) {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range statements {
			switch {
			case s.nice != 19:
			case s.checkpoint:
				checkpoints++
			default:
				batches++
			}
		}
		return
	}
	for i := range 3 {
		testcpu.WaitForOneP(t) // so that only the writer itself can have lent it
		l.Record(row(fmt.Sprintf("spare-p-%d", i)))
		if err := l.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second) // checkpoints come every second
	for {
		b, c := count()
		if b > 0 && c > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("in 5 s, %d statements of batches and %d checkpoints ran at nice 19: %+v", b, c, statements)
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	for _, s := range statements {
		if s.nice == 19 && s.procs != 2 {
			t.Errorf("a statement at nice 19 began with GOMAXPROCS %d: %+v", s.procs, statements)
			break
		}
	}
	mu.Unlock()
	testcpu.WaitForOneP(t)
}

// threadNice is the nice value of the calling thread.
func threadNice(t *testing.T) int {
	b, err := os.ReadFile("/proc/thread-self/stat")
	if err != nil {
		t.Errorf("read the thread's priority: %v", err)
		return 0
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	nice, _ := strconv.Atoi(fields[16])
	return nice
}

// threadPolicy is the scheduling policy of the calling thread.
func threadPolicy(t *testing.T) int {
	b, err := os.ReadFile("/proc/thread-self/stat")
	if err != nil {
		t.Errorf("read the thread's policy: %v", err)
		return -1
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	policy, _ := strconv.Atoi(fields[38])
	return policy
}

// policyJournal records the scheduling policy of the thread each Durable
// ran on.
type policyJournal struct {
	t        *testing.T
	mu       sync.Mutex
	policies []int
}

func (j *policyJournal) Begin(*models.Usage) error { return nil }
func (j *policyJournal) Durable(...string) {
	p := threadPolicy(j.t)
	j.mu.Lock()
	j.policies = append(j.policies, p)
	j.mu.Unlock()
}

// TestJournalIsToldOffTheLowPriorityThread: the journal's Durable takes the
// journal's lock, which every request's Begin takes too, so it must not run
// on the committer's thread: a request waiting for that lock would wait for
// a thread the kernel runs last (priority inversion). It runs on the
// writer's goroutine.
func TestJournalIsToldOffTheLowPriorityThread(t *testing.T) {
	l := open(t)
	j := &policyJournal{t: t}
	l.UseJournal(j, 0) // every Begin falls due at once
	for i := range 3 {
		if err := <-l.Begin(row(fmt.Sprintf("settled-%d", i))); err != nil {
			t.Fatal(err)
		}
		if err := l.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(j.policies) == 0 {
		t.Fatal("Durable was never called")
	}
	for _, p := range j.policies {
		if p == unix.SCHED_IDLE {
			t.Fatalf("Durable ran on a SCHED_IDLE thread (policies seen: %v)", j.policies)
		}
	}
}

// lockedLog is a log's output that goroutines may write while a test reads.
type lockedLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// waitedHalf reports whether the committer's log says a batch was starved
// while its thread waited for a CPU at least half the batch's time.
func waitedHalf(log string) bool {
	m := regexp.MustCompile(`starved.* took=(\S+) waited_for_cpu=(\S+)`).FindStringSubmatch(log)
	if m == nil {
		return false
	}
	took, err1 := time.ParseDuration(m[1])
	waited, err2 := time.ParseDuration(m[2])
	return err1 == nil && err2 == nil && 2*waited >= took
}
