//go:build unix

package verbstest

import "syscall"

// stopProcess stops process pid (SIGSTOP) and returns what continues it.
func stopProcess(pid int) (cont func(), err error) {
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return nil, err
	}
	return func() { syscall.Kill(pid, syscall.SIGCONT) }, nil
}
