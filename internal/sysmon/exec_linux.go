package sysmon

import (
	"fmt"
	"os"
	"syscall"
)

// KeepAwake runs the program again with Setting in GODEBUG, unless it is
// there already (or the operator set schedtrace): the same executable, the
// same arguments, the same process. It returns only when it does not run
// the program again, with an error when it tried and could not.
//
// The executable is run by its path, not as /proc/self/exe, which would
// name the process "exe" in ps, top and pidof.
//
// Call it first thing in main, before any file or socket is opened.
func KeepAwake() error {
	env, changed := Environ(os.Environ())
	if !changed {
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("keep the runtime's monitor awake: %w", err)
	}
	if err := syscall.Exec(exe, os.Args, env); err != nil {
		return fmt.Errorf("keep the runtime's monitor awake: exec %s: %w", exe, err)
	}
	return nil // not reached
}
