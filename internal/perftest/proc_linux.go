package perftest

import (
	"os/exec"
	"syscall"
)

// DieWithParent makes the process cmd starts receive SIGKILL when this
// one dies, however it dies, so that no server is left behind.
func DieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
