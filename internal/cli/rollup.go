package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"moonji/models"
)

// cmdRollup rebuilds the dashboards' rollups from the ledger: for an
// operator who restored a ledger by hand, or after the log said a row was
// written without its rollup. Running servers may stay up: the rebuild is
// one transaction, and their writers wait for it.
func cmdRollup(ctx context.Context, args []string, stdout io.Writer) error {
	fs, path := newFlagSet("usage rollup")
	if pos, err := parse(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return fmt.Errorf("%w: usage rollup takes no arguments", ErrUsage)
	}
	db, err := openFor(*path)
	if err != nil {
		return err
	}
	defer models.Close(db)
	start := time.Now()
	n, err := models.RebuildRollup(ctx, db)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "rollup rebuilt from %d ledger rows in %s\n", n, time.Since(start).Round(time.Millisecond))
	return nil
}
