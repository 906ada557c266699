package journal

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"moonji/models"
)

// segment is one file of the journal, named base.n.journal.
type segment struct {
	n      int
	path   string
	f      *os.File
	size   int64 // bytes written
	synced int64 // size at the last sync
	open   int   // rows begun here and not yet durable
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

func (j *Journal) segmentPath(n int) string {
	return filepath.Join(j.dir, j.base+"."+strconv.Itoa(n)+".journal")
}

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
			case 'F':
				// A final row, written while the database was away:
				// it replaces the row's Begin.
				var u models.Usage
				if json.Unmarshal(data, &u) != nil || u.InferenceID == "" {
					return
				}
				if i, ok := open[u.InferenceID]; ok {
					rows[i] = u
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

// readSegment calls fn for each whole record of a segment. It skips a line
// that is not a record (too long, or not "K data"), and a last line cut
// short by a crash (no newline). It stops at the first zero byte: a host
// crash can leave a file's end as zeros (its size written before its data),
// and segments of earlier versions were allocated whole, zeros past their
// last record.
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

// writeRecord writes one record to the current segment, first starting a new
// one when the record would take the current one past SegmentBytes. A short
// write leaves a torn line, which the reader skips; the next record starts
// on a line of its own. Called with j.mu held.
func (j *Journal) writeRecord(rec []byte) error {
	if s := j.cur; s.size > 0 && s.size+int64(len(rec)) > SegmentBytes {
		// A record larger than a segment gets one of its own.
		if err := j.rotate(); err != nil {
			return err
		}
	}
	s := j.cur
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

// rotate starts a new current segment; the previous one stays until its
// rows are durable, and is synced meanwhile like any live segment. Called
// with j.mu held (or before j is shared).
func (j *Journal) rotate() error {
	path := j.segmentPath(j.next)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("journal: new segment: %w", err)
	}
	next := &segment{n: j.next, path: path, f: f}
	j.next++
	prev := j.cur
	j.cur = next
	j.segs[next.n] = next
	if prev != nil {
		j.release(prev)
	}
	return nil
}

// release lets go of a segment that is no longer current and has no open
// rows: the caller deletes it once it has unlocked j.mu (takeDead,
// removeAll). Called with j.mu held.
func (j *Journal) release(s *segment) {
	if s == j.cur || s.open > 0 {
		return
	}
	delete(j.segs, s.n)
	j.dead = append(j.dead, s)
}

// takeDead returns the segments released and not yet deleted. Called with
// j.mu held.
func (j *Journal) takeDead() []*segment {
	dead := j.dead
	j.dead = nil
	return dead
}

// removeAll closes and deletes segments no longer used; called without
// j.mu, as deleting a file can take milliseconds.
func (j *Journal) removeAll(dead []*segment) {
	for _, s := range dead {
		_ = s.f.Close()
		if err := removeFile(s.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			j.log.Warn("journal: remove a finished segment", "path", s.path, "err", err)
		}
	}
}

// removeFile deletes a finished segment's file; tests count the calls.
var removeFile = os.Remove
