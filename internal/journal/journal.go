// Package journal keeps, on the replica's own disk, the usage rows a gateway
// has begun and not yet written to its database, so that a request whose
// answer has started never waits on the database and still has its row
// after a crash.
//
// A journal is a few append-only files (segments) in a directory, one set per
// replica id, locked by the process that owns them. Begin appends the row
// (one write system call, no fsync); Durable appends the ids whose rows the
// database has committed. A segment is deleted once every row begun in it is
// durable. When a replica starts, Open returns the rows its previous life
// began and never made durable; the caller records them (as gateway_restart)
// and then calls Recovered.
//
// What a crash can lose: a killed process loses nothing that Begin returned
// for, since its writes are in the kernel's page cache. A crash of the host
// can lose what was written since the last sync (at most SyncEvery).
package journal

import (
	"bufio"
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

	"moonji/models"
)

// Defaults.
const (
	// SegmentBytes is the size past which Begin starts a new segment.
	SegmentBytes = 4 << 20
	// SyncEvery is how often the current segment is synced to disk.
	SyncEvery = time.Second
	// maxLine bounds one record when reading: a row's JSON is well under a
	// kilobyte (its strings are cut to their column sizes).
	maxLine = 64 << 10
)

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
}

type segment struct {
	n    int
	path string
	f    *os.File
	size int64
	open int // rows begun here and not yet durable
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
		stop: make(chan struct{}), stopped: make(chan struct{})}
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

// readSegment calls fn for each whole record of a segment. A last line cut
// short by a crash is skipped.
func readSegment(path string, fn func(kind byte, data []byte)) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 4096), maxLine)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) < 2 || line[1] != ' ' {
			continue
		}
		fn(line[0], line[2:])
	}
	if err := sc.Err(); err != nil && !errors.Is(err, bufio.ErrTooLong) {
		return fmt.Errorf("journal: read %s: %w", path, err)
	}
	return nil
}

func (j *Journal) segmentPath(n int) string {
	return filepath.Join(j.dir, j.base+"."+strconv.Itoa(n)+".journal")
}

// rotate starts a new current segment; the previous one stays until its
// rows are durable. Called with j.mu held (or before j is shared).
func (j *Journal) rotate() error {
	n := j.next
	path := j.segmentPath(n)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("journal: new segment: %w", err)
	}
	j.next++
	prev := j.cur
	j.cur = &segment{n: n, path: path, f: f}
	j.segs[n] = j.cur
	if prev != nil {
		j.release(prev)
	}
	return nil
}

// release deletes a segment that is no longer current and has no open rows.
func (j *Journal) release(s *segment) {
	if s == j.cur || s.open > 0 {
		return
	}
	delete(j.segs, s.n)
	_ = s.f.Close()
	if err := os.Remove(s.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		j.log.Warn("journal: remove a finished segment", "path", s.path, "err", err)
	}
}

// Begin appends row. When it returns nil, a crash of the process can no
// longer lose the row.
func (j *Journal) Begin(row *models.Usage) error {
	data, err := json.Marshal(row)
	if err != nil {
		return fmt.Errorf("journal: encode row: %w", err)
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return errors.New("journal: closed")
	}
	if _, dup := j.where[row.InferenceID]; dup {
		return fmt.Errorf("journal: %s begun twice", row.InferenceID)
	}
	if j.cur.size >= SegmentBytes {
		if err := j.rotate(); err != nil {
			return err
		}
	}
	j.buf = append(append(append(j.buf[:0], 'B', ' '), data...), '\n')
	if err := j.write(j.cur, j.buf); err != nil {
		return err
	}
	j.cur.open++
	j.where[row.InferenceID] = j.cur
	return nil
}

// Durable records that the rows of ids are in the database. Ids that were
// never begun here are ignored.
func (j *Journal) Durable(ids ...string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return
	}
	buf := append(j.buf[:0], 'D')
	var touched []*segment
	for _, id := range ids {
		s, ok := j.where[id]
		if !ok {
			continue
		}
		delete(j.where, id)
		s.open--
		touched = append(touched, s)
		buf = append(append(buf, ' '), id...)
	}
	j.buf = buf
	if len(touched) == 0 {
		return
	}
	// The record goes to the current segment: a Begin in an older one is
	// matched when reading, whatever the segment. A D record can thus be
	// deleted before its B (its segment emptied first); the row then looks
	// open to the next start, which finds it in the database and skips it.
	if err := j.write(j.cur, append(buf, '\n')); err != nil {
		j.log.Warn("journal: record durable rows", "err", err)
		return
	}
	for _, s := range touched {
		j.release(s)
	}
}

// write appends one record. A short write leaves a torn line, which the
// reader skips; the next record starts on a line of its own.
func (j *Journal) write(s *segment, rec []byte) error {
	n, err := s.f.Write(rec)
	s.size += int64(n)
	if err != nil {
		if n > 0 {
			_, _ = s.f.Write([]byte{'\n'})
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

func (j *Journal) syncLoop() {
	defer close(j.stopped)
	t := time.NewTicker(SyncEvery)
	defer t.Stop()
	for {
		select {
		case <-j.stop:
			return
		case <-t.C:
		}
		j.mu.Lock()
		var f *os.File
		if !j.closed {
			f = j.cur.f
		}
		j.mu.Unlock()
		if f != nil {
			// Outside the lock: an fsync can take milliseconds, and Begin
			// must not wait for it. A rotation meanwhile closes f only
			// once its rows are durable; a sync that then fails is moot.
			_ = f.Sync()
		}
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
	var first error
	for _, s := range j.segs {
		if err := s.f.Sync(); err != nil && first == nil {
			first = err
		}
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
