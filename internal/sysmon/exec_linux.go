package sysmon

import (
	"fmt"
	"os"
	"syscall"
)

// KeepAwake runs the program again with Setting in GODEBUG, unless it is
// there already (or the operator set schedtrace): the same executable (its
// inode, through /proc/self/exe, even if the file was replaced meanwhile),
// the same arguments, the same process. It returns only when it does not
// run the program again, with an error when it tried and could not.
//
// Call it first thing in main, before any file or socket is opened.
func KeepAwake() error {
	env, changed := Environ(os.Environ())
	if !changed {
		return nil
	}
	if err := syscall.Exec("/proc/self/exe", os.Args, env); err != nil {
		return fmt.Errorf("keep the runtime's monitor awake: exec: %w", err)
	}
	return nil // not reached
}
