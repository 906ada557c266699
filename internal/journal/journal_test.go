package journal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

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

// held returns what f returns, run holding j's lock.
func held[T any](j *Journal, f func() T) T {
	j.mu.Lock()
	defer j.mu.Unlock()
	return f()
}

// crash ends j as a killed process would: its goroutine stops and its lock
// goes, and nothing else.
func crash(t *testing.T, j *Journal) {
	t.Helper()
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
func TestLeftoversComeBack(t *testing.T) {
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
	// Until Recovered, the old segment stays (a failed recovery retries).
	if n := len(segments(t, dir)); n != 2 {
		t.Errorf("%d segments before Recovered, want the old one and the new one", n)
	}
	j2.Recovered()
	if n := len(segments(t, dir)); n != 1 {
		t.Errorf("%d segments after Recovered, want the new one", n)
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
func TestSegmentsAreDeletedWhenDurable(t *testing.T) {
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
	// stays for it, the second goes; the current one is there.
	for i := 1; i < n; i++ {
		j.Durable(fmt.Sprintf("a-%d", i))
	}
	for i := range m {
		j.Durable(fmt.Sprintf("b-%d", i))
	}
	if got := len(segments(t, dir)); got != 2 {
		t.Fatalf("%d segments, want the first (one row open) and the current one", got)
	}
	j.Durable("a-0")
	if got := len(segments(t, dir)); got != 1 {
		t.Fatalf("%d segments, want the current one", got)
	}
}

// A sync is of every segment written since the last one: the current one,
// and one rotated out with rows still open.
func TestSyncIsOfEverySegmentWritten(t *testing.T) {
	dir := t.TempDir()
	j, _, err := Open(dir, "r", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	first := held(j, func() *segment { return j.cur })
	fill(t, j, "id")
	second := held(j, func() *segment { return j.cur })
	if held(j, func() bool { return first.synced == first.size || second.synced == second.size }) {
		t.Fatal("a segment counts as synced before any sync")
	}
	j.sync() // what the journal's goroutine does every SyncEvery
	held(j, func() bool {
		if first.synced != first.size || second.synced != second.size {
			t.Errorf("after a sync: the first segment synced to %d of %d bytes, the current to %d of %d",
				first.synced, first.size, second.synced, second.size)
		}
		return true
	})
}

// A record torn by a crash (a partial last line) and garbage lines are
// skipped; the rest is read.
func TestTornRecordIsSkipped(t *testing.T) {
	dir := t.TempDir()
	j, _, err := Open(dir, "r", nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = j.Begin(row("whole"))
	path := j.cur.path
	crash(t, j)
	// Where the next record would have gone.
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

// A host's crash can leave a file's end as zeros (its size written before
// its data), and segments of earlier versions were allocated whole, zeros
// past their last record: the reader stops at the first zero.
func TestZerosEndASegment(t *testing.T) {
	dir := t.TempDir()
	j, _, err := Open(dir, "r", nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = j.Begin(row("whole"))
	path, size := j.cur.path, j.cur.size
	crash(t, j)
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt(append(make([]byte, 4096), "B {\"InferenceID\":\"after-zeros\"}\n"...), size)
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

// What Begin wrote is in the file as soon as it returns, with no sync:
// what a killed process leaves behind.
func TestBeginIsInTheFileAtOnce(t *testing.T) {
	dir := t.TempDir()
	j, _, err := Open(dir, "r", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	if err := j.Begin(row("seen")); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(j.cur.path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(data), `B {"InferenceID":"seen"`) || !strings.HasSuffix(string(data), "}\n") {
		t.Errorf("file holds %q, want the row's record", data)
	}
}

// A batch of many durable ids is written as several records, each short
// enough for the reader: after a crash none of them comes back.
func TestManyDurableIDsAreRead(t *testing.T) {
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
}

// A segment whose rows all become durable in one call is removed once:
// its file is deleted by one call, not by one per row.
func TestEmptiedSegmentIsRemovedOnce(t *testing.T) {
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
	if _, err := os.Stat(first); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the emptied segment is still there: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if removed[first] != 1 {
		t.Fatalf("the emptied segment was removed %d times, want 1 (%d rows made durable in one call)", removed[first], n-1)
	}
}
