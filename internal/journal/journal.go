// Package journal keeps, on the replica's own disk, the usage rows a gateway
// has begun and not yet written to its database, so that a request whose
// answer has started never waits on the database and still has its row
// after a crash.
//
// A journal is a few append-only files (segments) in a directory, one set per
// replica id, locked by the process that owns them. Begin appends the row;
// Durable appends the ids whose rows the database has committed. A segment
// is deleted once every row begun in it is durable. When a replica starts,
// Open returns the rows its previous life began and never made durable; the
// caller records them (as gateway_restart) and then calls Recovered.
//
// Every record is one write(2) on an ordinary file, one line each:
//
//	B <the row as JSON>
//	F <the row's final state as JSON>  (only while the database is away: final.go)
//	D <inference id> <inference id> …
//
// What a crash can lose: a killed process loses nothing that Begin returned
// for, since a written record is in the kernel's page cache. A crash of the
// host can lose what was written since the last sync: the journal's
// goroutine syncs the segments every SyncEvery, and Close syncs them too.
package journal

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"moonji/models"
)

// Defaults.
const (
	// SegmentBytes is the size past which the next record starts a new
	// segment: a segment is deleted only once all its rows are durable, so
	// small segments keep the journal of a busy replica a few megabytes.
	SegmentBytes = 1 << 20
	// SyncEvery is how often the segments written since are synced to disk.
	SyncEvery = time.Second
	// maxLine bounds one record when reading: a row's JSON is well under a
	// kilobyte (its strings are cut to their column sizes).
	maxLine = 64 << 10
	// durableIDs is the most ids one D record holds (ids are at most 40
	// bytes), so that a large batch never makes a line longer than maxLine.
	durableIDs = 256
)

// ErrLocked is returned by Open when another process holds the journal of
// the same replica id.
var ErrLocked = errors.New("journal: in use by another process with the same replica id")

// Journal is one replica's journal. Its methods are safe for concurrent use.
type Journal struct {
	dir, base string
	log       *slog.Logger
	lock      *os.File

	mu     sync.Mutex
	closed bool
	cur    *segment
	next   int              // number of the next segment
	segs   map[int]*segment // live segments: the current one and those with open rows
	where  map[string]place // inference id → segments of its records, until Durable
	old    []string         // the previous life's segments, until Recovered
	buf    []byte
	// dead are segments released and not yet deleted: each method that
	// releases one deletes it after unlocking mu, so that a Begin never
	// waits for a file to be deleted.
	dead []*segment

	stop    chan struct{}
	stopped chan struct{}
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
	j := &Journal{dir: dir, base: fileBase(replica), log: log, segs: map[int]*segment{}, where: map[string]place{},
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

// Begin appends row. When it returns nil, a crash of the process can no
// longer lose the row.
func (j *Journal) Begin(row *models.Usage) error {
	j.mu.Lock()
	err := j.begin(row)
	dead := j.takeDead()
	j.mu.Unlock()
	j.removeAll(dead)
	return err
}

func (j *Journal) begin(row *models.Usage) error {
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
	if err := j.writeRecord(j.buf); err != nil {
		return err
	}
	j.cur.open++
	j.where[row.InferenceID] = place{b: j.cur}
	return nil
}

// Durable records that the rows of ids are in the database. Ids that were
// never begun here are ignored.
func (j *Journal) Durable(ids ...string) {
	j.mu.Lock()
	j.durable(ids)
	dead := j.takeDead()
	j.mu.Unlock()
	j.removeAll(dead)
}

func (j *Journal) durable(ids []string) {
	if j.closed {
		return
	}
	var emptied []*segment // segments whose last open row this call made durable
	buf := append(j.buf[:0], 'D')
	defer func() { j.buf = buf }()
	flush := func() bool {
		if len(buf) == 1 {
			return true
		}
		buf = append(buf, '\n')
		if err := j.writeRecord(buf); err != nil {
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
		p, ok := j.where[id]
		if !ok {
			continue
		}
		if inRecord == durableIDs {
			if !flush() {
				return
			}
			inRecord = 0
		}
		delete(j.where, id)
		for _, s := range [2]*segment{p.b, p.f} {
			if s == nil {
				continue
			}
			s.open--
			if s.open == 0 {
				// Once per segment: released twice, it would be
				// deleted twice.
				emptied = append(emptied, s)
			}
		}
		buf = append(append(buf, ' '), id...)
		inRecord++
	}
	if !flush() {
		return
	}
	for _, s := range emptied {
		j.release(s)
	}
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

// syncLoop is the journal's goroutine: it syncs the segments written since
// the last sync, every SyncEvery, so that a Begin never waits for a disk.
func (j *Journal) syncLoop() {
	defer close(j.stopped)
	t := time.NewTicker(SyncEvery)
	defer t.Stop()
	for {
		select {
		case <-j.stop:
			return
		case <-t.C:
			j.sync()
		}
	}
}

// sync writes to disk every live segment that grew since its last sync.
func (j *Journal) sync() {
	type grown struct {
		s    *segment
		size int64
	}
	var todo []grown
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return
	}
	for _, s := range j.segs {
		if s.size != s.synced {
			todo = append(todo, grown{s, s.size})
		}
	}
	j.mu.Unlock()
	// Outside the lock: an fsync can take milliseconds, and Begin must not
	// wait for it. A segment deleted meanwhile is closed, and its sync
	// fails with nothing left to lose.
	for _, g := range todo {
		if err := g.s.f.Sync(); err != nil {
			if !errors.Is(err, os.ErrClosed) {
				j.log.Warn("journal: sync", "path", g.s.path, "err", err)
			}
			continue
		}
		j.mu.Lock()
		g.s.synced = max(g.s.synced, g.size)
		j.mu.Unlock()
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
	dead := j.takeDead()
	j.mu.Unlock()
	close(j.stop)
	<-j.stopped
	j.removeAll(dead)
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
