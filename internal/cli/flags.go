package cli

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"

	"moonji/internal/config"
	"moonji/models"
)

// newFlagSet returns a flag set with the --config flag every subcommand takes.
func newFlagSet(name string) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	path := fs.String("config", os.Getenv("MOONJI_CONFIG"), "configuration file (also MOONJI_CONFIG)")
	return fs, path
}

// parse parses flags that may stand before, between or after positional
// arguments, and returns the positional ones.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrUsage, fs.Name(), err)
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

func loadConfig(path string) (*config.Config, error) {
	return config.Load(path)
}

// parseDuration accepts Go durations ("720h", "90m") and whole days ("30d").
func parseDuration(s string) (time.Duration, error) {
	if d, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(d)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("invalid duration %q", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("invalid duration %q (want e.g. 720h or 30d)", s)
	}
	return d, nil
}

// openFor opens the database of the configuration at path.
func openFor(path string) (*gorm.DB, error) {
	cfg, err := loadConfig(path)
	if err != nil {
		return nil, err
	}
	return models.Open(cfg.DatabaseURL)
}
