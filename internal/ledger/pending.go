package ledger

import (
	"time"

	"moonji/models"
)

// With a journal, a request's pending row is deferred: its Begin is safe in
// the journal, and the row is written only if the request still runs
// pendingAfter later. Most requests end sooner, and cost one final insert.
// Meanwhile the row is in two places: the writer holds the Begin (youngRows),
// and running holds a copy for Running.

// Running returns the row of a request this ledger began and has not yet
// written to the database (its pending row is deferred), so that a stop on
// this replica finds a request younger than pendingAfter.
func (l *Ledger) Running(id string) (models.Usage, bool) {
	l.runMu.Lock()
	defer l.runMu.Unlock()
	u, ok := l.running[id]
	if !ok {
		return models.Usage{}, false
	}
	return *u, true
}

// youngRows are the deferred Begins the writer holds, in the order they
// came (which is the order they fall due: one delay for all).
type youngRows struct {
	order []op
	byID  map[string]int // inference id → index in order, while held
	head  int
}

func (y *youngRows) add(o op) {
	y.byID[o.row.InferenceID] = len(y.order)
	y.order = append(y.order, o)
}

// take removes and returns the held Begin of id.
func (y *youngRows) take(id string) (op, bool) {
	i, ok := y.byID[id]
	if !ok {
		return op{}, false
	}
	delete(y.byID, id)
	o := y.order[i]
	y.order[i].row.InferenceID = "" // taken: skipped when it falls due
	return o, true
}

// popDue removes and returns the held Begins due by now (all of them when
// all is set), oldest first.
func (y *youngRows) popDue(now time.Time, all bool) []op {
	var due []op
	for {
		y.skipTaken()
		if y.head == len(y.order) {
			return due
		}
		o := y.order[y.head]
		if !all && o.due.After(now) {
			return due
		}
		delete(y.byID, o.row.InferenceID)
		due = append(due, o)
		y.order[y.head] = op{}
		y.head++
	}
}

// skipTaken moves past taken Begins at the front, and compacts the slice
// once its dead front is half of it, so that it never grows for ever.
func (y *youngRows) skipTaken() {
	for y.head < len(y.order) && y.order[y.head].row.InferenceID == "" {
		y.order[y.head] = op{}
		y.head++
	}
	if y.head == len(y.order) {
		if y.head > 0 {
			y.order, y.head = y.order[:0], 0
		}
		return
	}
	if y.head >= 1024 && y.head*2 >= len(y.order) {
		n := copy(y.order, y.order[y.head:])
		clear(y.order[n:])
		y.order, y.head = y.order[:n], 0
		for i := range y.order {
			if id := y.order[i].row.InferenceID; id != "" {
				y.byID[id] = i
			}
		}
	}
}

// next returns when the oldest held Begin falls due.
func (y *youngRows) next() (time.Time, bool) {
	y.skipTaken()
	if y.head == len(y.order) {
		return time.Time{}, false
	}
	return y.order[y.head].due, true
}
