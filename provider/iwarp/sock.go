package iwarp

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sock is a connection's TCP socket once MPA has set it up: a descriptor
// of the connection's own, which the Go runtime's poller does not watch.
//
// The runtime's poller watches every descriptor the net package made,
// whether or not a goroutine waits on it, and a thread of the runtime
// sleeping in it wakes at each segment that arrives: with two
// busy-polling processes on two cores, one wake-up per message, which
// takes processor time from the pollers and makes the sender's write
// wake a thread (it raises the mean and the tail of a two-process Send
// ping-pong, not its median). So the net
// package's descriptor is closed once the connection starts, and two
// epoll instances of the connection's own, which the runtime's poller
// watches in its place, watch the socket, one for input and one for
// room to write: the socket wakes nothing until a goroutine is about to
// wait for it (waitIn, waitOut). The socket is in an instance only while
// a goroutine waits on it, or, for input, while the receive goroutine
// waits after each FPDU (until it spins or stands aside for a poller,
// unwatchIn): a registration is a callback the kernel runs for every
// segment it delivers to the socket, in the sender's write
// (scripts/tcpfloor shows the cost on a bare ping-pong), and one that
// stays makes every segment wake the runtime's poller.
//
// The descriptors stay open until release. Other system calls on fd
// than the receiver's go between enter and exit; shutdown, after which
// enter fails, waits for those in progress. The receiver reads under the
// connection's rxMu, under which the receive goroutine releases the
// descriptors (and a read that places bytes in the application's memory
// is announced to abort, see rxBusy).
type sock struct {
	// What every system call on the socket reads comes first, in one
	// cache line.
	fd      int // the socket
	busy    atomic.Int32
	closed  atomic.Bool
	once    sync.Once // of release
	in, out watch     // input; room to write
}

// release closes the socket's descriptors (closeAll), once.
func (s *sock) release() { s.once.Do(s.closeAll) }

// watch is an epoll instance that watches the socket for one kind of
// event, as a file the runtime's poller watches. One goroutine at a time
// waits on it: the receive goroutine on in, the holder of txMu on out.
type watch struct {
	f      *os.File
	rc     syscall.RawConn
	ep     int    // f's descriptor
	events uint32 // what it waits for
	// Whether the socket is in the instance: during a wait, and after
	// one that kept it (waitIn) until unwatchIn.
	registered bool
	// Of the wait in progress: whether take has not run yet, and the
	// error of the registration it made.
	first  bool
	addErr error
	ev     [1]unix.EpollEvent
	owner  *sock                 // whose socket
	takeFn func(fd uintptr) bool // take, as a value made once
}

// newSock makes the sock of nc's socket, on a descriptor of its own; nc
// stays open (setup still writes the MPA Reply through it) until the
// connection closes it.
func newSock(nc *net.TCPConn) (*sock, error) {
	rc, err := nc.SyscallConn()
	if err != nil {
		return nil, err
	}
	s := &sock{fd: -1}
	var derr error
	if err := rc.Control(func(fd uintptr) {
		s.fd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, fmt.Errorf("iwarp: no descriptor for the socket: %w", derr)
	}
	// The net package's sockets are non-blocking already (the flag
	// belongs to the open file, which the duplicate shares); readv and
	// writev are raw system calls that rely on it, so it is set here
	// rather than assumed.
	err = unix.SetNonblock(s.fd, true)
	if err == nil {
		err = s.in.open(s, unix.EPOLLIN|unix.EPOLLRDHUP)
	}
	if err == nil {
		err = s.out.open(s, unix.EPOLLOUT)
	}
	if err != nil {
		s.release()
		return nil, err
	}
	return s, nil
}

// open makes w's epoll instance, which watches s's socket for events
// while a goroutine waits (wait).
func (w *watch) open(s *sock, events uint32) error {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("iwarp: epoll for the socket: %w", err)
	}
	if err := unix.SetNonblock(ep, true); err != nil {
		unix.Close(ep)
		return fmt.Errorf("iwarp: epoll for the socket: %w", err)
	}
	f := os.NewFile(uintptr(ep), "iwarp-epoll")
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		// Not in the runtime's poller, so nothing could wait for it.
		f.Close()
		return fmt.Errorf("iwarp: epoll for the socket: %w", err)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return err
	}
	w.f, w.rc, w.ep, w.owner, w.events = f, rc, ep, s, events
	w.takeFn = w.take
	return nil
}

// enter announces a system call on fd: false once shutdown has begun.
func (s *sock) enter() bool {
	s.busy.Add(1)
	if s.closed.Load() {
		s.busy.Add(-1)
		return false
	}
	return true
}

// exit ends what enter announced.
func (s *sock) exit() { s.busy.Add(-1) }

// unacked reports how many bytes written to the socket its peer has not
// acknowledged yet (SIOCOUTQ); ok is false once shutdown has begun or on
// an error.
func (s *sock) unacked() (n int, ok bool) {
	if !s.enter() {
		return 0, false
	}
	defer s.exit()
	n, err := unix.IoctlGetInt(s.fd, unix.SIOCOUTQ)
	return n, err == nil
}

// shutdown makes every later enter fail, waits for the system calls in
// progress (none waits), and wakes the goroutines waiting for the socket
// (their waits fail with net.ErrClosed). Every caller waits, not only the
// first: one may release fd as soon as its shutdown returns. fd stays
// open until release.
func (s *sock) shutdown() {
	first := !s.closed.Swap(true)
	for s.busy.Load() != 0 {
		runtime.Gosched()
	}
	if first {
		s.in.f.Close()
		s.out.f.Close()
	}
}

