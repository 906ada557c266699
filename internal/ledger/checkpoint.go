package ledger

import "time"

// On SQLite the WAL is copied back into the database file by a goroutine of
// its own (PASSIVE: it never blocks the writer), after every checkpointAfter
// commits and at least every checkpointEvery. SQLite would otherwise do it
// inside whichever commit crosses wal_autocheckpoint pages — the ledger
// writer's, with an fsync of the WAL and of the database file — and every
// request waiting for its pending row would wait for that too. models.Open
// raises wal_autocheckpoint to 10000 pages, so SQLite's own checkpoint is
// only a safety net for when this one falls behind (or for a process without
// a ledger, such as the CLI). A commit touches about 7 pages (the row and its
// indexes), so a checkpoint copies a few hundred.
const (
	checkpointAfter = 64
	checkpointEvery = time.Second
)

// checkpoints copies the WAL back whenever a checkpoint is due, until Close.
func (l *Ledger) checkpoints() {
	defer l.wg.Done()
	t := time.NewTicker(checkpointEvery)
	defer t.Stop()
	for {
		select {
		case <-l.stopCkpt:
			return
		case <-t.C:
		case <-l.kickCkpt:
		}
		if err := l.db.Exec("PRAGMA wal_checkpoint(PASSIVE)").Error; err != nil {
			l.log.Warn("sqlite checkpoint", "err", err)
		}
	}
}

// committed counts a commit, and asks for a checkpoint every
// checkpointAfter of them (SQLite only). The writer's goroutine calls it.
func (l *Ledger) committed() {
	if l.kickCkpt == nil {
		return
	}
	if l.nCommits++; l.nCommits%checkpointAfter == 0 {
		select {
		case l.kickCkpt <- struct{}{}:
		default:
		}
	}
}
