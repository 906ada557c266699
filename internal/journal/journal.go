// Package journal keeps, on the replica's own disk, the usage rows a gateway
// has begun and not yet written to its database, so that a request whose
// answer has started never waits on the database and still has its row
// after a crash.
//
// A journal is a few append-only files (segments) in a directory, one set per
// replica id, locked by the process that owns them. Begin appends the row;
// Durable appends the ids whose rows the database has committed. A segment
// is allocated on disk at its full size when it is made (fallocate) and
// mapped into memory, so appending is a copy, with no system call: a
// write(2) per request was ~4 % of the gateway's CPU at 1,000 req/s
// (BENCHMARKS.md §20). The journal's goroutine keeps the pages just ahead
// of the last record faulted in writable (MADV_POPULATE_WRITE), so that the
// copy does not fault either (§29). Where a segment cannot be allocated or
// mapped, it is written with write(2) instead. The part of a segment not
// yet written is zeros; a reader stops at the first. A segment is deleted
// once every row begun in it is durable. When a replica starts, Open
// returns the rows its previous life began and never made durable; the
// caller records them (as gateway_restart) and then calls Recovered.
//
// What a crash can lose: a killed process loses nothing that Begin returned
// for, since its writes are in the kernel's page cache (a shared file
// mapping's pages are the file's). A crash of the host can lose what was
// written since the last sync (at most SyncEvery).
package journal

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"moonji/internal/spareproc"
	"moonji/models"
)

// Defaults.
const (
	// SegmentBytes is the size of a segment. The pages of the current one
	// that were written count in the process's resident memory (they are
	// mapped), so it is kept small: ~2,500 rows.
	SegmentBytes = 1 << 20
	// SyncEvery is how often the current segment is synced to disk.
	SyncEvery = time.Second
	// maxLine bounds one record when reading: a row's JSON is well under a
	// kilobyte (its strings are cut to their column sizes).
	maxLine = 64 << 10
	// durableIDs is the most ids one D record holds (ids are at most 40
	// bytes), so that a large batch never makes a line longer than maxLine.
	durableIDs = 256
)

// mapSegments is false in tests of the write(2) path, prefaultSegments in
// tests of segments not prefaulted.
var mapSegments, prefaultSegments = true, true

// prefaultAhead is how much of the current segment, past its last record,
// the journal's goroutine keeps mapped writable ahead of Begin
// (MADV_POPULATE_WRITE): the first write to a page of a shared file mapping,
// and the first after a sync wrote it back, faults, and a fault on Begin's
// copy is on a request's path (measured on this project's VM: ~0.12 faults
// a request at 1,000 req/s, most of them here). 64 KiB is ~180 rows; Begin
// asks for more when half of it is used. A variable for tests, read by Open.
var prefaultAhead int64 = 64 << 10

// syncFile writes a segment to disk; a test wraps it to see the process as
// each sync runs.
var syncFile = (*os.File).Sync

// ErrLocked is returned by Open when another process holds the journal of
// the same replica id.
var ErrLocked = errors.New("journal: in use by another process with the same replica id")

// Journal is one replica's journal. Its methods are safe for concurrent use.
type Journal struct {
	dir, base string
	log       *slog.Logger
	lock      *os.File

	mu      sync.Mutex
	closed  bool
	cur     *segment
	next    int                 // number of the next segment
	segs    map[int]*segment    // live segments: the current one and those with open rows
	where   map[string]*segment // inference id → segment of its Begin, until Durable
	old     []string            // the previous life's segments, until Recovered
	buf     []byte
	stop    chan struct{}
	stopped chan struct{}
	// ahead asks the journal's goroutine to prefault more of the current
	// segment, window bytes past its last record; noPrefault is set when
	// the kernel cannot (before Linux 5.14).
	ahead      chan struct{}
	window     int64
	noPrefault bool
	// spare is the next segment, made ahead by the journal's goroutine, so
	// that a rotation on Begin's path only swaps it in; dead are segments
	// released and not yet let go of (unmapped, closed, deleted), which the
	// goroutine does. Creating, allocating and mapping a file, and deleting
	// one, take up to milliseconds, and would otherwise be done holding mu
	// on a request's path (BENCHMARKS.md §31). retired are segments
	// rotated out with records not yet synced, which the goroutine syncs:
	// the once-a-second sync is of the current segment only. tidy asks for
	// all three.
	spare   *segment
	dead    []*segment
	retired []*segment
	tidy    chan struct{}
}

