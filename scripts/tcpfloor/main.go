// Command tcpfloor measures the least that a 64-byte message between two
// processes over loopback TCP costs on this machine, with no iWARP around
// it: the floor under provider/iwarp's (tcp0's) latencies. Two processes
// ping-pong a message over one TCP connection, on raw sockets, in one of
// seven shapes:
//
//   - poll: each side busy-polls its socket with non-blocking reads, as an
//     application that polls a tcp0 CQ does (and as UCX's and libfabric's
//     TCP transports do, with epoll_wait and recv);
//   - epollspin: each side busy-polls an epoll instance that watches the
//     socket (epoll_wait with a zero timeout) and reads only once it
//     reports the socket readable, as UCX's TCP transport does: unlike a
//     read, the poll does not take the socket's lock, which the kernel
//     delivering the peer's segment needs;
//   - block: each side sleeps in a blocking read until the message comes;
//   - netpoll: each side's goroutine waits in the Go runtime's poller,
//     which watches the socket, as a net.Conn's Read does;
//   - epoll: each side's goroutine waits in the runtime's poller on an
//     epoll instance of its own that watches the socket with
//     EPOLLONESHOT, armed just before the wait: how tcp0's receive
//     goroutine waits (provider/iwarp's sock), so that a socket nobody
//     waits for wakes no thread;
//   - ppoll: each side's thread sleeps in ppoll(2) on the non-blocking
//     socket, a system call that keeps the goroutine's processor until
//     the runtime's monitor takes it back (harmless here, where nothing
//     else runs);
//   - register: each wait hands the runtime's poller a duplicate of the
//     socket, as an os.File, and closes it once woken, so that the
//     poller watches the socket itself, but only while someone waits
//     (at the price of five system calls and an os.File a wait).
//
// A message is one write(2) of 64 bytes and one or more read(2) on the
// other side. It prints the median, 10th and 90th percentile of the
// one-way time, half a round trip, as goverbs bench's send_lat does
// (t_typical is its median).
//
// Usage: go run ./scripts/tcpfloor [-shape poll|epollspin|block|netpoll|epoll|ppoll|register|all] [-n round trips]
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/scripts/internal/loopback"
)

const msgLen = 64

// allShapes are the ways of waiting that tcpfloor measures.
var allShapes = []string{"poll", "epollspin", "block", "netpoll", "epoll", "ppoll", "register"}

func main() {
	shape := flag.String("shape", "all", "how each side waits for the message: poll, epollspin, block, netpoll, epoll, ppoll, register, or all of them in turn")
	n := flag.Int("n", 100000, "round trips to time")
	child := flag.Int("child", 0, "be the echoing process, connecting to this port (started by the other)")
	flag.Parse()
	if *child != 0 {
		if err := echo(*shape, *child, *n); err != nil {
			fmt.Fprintln(os.Stderr, "tcpfloor child:", err)
			os.Exit(1)
		}
		return
	}
	shapes := []string{*shape}
	if *shape == "all" {
		shapes = allShapes
	}
	for _, s := range shapes {
		if !slices.Contains(allShapes, s) {
			fmt.Fprintf(os.Stderr, "tcpfloor: no shape %q: give poll, block, netpoll, epoll, ppoll, register or all\n", s)
			os.Exit(2)
		}
		if err := measure(s, max(*n, 1)); err != nil {
			fmt.Fprintln(os.Stderr, "tcpfloor:", err)
			os.Exit(1)
		}
	}
}

// measure listens on a loopback port, starts the echoing process, and
// times n round trips over the connection it makes.
func measure(shape string, n int) error {
	l, port, err := loopback.Listen(1)
	if err != nil {
		return err
	}
	defer unix.Close(l)
	cmd, err := loopback.StartChild("-child", fmt.Sprint(port), "-shape", shape, "-n", fmt.Sprint(n))
	if err != nil {
		return err
	}
	waited := false
	defer func() {
		if !waited { // a failure before the end: the child goes too
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()
	fd, _, err := unix.Accept4(l, unix.SOCK_CLOEXEC)
	if err != nil {
		return err
	}
	c, err := setup(fd, shape)
	if err != nil {
		unix.Close(fd)
		return err
	}
	defer c.close()
	var msg [msgLen]byte
	oneWay := make([]float64, n)
	for i := range oneWay {
		t := time.Now()
		if err := c.exchange(msg[:], true); err != nil {
			return err
		}
		oneWay[i] = float64(time.Since(t).Nanoseconds()) / 2
	}
	waited = true
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("the echoing process: %w", err)
	}
	slices.Sort(oneWay)
	fmt.Printf("%-8s one way: median %5.2f µs, p10 %5.2f, p90 %5.2f (%d round trips of %d bytes)\n", shape,
		oneWay[len(oneWay)/2]/1e3, oneWay[len(oneWay)/10]/1e3, oneWay[len(oneWay)*9/10]/1e3, n, msgLen)
	return nil
}

// echo is the child: it connects to port and answers n messages.
func echo(shape string, port, n int) error {
	fd, err := loopback.Dial(port)
	if err != nil {
		return err
	}
	c, err := setup(fd, shape)
	if err != nil {
		unix.Close(fd)
		return err
	}
	defer c.close()
	var msg [msgLen]byte
	for range n {
		if err := c.exchange(msg[:], false); err != nil {
			return err
		}
	}
	return nil
}

// conn is one side's socket, and how it waits for a message.
type conn struct {
	fd    int
	shape string
	file  *os.File        // netpoll: the socket; epoll: the epoll instance
	rc    syscall.RawConn // file's, for the runtime's poller
	ep    int             // epoll: the instance's descriptor
	ev    [1]unix.EpollEvent
	// The tests the runtime's poller runs, made once so that a read
	// allocates nothing: take (epoll) whether the instance reports the
	// socket; tryRead (netpoll, register) a read of buf into got and
	// gotErr, false on EAGAIN.
	take, tryRead func(fd uintptr) bool
	buf           []byte
	got           int
	gotErr        error
}

// setup turns Nagle off, as tcp0 does, and makes the socket non-blocking
// for every shape but block; netpoll and epoll hand a descriptor to the
// runtime's poller. The conn takes fd over; if setup fails, fd stays the
// caller's to close.
func setup(fd int, shape string) (*conn, error) {
	c := &conn{fd: fd, shape: shape, ep: -1}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(fd, shape != "block"); err != nil {
		return nil, err
	}
	var err error
	c.tryRead = func(fd uintptr) bool {
		c.got, c.gotErr = unix.Read(int(fd), c.buf)
		return c.gotErr != unix.EAGAIN
	}
	switch shape {
	case "epollspin":
		if c.ep, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
			return nil, err
		}
		ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP}
		if err := unix.EpollCtl(c.ep, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			unix.Close(c.ep)
			return nil, err
		}
	case "netpoll":
		// A non-blocking descriptor goes to the poller. The file owns a
		// descriptor of its own, so that closing it leaves fd to close.
		dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		c.file = os.NewFile(uintptr(dup), "socket")
	case "epoll":
		if c.ep, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
			return nil, err
		}
		ev := unix.EpollEvent{Events: unix.EPOLLONESHOT} // armed by each wait
		if err := unix.EpollCtl(c.ep, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			unix.Close(c.ep)
			return nil, err
		}
		if err := unix.SetNonblock(c.ep, true); err != nil {
			unix.Close(c.ep)
			return nil, err
		}
		c.file = os.NewFile(uintptr(c.ep), "epoll")
		c.take = func(efd uintptr) bool {
			for {
				n, err := unix.EpollWait(int(efd), c.ev[:], 0)
				if err != unix.EINTR {
					return err != nil || n > 0
				}
			}
		}
	}
	if c.file != nil {
		if c.rc, err = c.file.SyscallConn(); err != nil {
			c.file.Close()
			return nil, err
		}
	}
	return c, nil
}

