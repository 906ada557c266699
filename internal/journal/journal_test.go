package journal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"moonji/internal/spareproc"
	"moonji/internal/testcpu"
	"moonji/models"
)

func row(id string) *models.Usage {
	return &models.Usage{InferenceID: id, CreatedAt: time.Now().UTC().Truncate(time.Millisecond), Model: "m1", Outcome: models.OutcomePending, Replica: "r1"}
}

func ids(rows []models.Usage) string {
	var s []string
	for _, r := range rows {
		s = append(s, r.InferenceID)
	}
	return strings.Join(s, ",")
}

func segments(t *testing.T, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*.journal"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// eventually waits up to 5 s for ok to hold, what naming it.
func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 5 s: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// held returns what f returns, run holding j's lock.
func held[T any](j *Journal, f func() T) T {
	j.mu.Lock()
	defer j.mu.Unlock()
	return f()
}

// waitSegments waits until dir holds n segment files: the journal's
// goroutine deletes released segments and makes the spare one.
func waitSegments(t *testing.T, dir string, n int) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d segments", n), func() bool { return len(segments(t, dir)) == n })
}

// waitSpare waits until j's goroutine has made the next segment ahead.
func waitSpare(t *testing.T, j *Journal) {
	t.Helper()
	eventually(t, "a spare segment", func() bool { return held(j, func() bool { return j.spare != nil }) })
}

// crash ends j as a killed process would: its goroutine stops and its lock
// goes, and nothing else. The spare segment is made first, as it usually
// is by then.
func crash(t *testing.T, j *Journal) {
	t.Helper()
	waitSpare(t, j)
	close(j.stop)
	<-j.stopped
	j.unlock()
}

// fill begins rows named prefix-0, prefix-1, … until j rotates to another
// segment, and returns how many it began.
func fill(t *testing.T, j *Journal, prefix string) int {
	t.Helper()
	first := held(j, func() *segment { return j.cur })
	big := strings.Repeat("x", 150) // the row's User column is 320 characters at most
	for n := 1; ; n++ {
		r := row(fmt.Sprintf("%s-%d", prefix, n-1))
		r.User = big
		if err := j.Begin(r); err != nil {
			t.Fatal(err)
		}
		if held(j, func() *segment { return j.cur }) != first {
			return n
		}
	}
}

// A row begun and never made durable comes back at the next start, with
// every field; one made durable does not.
func TestLeftoversComeBack(t *testing.T) { eachWay(t, testLeftoversComeBack) }

