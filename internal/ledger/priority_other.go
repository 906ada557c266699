//go:build !linux

package ledger

// background does nothing where a thread's priority cannot be set alone.
func background() bool { return false }