func (c *conn) close() {
	if c.file != nil {
		c.file.Close() // the epoll instance, or the dup of the socket
	} else if c.ep >= 0 {
		unix.Close(c.ep) // epollspin's
	}
	unix.Close(c.fd)
}

// exchange is one message each way: the sender writes first and then
// reads the answer, the echoing side reads and then answers.
func (c *conn) exchange(msg []byte, send bool) error {
	if send {
		if err := writeAll(c.fd, msg); err != nil {
			return err
		}
		return c.readAll(msg)
	}
	if err := c.readAll(msg); err != nil {
		return err
	}
	return writeAll(c.fd, msg)
}

func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		switch {
		case err == unix.EAGAIN || err == unix.EINTR:
			continue
		case err != nil:
			return err
		}
		b = b[n:]
	}
	return nil
}

func (c *conn) readAll(b []byte) error {
	for len(b) > 0 {
		n, err := c.read(b)
		switch {
		case err == unix.EAGAIN || err == unix.EINTR:
			continue // poll: nothing yet
		case err != nil:
			return err
		case n == 0:
			return fmt.Errorf("the peer closed the connection")
		}
		b = b[n:]
	}
	return nil
}

// read is one read of the socket, waiting as the shape does when
// nothing has arrived (poll, epoll and ppoll return EAGAIN after their
// wait). register's new registration reports a socket that is readable
// already, so a wait that begins after the message came ends at once.
func (c *conn) read(b []byte) (int, error) {
	switch c.shape {
	case "epollspin":
		if n, err := unix.EpollWait(c.ep, c.ev[:], 0); n <= 0 {
			if err == nil {
				err = unix.EAGAIN
			}
			return 0, err
		}
	case "netpoll":
		// As a net.Conn reads: try, and wait in the poller on EAGAIN.
		return c.pollRead(c.rc, b)
	case "epoll":
		if n, err := unix.Read(c.fd, b); err != unix.EAGAIN {
			return n, err
		}
		ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLONESHOT}
		if err := unix.EpollCtl(c.ep, unix.EPOLL_CTL_MOD, c.fd, &ev); err != nil {
			return 0, err
		}
		if err := c.rc.Read(c.take); err != nil {
			return 0, err
		}
		return 0, unix.EAGAIN
	case "register":
		if n, err := unix.Read(c.fd, b); err != unix.EAGAIN {
			return n, err
		}
		dup, err := unix.FcntlInt(uintptr(c.fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return 0, err
		}
		f := os.NewFile(uintptr(dup), "socket")
		defer f.Close()
		rc, err := f.SyscallConn()
		if err != nil {
			return 0, err
		}
		return c.pollRead(rc, b)
	case "ppoll":
		if n, err := unix.Read(c.fd, b); err != unix.EAGAIN {
			return n, err
		}
		fds := []unix.PollFd{{Fd: int32(c.fd), Events: unix.POLLIN}}
		if _, err := unix.Ppoll(fds, nil, nil); err != nil && err != unix.EINTR {
			return 0, err
		}
		return 0, unix.EAGAIN
	}
	return unix.Read(c.fd, b)
}

// pollRead reads b through rc as a net.Conn does: it tries, and waits in
// the runtime's poller while the read finds nothing.
func (c *conn) pollRead(rc syscall.RawConn, b []byte) (int, error) {
	c.buf = b
	err := rc.Read(c.tryRead)
	c.buf = nil
	if err != nil {
		return 0, err
	}
	return c.got, c.gotErr
}
