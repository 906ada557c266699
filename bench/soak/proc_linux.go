package main

import (
	"os/exec"
	"syscall"
)

// setDeathSignal kills a child when the soak dies (killed, timed out), so
// that no replica, engine or redis-server outlives it.
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
