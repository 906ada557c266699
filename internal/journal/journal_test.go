package journal

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
	j.unlock()

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
		t.Errorf("%d segments before Recovered, want the old and the new", n)
	}
	j2.Recovered()
	if n := len(segments(t, dir)); n != 1 {
		t.Errorf("%d segments after Recovered, want 1", n)
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
	big := strings.Repeat("x", 150) // the row's User column is 320 characters at most
	n := 0
	for len(segments(t, dir)) < 3 {
		r := row(fmt.Sprintf("id-%d", n))
		r.User = big
		if err := j.Begin(r); err != nil {
			t.Fatal(err)
		}
		n++
	}
	// Everything but the very first row is durable: the first segment
	// stays for it, the second goes.
	for i := 1; i < n; i++ {
		j.Durable(fmt.Sprintf("id-%d", i))
	}
	if s := segments(t, dir); len(s) != 2 {
		t.Fatalf("segments = %v, want the first (one open row) and the current", s)
	}
	j.Durable("id-0")
	if s := segments(t, dir); len(s) != 1 {
		t.Fatalf("segments = %v, want the current only", s)
	}
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
	j.unlock()
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
		j.unlock() // the process dies
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
