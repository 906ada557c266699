//go:build !linux

package ledger

import "time"

// background does nothing where a thread's priority cannot be set alone.
func background() bool { return false }

// processCPU is unused where background does nothing.
func processCPU() time.Duration { return 0 }
