package stack

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel kill the child when the test process dies, so a crashed or
// killed test leaves no etcd or proxy behind.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