func testLeftoversComeBack(t *testing.T) {
	dir := t.TempDir()
	j, left, err := Open(dir, "host/127.0.0.1:8080", nil)
	if err != nil || len(left) != 0 {
		t.Fatalf("fresh: %v %v", left, err)
	}
	a, b, c := row("a"), row("b"), row("c")
	uid := uint(7)
	b.UserID, b.User = &uid, "bob@example.com"
	for _, r := range []*models.Usage{a, b, c} {
		if err := j.Begin(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := j.Begin(row("a")); err == nil {
		t.Error("a second Begin of the same id was accepted")
	}
	j.Durable("a", "c", "never-begun")
	if j.Open() != 1 {
		t.Errorf("open = %d, want 1", j.Open())
	}
	// No Close: the process dies here. Its lock goes with it.
	crash(t, j)

	j2, left, err := Open(dir, "host/127.0.0.1:8080", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j2.Close()
	if ids(left) != "b" || left[0].User != "bob@example.com" || *left[0].UserID != 7 || !left[0].CreatedAt.Equal(b.CreatedAt) {
		t.Fatalf("leftovers = %+v, want b with its fields", left)
	}
	// Until Recovered, the old segments stay (a failed recovery retries):
	// the one written and the spare; then the new one and its spare.
	waitSpare(t, j2)
	if n := len(segments(t, dir)); n != 4 {
		t.Errorf("%d segments before Recovered, want the old two and the new two", n)
	}
	j2.Recovered()
	if n := len(segments(t, dir)); n != 2 {
		t.Errorf("%d segments after Recovered, want the new one and its spare", n)
	}
}

// A clean Close with nothing open leaves no file to recover.
func TestCleanCloseLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	j, _, err := Open(dir, "r", nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = j.Begin(row("x"))
	j.Durable("x")
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if s := segments(t, dir); len(s) != 0 {
		t.Errorf("segments left: %v", s)
	}
	j, left, err := Open(dir, "r", nil)
	if err != nil || len(left) != 0 {
		t.Fatalf("reopen: %v %v", left, err)
	}
	j.Close()
}

// Two processes with one replica id cannot share a journal; another id can.
func TestLockedByOneProcess(t *testing.T) {
	dir := t.TempDir()
	j, _, err := Open(dir, "same", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if _, _, err := Open(dir, "same", nil); !errors.Is(err, ErrLocked) {
		t.Errorf("second open: %v, want ErrLocked", err)
	}
	other, _, err := Open(dir, "other", nil)
	if err != nil {
		t.Fatalf("another replica id: %v", err)
	}
	other.Close()
}

// Segments are rotated as they grow and deleted once all their rows are
// durable, so a busy replica's journal stays small.
func TestSegmentsAreDeletedWhenDurable(t *testing.T) { eachWay(t, testSegmentsAreDeletedWhenDurable) }

func testSegmentsAreDeletedWhenDurable(t *testing.T) {
	dir := t.TempDir()
	j, _, err := Open(dir, "r", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	// Rows until the third segment is begun.
	n := fill(t, j, "a")
	m := fill(t, j, "b")
	// Everything but the very first row is durable: the first segment
	// stays for it, the second goes; the current one and the spare made
	// ahead are there.
	for i := 1; i < n; i++ {
		j.Durable(fmt.Sprintf("a-%d", i))
	}
	for i := range m {
		j.Durable(fmt.Sprintf("b-%d", i))
	}
	waitSpare(t, j)
	waitSegments(t, dir, 3)
	j.Durable("a-0")
	waitSegments(t, dir, 2)
}

// A rotation on Begin's path swaps in the segment the journal's goroutine
// made ahead, and the goroutine makes the next one.
func TestRotationTakesTheSpare(t *testing.T) { eachWay(t, testRotationTakesTheSpare) }

func testRotationTakesTheSpare(t *testing.T) {
	dir := t.TempDir()
	j, _, err := Open(dir, "r", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	waitSpare(t, j)
	spare := held(j, func() *segment { return j.spare })
	fill(t, j, "id")
	if cur := held(j, func() *segment { return j.cur }); cur != spare {
		t.Fatalf("rotated to %s, not to the spare %s", cur.path, spare.path)
	}
	waitSpare(t, j)
	if held(j, func() *segment { return j.spare }) == spare {
		t.Fatal("the spare taken is still the spare")
	}
}

// A segment rotated out with rows still open is synced by the journal's
// goroutine: the once-a-second sync is of the current segment only.
func TestRetiredSegmentIsSynced(t *testing.T) {
	dir := t.TempDir()
	j, _, err := Open(dir, "r", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	first := held(j, func() *segment { return j.cur })
	fill(t, j, "id")
	eventually(t, "the retired segment synced", func() bool {
		return held(j, func() bool { return first.synced == first.size })
	})
}

// A record torn by a crash (a partial last line) and garbage lines are
// skipped; the rest is read.
func TestTornRecordIsSkipped(t *testing.T) { eachWay(t, testTornRecordIsSkipped) }

func testTornRecordIsSkipped(t *testing.T) {
	dir := t.TempDir()
	j, _, err := Open(dir, "r", nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = j.Begin(row("whole"))
	path := j.cur.path
	crash(t, j)
	// Where the next record would have gone: a mapped segment's file is
	// longer than what was written (zeros follow).
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("garbage\nB {\"InferenceID\":\"torn\",\"Mod"), j.cur.size)
	f.Close()
	j2, left, err := Open(dir, "r", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j2.Close()
	if ids(left) != "whole" {
		t.Errorf("leftovers %q, want whole", ids(left))
	}
}

// eachWay runs a test with mapped segments and with segments written by
// write(2), the fallback where a file cannot be preallocated or mapped.
func eachWay(t *testing.T, test func(t *testing.T)) {
	for _, mapped := range []bool{true, false} {
		t.Run(map[bool]string{true: "mapped", false: "written"}[mapped], func(t *testing.T) {
			defer func(was bool) { mapSegments = was }(mapSegments)
			mapSegments = mapped
			test(t)
		})
	}
}

// Segments are mapped, and what Begin copies is the file's content at once,
// with no write or sync: what a killed process leaves behind.
func TestBeginIsInTheFileWithoutAWrite(t *testing.T) {
	dir := t.TempDir()
	j, _, err := Open(dir, "r", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if j.cur.mem == nil {
		t.Fatal("the segment is not mapped")
	}
	if err := j.Begin(row("seen")); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(j.cur.path)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) != SegmentBytes {
		t.Errorf("segment file is %d bytes, want it allocated at %d", len(data), SegmentBytes)
	}
	if !strings.HasPrefix(string(data), `B {"InferenceID":"seen"`) {
		t.Errorf("file starts %.40q, want the row", data)
	}
}

// A batch of many durable ids is written as several records, each short
// enough for the reader: after a crash none of them comes back.
func TestManyDurableIDsAreRead(t *testing.T) {
	eachWay(t, func(t *testing.T) {
		dir := t.TempDir()
		j, _, err := Open(dir, "r", nil)
		if err != nil {
			t.Fatal(err)
		}
		var all []string
		for i := range 3000 { // 3,000 ids of 40 bytes: 120 KB, past maxLine in one record
			id := fmt.Sprintf("inf_%036d", i)
			if err := j.Begin(row(id)); err != nil {
				t.Fatal(err)
			}
			all = append(all, id)
		}
		j.Durable(all[:2999]...)
		crash(t, j) // the process dies
		j2, left, err := Open(dir, "r", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer j2.Close()
		if ids(left) != all[2999] {
			t.Errorf("%d leftovers (%.60s…), want only %s", len(left), ids(left), all[2999])
		}
	})
}

// TestSyncsHaveAPOfTheirOwn: in a process confined to one CPU, every fsync
// of a running journal — the once-a-second sync of the current segment and
// that of a segment rotated out with rows open — runs while the process
// has a P lent for it (spareproc.Blocking). An fsync keeps its P until it
// returns or the runtime hands the P on, up to 10 ms later; with one P,
// every request would wait that long (BENCHMARKS.md §31).
func TestSyncsHaveAPOfTheirOwn(t *testing.T) {
	if !testcpu.OnOne(t) {
		return
	}
	spareproc.Enable()
	var mu sync.Mutex
	var procs []int
	syncFile = func(f *os.File) error {
		mu.Lock()
		procs = append(procs, runtime.GOMAXPROCS(0))
		mu.Unlock()
		return f.Sync()
	}
	defer func() { syncFile = (*os.File).Sync }()
	synced := func() []int {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(procs)
	}
	dir := t.TempDir()
	j, _, err := Open(dir, "r", nil)
	if err != nil {
		t.Fatal(err)
	}
	first := held(j, func() *segment { return j.cur })
	fill(t, j, "id") // the first segment is retired with its rows open
	eventually(t, "the retired segment synced", func() bool {
		return held(j, func() bool { return first.synced == first.size })
	})
	eventually(t, "the current segment synced", func() bool { return len(synced()) >= 2 })
	got := synced() // before Close, whose syncs end the process's work
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	for i, n := range got {
		if n < 2 {
			t.Fatalf("sync %d of %d ran with GOMAXPROCS %d: %v", i+1, len(got), n, got)
		}
	}
}

// A segment whose rows all become durable in one call is removed once:
// its file is deleted by one call, not by one per row.
func TestEmptiedSegmentIsRemovedOnce(t *testing.T) { eachWay(t, testEmptiedSegmentIsRemovedOnce) }

func testEmptiedSegmentIsRemovedOnce(t *testing.T) {
	var mu sync.Mutex
	removed := map[string]int{}
	removeFile = func(path string) error {
		mu.Lock()
		removed[path]++
		mu.Unlock()
		return os.Remove(path)
	}
	defer func() { removeFile = os.Remove }()
	dir := t.TempDir()
	j, _, err := Open(dir, "r", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	first := held(j, func() *segment { return j.cur }).path
	n := fill(t, j, "a")
	all := make([]string, n)
	for i := range all {
		all[i] = fmt.Sprintf("a-%d", i)
	}
	j.Durable(all[:n-1]...) // the last one began in the next segment
	eventually(t, "the first segment removed", func() bool {
		_, err := os.Stat(first)
		return errors.Is(err, os.ErrNotExist)
	})
	// Close waits for the journal's goroutine, and removes what it had
	// left to remove: the count is final.
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if removed[first] != 1 {
		t.Fatalf("the emptied segment was removed %d times, want 1 (%d rows made durable in one call)", removed[first], n-1)
	}
}
