//go:build linux && amd64 && !race

package atomicrel

import (
	"sync"

	"golang.org/x/sys/unix"
)

// The commands of membarrier(2), from linux/membarrier.h.
const (
	membarrierCmdQuery                    = 0
	membarrierCmdGlobal                   = 1 << 0
	membarrierCmdPrivateExpedited         = 1 << 3
	membarrierCmdRegisterPrivateExpedited = 1 << 4
)

// fenceCmd is the membarrier command Fence issues: the expedited one for
// this process once registered (a few microseconds: the kernel
// interrupts the processors that run the process's threads), else the
// global one (which waits for every processor to pass a scheduling
// point, milliseconds), else none (0) where the kernel or a seccomp
// filter allows neither.
var fenceCmd = sync.OnceValue(func() uintptr {
	if _, _, e := unix.Syscall(unix.SYS_MEMBARRIER, membarrierCmdRegisterPrivateExpedited, 0, 0); e == 0 {
		return membarrierCmdPrivateExpedited
	}
	if r, _, e := unix.Syscall(unix.SYS_MEMBARRIER, membarrierCmdQuery, 0, 0); e == 0 && r&membarrierCmdGlobal != 0 {
		return membarrierCmdGlobal
	}
	return 0
})

// Fence is the heavy side of an asymmetric fence: the calling goroutine's
// stores before it are ordered before its loads after it, and every other
// thread of the process executes a full memory barrier at some point
// during the call. So a goroutine that published with a release store
// (StoreUint64) and then loads a flag needs no fence of its own: either
// its store was made before that point, and the loads after Fence see it,
// or its load of the flag comes after that point and sees what the caller
// stored before Fence. It costs a system call; it belongs on the slow side
// of a handshake (arming a wake-up), never on the data path. Where the
// kernel has no membarrier, Fence orders only the caller's own accesses,
// and the slow side must recheck in time.
func Fence() {
	fullFence()
	if cmd := fenceCmd(); cmd != 0 {
		unix.Syscall(unix.SYS_MEMBARRIER, cmd, 0, 0)
	}
}
