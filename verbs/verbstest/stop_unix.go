//go:build unix

package verbstest

import (
	"bytes"
	"fmt"
	"os"
	"syscall"
	"time"
)

// stopProcess stops process pid (SIGSTOP), waits until the kernel reports
// it stopped (the signal is delivered asynchronously: until then the
// process still runs), and returns what continues it. It needs Linux's
// /proc to see the stop.
func stopProcess(pid int) (cont func(), err error) {
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return nil, err
	}
	cont = func() { syscall.Kill(pid, syscall.SIGCONT) }
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			cont()
			return nil, fmt.Errorf("see whether process %d stopped: %w", pid, err)
		}
		// The state follows the parenthesised command name.
		if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) && stat[i+2] == 'T' {
			return cont, nil
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			cont()
			return nil, fmt.Errorf("process %d did not stop within %v of SIGSTOP", pid, timeout)
		}
	}
}
