//go:build !linux

package ledger

import "time"

// background does nothing where a thread's priority cannot be set alone.
func background() bool { return false }

// processCPU is unused where background does nothing.
func processCPU() time.Duration { return 0 }

// waitClock is unused where background does nothing.
type waitClock struct{}

func openWaitClock() *waitClock                  { return nil }
func (c *waitClock) read() (time.Duration, bool) { return 0, false }
func (c *waitClock) close()                      {}
