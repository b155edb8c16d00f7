package shm

import (
	"fmt"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A CQ's notifications reach its owner's notification goroutine through a
// Unix datagram socket of the owner's, which that goroutine waits on in
// Go's network poller: a CQ waiting for a notification parks a goroutine
// and holds no thread (a futex wait would hold one per CQ: a process with
// a thousand idle connections, a thousand threads). The futex word stays
// for CQ.Wait's own sleep (Sleeper), which is a thread's by design.
//
// The socket never leaves the owner. The owner notifies itself by
// sending a byte to the socket's own address; each peer holds a socket
// connected to it, made for it in the handshake; both send with
// MSG_DONTWAIT: no flag a peer can set on a shared descriptor (as it
// could on an eventfd or a pipe, whose O_NONBLOCK every holder shares)
// makes a notification wait, a full socket only drops the byte and
// leaves the owner's socket readable, and no peer can read the owner's
// wake-ups first. The socket is bound to an abstract address the kernel
// picks, so that notifiers can connect to it. Abstract addresses belong
// to a network namespace: a connection is made (Dial, Accept) from a
// thread in the namespace its receive CQ was created in. Any process in
// that namespace may send the socket a byte, which costs the owner a
// spurious look at the CQ; a flood of them is held to spuriousBurst
// looks and then one each spuriousPause.

// cqEvent is the socket a CQ's notifications wake its owner through.
type cqEvent struct {
	fd   int      // the owner's socket, read by the notification goroutine
	file *os.File // the same descriptor, waited on in the network poller
	name string   // its abstract address, "@" and what the kernel chose
	// raw and rawLen are the address as sendto takes it, made once:
	// notifications of several threads share them, read-only.
	raw    unix.RawSockaddrUnix
	rawLen uintptr
	buf    [64]byte
	// spurious counts the wake-ups in a row that found nothing.
	spurious int
}

// The bounds of spurious wake-ups: after spuriousBurst in a row, each
// wait first pauses spuriousPause, so that whoever floods the socket
// costs the owner a look a millisecond at most (and delays a genuine
// notification by as much meanwhile).
const (
	spuriousBurst = 64
	spuriousPause = time.Millisecond
)

// drainMax bounds the reads that empty the socket after a wake-up, so
// that senders on other processors cannot keep the waiter reading: a
// byte left makes the next round a spurious one.
const drainMax = 64

// newCQEvent creates a CQ's socket.
func newCQEvent() (*cqEvent, error) {
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("notification socket: %w", err)
	}
	// An empty name: the kernel binds a unique abstract address.
	if err := unix.Bind(fd, &unix.SockaddrUnix{}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind notification socket: %w", err)
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("notification socket's address: %w", err)
	}
	addr, ok := sa.(*unix.SockaddrUnix)
	if !ok || len(addr.Name) < 2 || addr.Name[0] != '@' || len(addr.Name) > len(unix.RawSockaddrUnix{}.Path) {
		unix.Close(fd)
		return nil, fmt.Errorf("notification socket's address is %v, not an abstract one", sa)
	}
	e := &cqEvent{fd: fd, name: addr.Name}
	e.raw.Family = unix.AF_UNIX
	for i := 1; i < len(addr.Name); i++ { // Path[0] is 0: abstract
		e.raw.Path[i] = int8(addr.Name[i])
	}
	e.rawLen = 2 + uintptr(len(addr.Name)) // family, 0, the name's bytes
	// A non-blocking descriptor: os.NewFile puts it in the poller.
	e.file = os.NewFile(uintptr(fd), "goverbs-cq-notify")
	return e, nil
}

// peerSocket returns a new socket connected to the CQ's, for one peer to
// notify it through.
func (e *cqEvent) peerSocket() (int, error) {
	s, err := unix.Socket(unix.AF_UNIX, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("notifier socket: %w", err)
	}
	if err := unix.Connect(s, &unix.SockaddrUnix{Name: e.name}); err != nil {
		unix.Close(s)
		return -1, fmt.Errorf("connect to the receive CQ's notification socket (connect from a thread in the network namespace the CQ was created in): %w", err)
	}
	return s, nil
}

// wait parks the calling goroutine until a notifier has sent a byte since
// the socket was last drained, for at most d, and drains it. It reports
// whether a byte woke it.
func (e *cqEvent) wait(d time.Duration) bool {
	if e.spurious >= spuriousBurst {
		time.Sleep(spuriousPause)
	}
	e.file.SetReadDeadline(time.Now().Add(d))
	if _, err := e.file.Read(e.buf[:]); err != nil {
		return false
	}
	for range drainMax {
		if _, err := unix.Read(e.fd, e.buf[:]); err != nil {
			break
		}
	}
	return true
}

// found tells wait whether the wake-up by a byte it last reported found
// something.
func (e *cqEvent) found(something bool) {
	if something {
		e.spurious = 0
	} else {
		e.spurious++
	}
}

// close closes the CQ's socket; no notification may come after.
func (e *cqEvent) close() { e.file.Close() }

// self is the owner's notifier: the socket itself, sending to its own
// address.
func (e *cqEvent) self() notifier {
	return notifier{fd: e.fd, to: unsafe.Pointer(&e.raw), toLen: e.rawLen}
}

// notifier is how one side notifies a CQ: a socket, and the CQ's
// address when the socket is not connected to it (the owner's own).
type notifier struct {
	fd    int // -1: notifies no one
	to    unsafe.Pointer
	toLen uintptr
}

// noNotifier notifies no one.
var noNotifier = notifier{fd: -1}

// notifyByte is what a notifier sends.
var notifyByte = [1]byte{1}

// send sends the CQ a byte. It never waits: a full socket drops the
// byte, and is readable.
func (n notifier) send() {
	if n.fd >= 0 {
		unix.Syscall6(unix.SYS_SENDTO, uintptr(n.fd), uintptr(unsafe.Pointer(&notifyByte[0])), 1,
			unix.MSG_DONTWAIT|unix.MSG_NOSIGNAL, uintptr(n.to), n.toLen)
	}
}

// checkPeerNotifier makes sure the descriptor a peer handed over to notify
// its CQ with is a Unix datagram socket, which a send with MSG_DONTWAIT
// neither blocks on nor uses to reach anything but a socket.
func checkPeerNotifier(fd int) error {
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return fmt.Errorf("the CQ's notifier is not a socket: %w", err)
	}
	dom, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return fmt.Errorf("the CQ's notifier: %w", err)
	}
	if typ != unix.SOCK_DGRAM || dom != unix.AF_UNIX {
		return fmt.Errorf("the CQ's notifier is a socket of type %d, domain %d, not a Unix datagram socket", typ, dom)
	}
	return nil
}
