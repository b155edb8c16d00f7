package shm

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// A CQ's notifications reach its owner through an eventfd, which the
// owner hands to each peer in the handshake: the notification goroutine
// waits for it in Go's network poller, so that a CQ waiting for a
// notification parks a goroutine and holds no thread (a futex wait would
// hold one per CQ: a process with a thousand idle connections, a
// thousand threads). The futex word stays for CQ.Wait's own sleep
// (Sleeper), which is a thread's by design.

// cqEvent is a CQ's eventfd, as its owner holds it.
type cqEvent struct {
	fd   int      // written by this process's notifications (signalEvent)
	file *os.File // the same descriptor, read in the network poller
	buf  [8]byte
}

// newCQEvent creates a CQ's eventfd.
func newCQEvent() (*cqEvent, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	// A non-blocking descriptor: os.NewFile puts it in the poller.
	return &cqEvent{fd: fd, file: os.NewFile(uintptr(fd), "goverbs-cq-event")}, nil
}

// wait parks the calling goroutine until the eventfd has been written
// since it was last read, for at most d, and reads it. (A peer holds the
// descriptor too, and may read it first, taking the wake-up: d bounds
// what that costs, as it bounds a futex wait a peer spoils.)
func (e *cqEvent) wait(d time.Duration) {
	e.file.SetReadDeadline(time.Now().Add(d))
	e.file.Read(e.buf[:])
}

// close closes the eventfd; no notification may come after.
func (e *cqEvent) close() { e.file.Close() }

// eventOne is the 1 a notification adds to an eventfd's counter.
var eventOne = [8]byte{1}

// signalEvent adds one to the eventfd fd (if it is one: fd ≥ 0). A
// counter at its maximum (a peer's doing) makes the write fail without
// waiting, and leaves the descriptor readable: no wake-up is lost.
func signalEvent(fd int) {
	if fd >= 0 {
		unix.Write(fd, eventOne[:])
	}
}

// errNotEventfd refuses a peer's notification descriptor that is not an
// eventfd.
var errNotEventfd = errors.New("the CQ's notification descriptor is not an eventfd")

// checkPeerEvent makes sure the descriptor a peer handed over for its
// CQ's notifications is an eventfd, which a write can neither block on
// nor use to reach anything else, and makes it non-blocking (a peer may
// have made it blocking).
func checkPeerEvent(fd int) error {
	link, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return fmt.Errorf("the CQ's notification descriptor: %w", err)
	}
	if link != "anon_inode:[eventfd]" {
		return errNotEventfd
	}
	return unix.SetNonblock(fd, true)
}