type segment struct {
	n    int
	path string
	f    *os.File
	// mem is the segment mapped into memory, SegmentBytes long; nil when it
	// is written with write(2).
	mem  []byte
	size int64
	open int // rows begun here and not yet durable
	// ready is where the part of mem prefaulted writable ends. busy is set
	// while the journal's goroutine prefaults mem outside the lock; a
	// release meanwhile sets released and leaves the unmapping to it.
	ready          int64
	synced         int64 // size at the last sync
	busy, released bool
}

// Open locks and opens the journal of replica in dir (created if missing)
// and returns the rows its previous life began and never made durable.
func Open(dir, replica string, log *slog.Logger) (*Journal, []models.Usage, error) {
	if log == nil {
		log = slog.Default()
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("journal: create %s: %w", dir, err)
	}
	j := &Journal{dir: dir, base: fileBase(replica), log: log, segs: map[int]*segment{}, where: map[string]*segment{},
		stop: make(chan struct{}), stopped: make(chan struct{}), ahead: make(chan struct{}, 1), tidy: make(chan struct{}, 1),
		window: prefaultAhead, noPrefault: !prefaultSegments}
	lock, err := os.OpenFile(filepath.Join(dir, j.base+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("journal: open lock: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, nil, fmt.Errorf("%w (%s in %s)", ErrLocked, replica, dir)
		}
		return nil, nil, fmt.Errorf("journal: lock: %w", err)
	}
	j.lock = lock
	left, err := j.readOld()
	if err != nil {
		j.unlock()
		return nil, nil, err
	}
	if err := j.rotate(); err != nil {
		j.unlock()
		return nil, nil, err
	}
	go j.syncLoop()
	return j, left, nil
}

// fileBase names a replica's files: its id made safe for a file name, and a
// hash of the id so that two ids that clean to the same name do not share.
func fileBase(replica string) string {
	sum := sha256.Sum256([]byte(replica))
	clean := unsafeChars.ReplaceAllString(replica, "_")
	if len(clean) > 64 {
		clean = clean[:64]
	}
	return clean + "-" + hex.EncodeToString(sum[:4])
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]`)

// segmentNumber returns n of a segment file base.n.journal.
func (j *Journal) segmentNumber(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, j.base+".")
	if !ok {
		return 0, false
	}
	num, ok := strings.CutSuffix(rest, ".journal")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(num)
	return n, err == nil && n >= 0
}

// readOld reads the previous life's segments, oldest first, and returns the
// rows begun there and never made durable, in the order they were begun.
func (j *Journal) readOld() ([]models.Usage, error) {
	entries, err := os.ReadDir(j.dir)
	if err != nil {
		return nil, fmt.Errorf("journal: read %s: %w", j.dir, err)
	}
	var nums []int
	for _, e := range entries {
		if n, ok := j.segmentNumber(e.Name()); ok {
			nums = append(nums, n)
		}
	}
	sort.Ints(nums)
	open := map[string]int{} // id → index in rows
	var rows []models.Usage
	var done []bool
	for _, n := range nums {
		path := j.segmentPath(n)
		j.old = append(j.old, path)
		j.next = n + 1
		if err := readSegment(path, func(kind byte, data []byte) {
			switch kind {
			case 'B':
				var u models.Usage
				if json.Unmarshal(data, &u) != nil || u.InferenceID == "" {
					return
				}
				open[u.InferenceID] = len(rows)
				rows = append(rows, u)
				done = append(done, false)
			case 'D':
				for _, id := range bytes.Fields(data) {
					if i, ok := open[string(id)]; ok {
						done[i] = true
						delete(open, string(id))
					}
				}
			}
		}); err != nil {
			return nil, err
		}
	}
	left := rows[:0]
	for i := range rows {
		if !done[i] {
			left = append(left, rows[i])
		}
	}
	return left, nil
}

// readSegment calls fn for each whole record of a segment, up to its first
// zero byte (the unwritten rest of a mapped segment). A last line cut short
// by a crash is skipped.
func readSegment(path string, fn func(kind byte, data []byte)) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	if end := bytes.IndexByte(data, 0); end >= 0 {
		data = data[:end]
	}
	for len(data) > 0 {
		next := bytes.IndexByte(data, '\n')
		if next < 0 {
			break // torn: the crash came before its newline
		}
		line := data[:next]
		data = data[next+1:]
		if len(line) < 2 || len(line) > maxLine || line[1] != ' ' {
			continue
		}
		fn(line[0], line[2:])
	}
	return nil
}

func (j *Journal) segmentPath(n int) string {
	return filepath.Join(j.dir, j.base+"."+strconv.Itoa(n)+".journal")
}

// rotate starts a new current segment; the previous one stays until its
// rows are durable. Called with j.mu held (or before j is shared).
func (j *Journal) rotate() error {
	next := j.spare
	j.spare = nil
	if next == nil {
		// None made ahead yet: made here, on the caller's path.
		var err error
		if next, err = j.newSegment(j.next); err != nil {
			return err
		}
		j.next++
	}
	prev := j.cur
	j.cur = next
	j.segs[next.n] = next
	if prev != nil {
		if prev.open > 0 && prev.size != prev.synced {
			j.retired = append(j.retired, prev) // its open rows need the sync
		}
		j.release(prev)
	}
	j.askAhead()
	j.askTidy() // the next spare
	return nil
}

// newSegment creates segment n, its blocks allocated and mapped when they
// can be.
func (j *Journal) newSegment(n int) (*segment, error) {
	path := j.segmentPath(n)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("journal: new segment: %w", err)
	}
	return &segment{n: n, path: path, f: f, mem: j.mapSegment(f)}, nil
}

// mapSegment allocates a new segment's blocks and maps it, or returns nil
// (the segment is then written with write(2)). The blocks are allocated
// first so that a full disk fails here, not as a fault on a later copy.
func (j *Journal) mapSegment(f *os.File) []byte {
	if !mapSegments {
		return nil
	}
	if err := fallocate(f, SegmentBytes); err != nil {
		j.log.Debug("journal: segment not preallocated, written with write(2)", "err", err)
		return nil
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, SegmentBytes, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		j.log.Debug("journal: segment not mapped, written with write(2)", "err", err)
		return nil
	}
	return mem
}

// unmap ends a segment's mapping; its file keeps what was written.
func (s *segment) unmap() {
	if s.mem != nil {
		_ = syscall.Munmap(s.mem)
		s.mem = nil
	}
}

// release deletes a segment that is no longer current and has no open rows.
func (j *Journal) release(s *segment) {
	if s == j.cur || s.open > 0 {
		return
	}
	if s.busy {
		s.released = true // the prefault under way ends it
		return
	}
	delete(j.segs, s.n)
	j.dead = append(j.dead, s)
	j.askTidy()
}

// remove lets go of a segment no longer used: its mapping, its file and
// its name.
func (j *Journal) remove(s *segment) {
	s.unmap()
	_ = s.f.Close()
	if err := removeFile(s.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		j.log.Warn("journal: remove a finished segment", "path", s.path, "err", err)
	}
}

// removeFile deletes a finished segment's file; tests count the calls.
var removeFile = os.Remove

// askTidy asks the journal's goroutine to let go of the released segments
// and make a spare one. Called with j.mu held.
func (j *Journal) askTidy() {
	select {
	case j.tidy <- struct{}{}:
	default:
	}
}

// tidyUp runs on the journal's goroutine: it syncs the segments rotated
// out, removes the released ones and makes the next one ahead, its first
// window prefaulted, with a P lent for the file system calls
// (spareproc.Blocking).
func (j *Journal) tidyUp() {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return
	}
	dead, retired := j.dead, j.retired
	j.dead, j.retired = nil, nil
	sizes := make([]int64, len(retired)) // a retired segment is written no more
	for i, s := range retired {
		sizes[i] = s.size
	}
	n, makeSpare := j.next, j.spare == nil
	if makeSpare {
		j.next++ // reserved: a failure skips the number
	}
	prefault, window := !j.noPrefault, j.window
	j.mu.Unlock()
	var spare *segment
	spareproc.Blocking(func() {
		// A segment released since it was retired is still open until
		// removed below.
		for _, s := range retired {
			_ = syncFile(s.f)
		}
		for _, s := range dead {
			j.remove(s)
		}
		if !makeSpare {
			return
		}
		s, err := j.newSegment(n)
		if err != nil {
			j.log.Warn("journal: make the next segment ahead", "err", err)
			return
		}
		if s.mem != nil && prefault {
			to := min(window, int64(len(s.mem)))
			if populateWrite(s.mem[:to]) == nil {
				s.ready = to
			}
		}
		spare = s
	})
	j.mu.Lock()
	for i, s := range retired {
		s.synced = sizes[i]
	}
	if spare != nil && !j.closed && j.spare == nil {
		j.spare, spare = spare, nil
	}
	j.mu.Unlock()
	if spare != nil { // closed meanwhile
		j.remove(spare)
	}
}

// Begin appends row. When it returns nil, a crash of the process can no
// longer lose the row.
func (j *Journal) Begin(row *models.Usage) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return errors.New("journal: closed")
	}
	if _, dup := j.where[row.InferenceID]; dup {
		return fmt.Errorf("journal: %s begun twice", row.InferenceID)
	}
	rec, err := appendRow(append(j.buf[:0], 'B', ' '), row)
	j.buf = rec
	if err != nil {
		return fmt.Errorf("journal: encode row: %w", err)
	}
	j.buf = append(j.buf, '\n')
	if err := j.room(len(j.buf)); err != nil {
		return err
	}
	if err := j.write(j.cur, j.buf); err != nil {
		return err
	}
	j.cur.open++
	j.where[row.InferenceID] = j.cur
	if j.cur.size+j.window/2 > j.cur.ready {
		j.askAhead()
	}
	return nil
}

// askAhead asks the journal's goroutine to prefault the current segment
// past its last record, unless it cannot, the segment is prefaulted to its
// end, or it was asked already. Called with j.mu held.
func (j *Journal) askAhead() {
	if j.noPrefault || j.cur.mem == nil || j.cur.ready >= int64(len(j.cur.mem)) {
		return
	}
	select {
	case j.ahead <- struct{}{}:
	default:
	}
}

// prefault makes the next window bytes of the current segment's
// mapping writable, from where the last prefault ended or from its last
// record's page. It runs on the journal's goroutine, not holding j.mu
// during the system call.
func (j *Journal) prefault() {
	j.mu.Lock()
	s := j.cur
	if j.closed || j.noPrefault || s.mem == nil {
		j.mu.Unlock()
		return
	}
	// Whole pages: madvise refuses a range that does not start on one.
	page := int64(pageSize)
	from := max(s.size&^(page-1), s.ready)
	to := min((s.size+j.window+page-1)&^(page-1), int64(len(s.mem)))
	if to <= from {
		j.mu.Unlock()
		return
	}
	s.busy = true
	j.mu.Unlock()
	err := populateWrite(s.mem[from:to])
	j.mu.Lock()
	defer j.mu.Unlock()
	s.busy = false
	switch {
	case errors.Is(err, syscall.EINVAL):
		j.noPrefault = true // the kernel cannot: Begin's copies fault as they come
		j.log.Debug("journal: segments not prefaulted", "err", err)
	case err != nil:
		// Begin's copy will fault there and meet the error itself (an
		// I/O error under the mapping); asking again at every Begin
		// would not help.
		j.log.Debug("journal: prefault", "path", s.path, "err", err)
	}
	s.ready = max(s.ready, to)
	if s.released {
		s.released = false
		j.release(s)
	}
}

// pageSize is the unit the kernel faults pages in.
var pageSize = os.Getpagesize()

// Durable records that the rows of ids are in the database. Ids that were
// never begun here are ignored.
func (j *Journal) Durable(ids ...string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return
	}
	var emptied []*segment // segments whose last open row this call made durable
	buf := append(j.buf[:0], 'D')
	flush := func() bool {
		if len(buf) == 1 {
			return true
		}
		buf = append(buf, '\n')
		err := j.room(len(buf))
		if err == nil {
			err = j.write(j.cur, buf)
		}
		if err != nil {
			j.log.Warn("journal: record durable rows", "err", err)
			return false
		}
		buf = append(buf[:0], 'D')
		return true
	}
	// The records go to the current segment: a Begin in an older one is
	// matched when reading, whatever the segment. A D record can thus be
	// deleted before its B (its segment emptied first); the row then looks
	// open to the next start, which finds it in the database and skips it.
	inRecord := 0
	for _, id := range ids {
		s, ok := j.where[id]
		if !ok {
			continue
		}
		if inRecord == durableIDs {
			if !flush() {
				j.buf = buf
				return
			}
			inRecord = 0
		}
		delete(j.where, id)
		s.open--
		if s.open == 0 {
			// Once per segment: released twice, it would be removed
			// twice (a close and two unlinks for nothing, per row).
			emptied = append(emptied, s)
		}
		buf = append(append(buf, ' '), id...)
		inRecord++
	}
	ok := flush()
	j.buf = buf
	if !ok {
		return
	}
	for _, s := range emptied {
		j.release(s)
	}
}

// room rotates the current segment when a record of n bytes would not fit
// in it.
func (j *Journal) room(n int) error {
	if j.cur.size+int64(n) <= SegmentBytes || j.cur.size == 0 {
		return nil // it fits, or it is larger than a segment and gets one of its own
	}
	return j.rotate()
}

// write appends one record. A short write leaves a torn line, which the
// reader skips; the next record starts on a line of its own.
func (j *Journal) write(s *segment, rec []byte) error {
	if s.mem != nil && s.size+int64(len(rec)) <= int64(len(s.mem)) {
		if err := copyMapped(s.mem[s.size:], rec); err != nil {
			// The segment's pages cannot be written (an I/O error under the
			// mapping): the next record starts a new segment. This one's
			// last line may be torn; the reader skips it.
			s.size = SegmentBytes
			return fmt.Errorf("journal: write %s: %w", s.path, err)
		}
		s.size += int64(len(rec))
		return nil
	}
	n, err := s.f.WriteAt(rec, s.size)
	s.size += int64(n)
	if err != nil {
		if n > 0 {
			_, _ = s.f.WriteAt([]byte{'\n'}, s.size)
			s.size++
		}
		return fmt.Errorf("journal: write %s: %w", s.path, err)
	}
	return nil
}

// Open returns how many rows are begun and not yet durable.
func (j *Journal) Open() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.where)
}

// Recovered deletes the previous life's segments, once the rows Open
// returned are in the database.
func (j *Journal) Recovered() {
	j.mu.Lock()
	old := j.old
	j.old = nil
	j.mu.Unlock()
	for _, path := range old {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			j.log.Warn("journal: remove a recovered segment", "path", path, "err", err)
		}
	}
}

// syncLoop is the journal's goroutine: it syncs the current segment every
// SyncEvery, prefaults it ahead of Begin when asked, and removes released
// segments and makes the next one ahead (tidyUp).
func (j *Journal) syncLoop() {
	defer close(j.stopped)
	t := time.NewTicker(SyncEvery)
	defer t.Stop()
	for {
		select {
		case <-j.stop:
			return
		case <-j.ahead:
			j.prefault()
		case <-j.tidy:
			j.tidyUp()
		case <-t.C:
			j.sync()
		}
	}
}

// sync writes the current segment to disk.
func (j *Journal) sync() {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return
	}
	s := j.cur
	grown := s.size != s.synced
	s.synced = s.size
	j.mu.Unlock()
	// Outside the lock: an fsync can take milliseconds, and Begin must not
	// wait for it. A rotation meanwhile closes the file only once its rows
	// are durable; a sync that then fails is moot. On Linux, fsync writes a
	// file's pages dirtied through a mapping too, and makes them read-only
	// again: what was prefaulted faults anew. So the pages ahead are
	// prefaulted again, unless nothing was written since the last sync (an
	// idle journal stays clean, and its next Begin asks).
	// An fsync blocks its thread for milliseconds and keeps its P: on a
	// one-core gateway the requests would wait for it (spareproc.Blocking).
	spareproc.Blocking(func() { _ = syncFile(s.f) })
	j.mu.Lock()
	s.ready = min(s.ready, s.size&^int64(pageSize-1))
	j.mu.Unlock()
	if grown {
		j.prefault()
	}
}

// Close syncs and closes the journal and releases its lock. Segments with
// open rows stay for the next start.
func (j *Journal) Close() error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return nil
	}
	j.closed = true
	j.mu.Unlock()
	close(j.stop)
	<-j.stopped
	// The goroutine is gone: what it had still to let go of goes now (a
	// retired segment still open is synced below).
	for _, s := range j.dead {
		j.remove(s)
	}
	j.dead = nil
	if j.spare != nil {
		j.remove(j.spare)
		j.spare = nil
	}
	var first error
	for _, s := range j.segs {
		if err := syncFile(s.f); err != nil && first == nil {
			first = err
		}
		s.unmap()
		_ = s.f.Close()
		// Only the current segment can have no open rows; with none
		// anywhere, nothing is left to recover.
		if len(j.where) == 0 {
			_ = os.Remove(s.path)
		}
	}
	j.unlock()
	return first
}

func (j *Journal) unlock() {
	_ = syscall.Flock(int(j.lock.Fd()), syscall.LOCK_UN)
	_ = j.lock.Close()
}
