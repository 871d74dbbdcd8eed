package testenv

import (
	"os/exec"
	"syscall"
)

// setDeathSignal makes the kernel kill the child if the test binary dies
// before its cleanups run (for instance on a -timeout panic).
func setDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
