package models

import (
	"fmt"

	"gorm.io/gorm"

	"moonji/internal/spareproc"
)

// lendWhileQuerying lends the process a second P (spareproc) around every
// statement gorm runs on SQLite: SQLite is Go code here that keeps its P
// until the statement returns, and on one CPU the requests that arrive
// meanwhile would wait for it. A transaction's COMMIT comes right after its
// last statement, while the P is still lent (spareproc.returnAfter).
func lendWhileQuerying(db *gorm.DB) error {
	type register interface {
		Register(string, func(*gorm.DB)) error
	}
	cb := db.Callback()
	procs := map[string]struct{ before, after register }{
		"create": {cb.Create().Before("*"), cb.Create().After("*")},
		"query":  {cb.Query().Before("*"), cb.Query().After("*")},
		"update": {cb.Update().Before("*"), cb.Update().After("*")},
		"delete": {cb.Delete().Before("*"), cb.Delete().After("*")},
		"row":    {cb.Row().Before("*"), cb.Row().After("*")},
		"raw":    {cb.Raw().Before("*"), cb.Raw().After("*")},
	}
	// gorm runs every callback of a chain even after one failed, so each
	// Lend has its Return.
	for kind, p := range procs {
		if err := p.before.Register("moonji:lend_proc", func(*gorm.DB) { spareproc.Lend() }); err != nil {
			return fmt.Errorf("register %s callback: %w", kind, err)
		}
		if err := p.after.Register("moonji:return_proc", func(*gorm.DB) { spareproc.Return() }); err != nil {
			return fmt.Errorf("register %s callback: %w", kind, err)
		}
	}
	return nil
}
