package journal

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"moonji/models"
)

// While the database is unreachable the ledger's writer cannot make rows
// durable, and keeping every finished row in memory until it returns would
// grow without bound. So it writes each final row here too (an F record,
// the row as JSON, like a B record), keeps a bounded number in memory, and
// reads the rest back with Finals once the database answers. An F record
// keeps its row open until Durable, as a B record does; at start, Open
// returns a row's F record (its final state) rather than its Begin.

// place is where a row's records are: its Begin's segment (nil for a row
// final from the start, a rejection), and its final record's, if any. Each
// counts the row among its open rows, so that neither file is deleted
// before the row is durable.
type place struct{ b, f *segment }

// Final appends row's final state (an F record). Called only by the
// ledger's writer, off every request's path.
func (j *Journal) Final(row *models.Usage) error {
	j.mu.Lock()
	err := j.final(row)
	dead := j.takeDead()
	j.mu.Unlock()
	j.removeAll(dead)
	return err
}

func (j *Journal) final(row *models.Usage) error {
	if j.closed {
		return errors.New("journal: closed")
	}
	rec, err := appendRow(append(j.buf[:0], 'F', ' '), row)
	j.buf = rec
	if err != nil {
		return fmt.Errorf("journal: encode row: %w", err)
	}
	j.buf = append(j.buf, '\n')
	if err := j.writeRecord(j.buf); err != nil {
		return err
	}
	p := j.where[row.InferenceID]
	if p.f == j.cur {
		return nil
	}
	if old := p.f; old != nil {
		// Written twice: the newer record is the one read back.
		old.open--
		if old.open == 0 {
			j.release(old)
		}
	}
	p.f = j.cur
	j.cur.open++
	j.where[row.InferenceID] = p
	return nil
}

// Finals calls fn with the final rows (F records) whose ids are still open,
// a segment's worth at a time (at most ~2,500 rows), oldest segment first.
// The caller makes them durable; fn's error stops the walk and is returned.
// Only the ledger's writer writes F records, and it is the caller, so none
// is added meanwhile.
func (j *Journal) Finals(fn func(rows []models.Usage) error) error {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return errors.New("journal: closed")
	}
	var paths []struct {
		n    int
		path string
	}
	for n, s := range j.segs {
		paths = append(paths, struct {
			n    int
			path string
		}{n, s.path})
	}
	j.mu.Unlock()
	sort.Slice(paths, func(a, b int) bool { return paths[a].n < paths[b].n })
	for _, p := range paths {
		var rows []models.Usage
		seen := map[string]int{}
		err := readSegment(p.path, func(kind byte, data []byte) {
			if kind != 'F' {
				return
			}
			var u models.Usage
			if json.Unmarshal(data, &u) != nil || u.InferenceID == "" {
				return
			}
			if i, ok := seen[u.InferenceID]; ok {
				rows[i] = u
				return
			}
			seen[u.InferenceID] = len(rows)
			rows = append(rows, u)
		})
		if err != nil {
			// A segment deleted meanwhile had no open row left.
			continue
		}
		j.mu.Lock()
		open := rows[:0]
		for _, u := range rows {
			if pl, ok := j.where[u.InferenceID]; ok && pl.f != nil && pl.f.n == p.n {
				open = append(open, u)
			}
		}
		j.mu.Unlock()
		if len(open) == 0 {
			continue
		}
		if err := fn(open); err != nil {
			return err
		}
	}
	return nil
}
