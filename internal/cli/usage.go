package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"moonji/internal/usageexport"
	"moonji/models"
)

func cmdUsage(ctx context.Context, args []string, stdout io.Writer) error {
	if len(args) > 0 && args[0] == "rollup" {
		return cmdRollup(ctx, args[1:], stdout)
	}
	if len(args) == 0 || args[0] != "export" {
		return fmt.Errorf("%w: usage needs the export or rollup command", ErrUsage)
	}
	fs, path := newFlagSet("usage export")
	since := fs.String("since", "", "only rows created at or after TIME (RFC 3339, YYYY-MM-DD, or a duration ago such as 24h)")
	format := fs.String("format", usageexport.JSONL, "jsonl or csv")
	if pos, err := parse(fs, args[1:]); err != nil {
		return err
	} else if len(pos) > 0 {
		return fmt.Errorf("%w: usage export takes no arguments", ErrUsage)
	}
	if *format != usageexport.JSONL && *format != usageexport.CSV {
		return fmt.Errorf("%w: --format must be jsonl or csv, got %q", ErrUsage, *format)
	}
	from, err := parseSince(*since, time.Now())
	if err != nil {
		return fmt.Errorf("%w: --since: %v", ErrUsage, err)
	}
	cfg, err := loadConfig(*path)
	if err != nil {
		return err
	}
	db, err := models.Open(cfg.DatabaseURL)
	if err != nil {
		return err
	}
	defer models.Close(db)
	return usageexport.Write(ctx, db, stdout, *format, cfg.Currency, from, 0, nil)
}

// parseSince reads --since: RFC 3339, a date, or a duration before now.
func parseSince(s string, now time.Time) (time.Time, error) {
	return usageexport.ParseSince(s, now)
}