// closeAll closes the socket's descriptors (release, once), after
// shutdown and once nothing reads it any more.
func (s *sock) closeAll() {
	s.closed.Store(true)
	for _, w := range []*watch{&s.in, &s.out} {
		if w.f != nil {
			w.f.Close()
		}
	}
	if s.fd >= 0 {
		unix.Close(s.fd)
	}
}

// waitIn waits until the socket has something to read, an end or an
// error, or until a kick (kick): os.ErrDeadlineExceeded, until unkick.
// The socket stays registered with the input instance afterwards, so
// that a receiver that waits after each FPDU (one of many connections
// that each receive seldom) does not pay two epoll_ctl calls a wait;
// unwatchIn removes it, for a receiver that goes on without waiting.
func (s *sock) waitIn() error { return s.wait(&s.in, true) }

// unwatchIn removes the socket from the input instance, where waitIn
// left it: while it is there, every segment the socket receives makes
// the instance readable and may wake a thread of the runtime's poller.
// Only the receive goroutine waits for input and calls it.
func (s *sock) unwatchIn() {
	if s.in.registered {
		s.in.registered = false
		s.watch(&s.in, unix.EPOLL_CTL_DEL)
	}
}

// waitInUntil is waitIn until deadline, which a kick brings forward.
func (s *sock) waitInUntil(deadline time.Time) error { return s.waitUntil(&s.in, deadline) }

// waitOut waits until the socket has room to write (or an error), or
// until deadline (the zero time: none): os.ErrDeadlineExceeded.
func (s *sock) waitOut(deadline time.Time) error { return s.waitUntil(&s.out, deadline) }

// waitUntil is wait with deadline set on w's epoll file.
func (s *sock) waitUntil(w *watch, deadline time.Time) error {
	if err := w.f.SetReadDeadline(deadline); err != nil {
		return net.ErrClosed
	}
	return s.wait(w, false)
}

// kick ends a waitIn in progress, or the next, at once with
// os.ErrDeadlineExceeded.
func (s *sock) kick() { s.in.f.SetReadDeadline(time.Unix(1, 0)) }

// unkick lets waitIn wait again after a kick.
func (s *sock) unkick() { s.in.f.SetReadDeadline(time.Time{}) }

// wait registers the socket with w's instance and waits for w to report
// it, or for a wake-up that may be spurious (the caller looks at the
// socket again either way). Registering looks at the socket's state:
// what is already there is reported at once. Unless keep, the
// registration goes once the wait ends, so that nothing of it runs while
// nobody waits.
func (s *sock) wait(w *watch, keep bool) error {
	w.first, w.addErr = true, nil
	err := w.rc.Read(w.takeFn)
	if w.addErr != nil {
		return w.addErr
	}
	if w.registered && !keep {
		w.registered = false
		s.watch(w, unix.EPOLL_CTL_DEL)
	}
	if err == nil {
		return nil // the runtime's poller reported w, or take found it
	}
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return os.ErrDeadlineExceeded
	case s.closed.Load():
		return net.ErrClosed
	}
	return err
}

// watch adds the socket to w's instance, to report w's events each time
// they arise (op EPOLL_CTL_ADD, edge-triggered), or removes it
// (EPOLL_CTL_DEL).
func (s *sock) watch(w *watch, op int) error {
	if !s.enter() {
		return net.ErrClosed
	}
	defer s.exit()
	ev := unix.EpollEvent{Events: w.events | unix.EPOLLET}
	return unix.EpollCtl(w.ep, op, s.fd, &ev)
}

// take is a wait's test of w's epoll instance fd: false makes the wait
// sleep in the runtime's poller until the instance is readable. Its
// first call comes after the runtime has forgotten what it heard of the
// instance before (RawConn.Read resets it first). If the socket is not
// registered, that call registers it, and the runtime learns of every
// report of the registration from then on, one that the socket's state
// at registering makes included; if it is (a wait kept it), the call
// asks the instance whether anything arrived since, which the runtime
// may have heard of before the reset (the instance reports only what is
// still there). The call after a wake-up is true without asking. A
// wake-up the runtime reports for nothing costs the caller a look at
// the socket, not a wait that never ends.
func (w *watch) take(fd uintptr) bool {
	if !w.first {
		return true
	}
	w.first = false
	if !w.registered {
		if w.addErr = w.owner.watch(w, unix.EPOLL_CTL_ADD); w.addErr != nil {
			return true
		}
		w.registered = true
		return false
	}
	for {
		n, _, e := unix.Syscall6(unix.SYS_EPOLL_PWAIT, fd, uintptr(unsafe.Pointer(&w.ev[0])), 1, 0, 0, 0)
		if e == unix.EINTR {
			continue
		}
		return e != 0 || n > 0
	}
}

// read is one read of the socket that does not wait: unix.EAGAIN when
// nothing has arrived, net.ErrClosed after shutdown.
func (s *sock) read(b []byte) (int, error) {
	if !s.enter() {
		return 0, net.ErrClosed
	}
	defer s.exit()
	return unix.Read(s.fd, b)
}

// closeWrite ends the stream this way (FIN).
func (s *sock) closeWrite() {
	if s.enter() {
		unix.Shutdown(s.fd, unix.SHUT_WR)
		s.exit()
	}
}

// control runs f on the socket's descriptor (a socket option, an
// ioctl): false after shutdown, without running it.
func (s *sock) control(f func(fd int)) bool {
	if !s.enter() {
		return false
	}
	defer s.exit()
	f(s.fd)
	return true
}
