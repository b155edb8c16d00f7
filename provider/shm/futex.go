package shm

import (
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Futexes on words in shared memory: not FUTEX_PRIVATE, so that a process
// can wake a waiter in another process mapping the same page.

// futexWait sleeps while *addr == val, until woken or interrupted.
func futexWait(addr *atomic.Uint32, val uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexOpWait, uintptr(val), 0, 0, 0)
}

// futexWaitFor is futexWait for at most d (d < 0: no limit).
func futexWaitFor(addr *atomic.Uint32, val uint32, d time.Duration) {
	if d < 0 {
		futexWait(addr, val)
		return
	}
	ts := unix.NsecToTimespec(d.Nanoseconds())
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexOpWait, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes every waiter on addr.
func futexWake(addr *atomic.Uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexOpWake, uintptr(^uint32(0)>>1), 0, 0, 0)
}

// Futex operations (linux/futex.h), shared rather than private.
const (
	futexOpWait = 0
	futexOpWake = 1
)
