// Command tcprrfloor measures the least that spreading small requests
// round-robin over many loopback TCP connections costs on this machine,
// against sending them all over one, with no iWARP around them: the floor
// under `goverbs scale -d tcp0`'s round-robin ratio, for a transport that
// carries each QP over a TCP connection of its own, as iWARP does.
//
// Two processes open -conns connections. The driving process keeps
// -window requests outstanding and busy-polls one epoll instance that
// watches every connection, as a tcp0 application polling a CQ of many
// QPs does; each request is one write(2) of 80 bytes (an 8-byte RDMA
// Write's FPDU and the zero-length Read Request that asks for its
// confirmation) and each answer is 20 bytes (the Read Response), which it
// reads once epoll reports them. It measures the rate of requests
// answered with every request on one connection (the others open and
// idle) and with the requests spread over all connections in turn; the
// ratio of the two is what one QP keeps when its work is spread over
// many.
//
// The answering process serves in one of three shapes:
//
//   - goroutines: a goroutine per connection reads it through the Go
//     runtime's poller (a net.Conn), as tcp0's receive goroutines do;
//   - epollwait: one thread waits in epoll_wait(2) for the connections
//     with something to read, as a C server would;
//   - epollspin: one thread busy-polls epoll_wait(2) with no timeout.
//
// Usage: go run ./scripts/tcprrfloor [-serve goroutines|epollwait|epollspin|all] [-conns n] [-window n] [-time d] [-rounds n]
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/scripts/internal/loopback"
)

const (
	reqLen = 80 // an 8 B RDMA Write's FPDU and a zero-length Read Request
	ansLen = 20 // a zero-length Read Response
)

var allShapes = []string{"goroutines", "epollwait", "epollspin"}

func main() {
	serve := flag.String("serve", "all", "how the answering process serves: goroutines, epollwait, epollspin, or all of them in turn")
	conns := flag.Int("conns", 1000, "connections between the two processes")
	window := flag.Int("window", 8, "requests kept outstanding")
	d := flag.Duration("time", 500*time.Millisecond, "how long each rate is measured")
	rounds := flag.Int("rounds", 3, "rounds, each measuring both rates")
	child := flag.Int("child", 0, "be the answering process, connecting to this port (started by the other)")
	flag.Parse()
	if *child != 0 {
		if err := answer(*serve, *child, *conns); err != nil {
			fmt.Fprintln(os.Stderr, "tcprrfloor child:", err)
			os.Exit(1)
		}
		return
	}
	shapes := []string{*serve}
	if *serve == "all" {
		shapes = allShapes
	}
	for _, s := range shapes {
		if !slices.Contains(allShapes, s) {
			fmt.Fprintf(os.Stderr, "tcprrfloor: no shape %q: give goroutines, epollwait, epollspin or all\n", s)
			os.Exit(2)
		}
		if err := measure(s, max(*conns, 1), max(*window, 1), *d, max(*rounds, 1)); err != nil {
			fmt.Fprintln(os.Stderr, "tcprrfloor:", err)
			os.Exit(1)
		}
	}
}

// measure opens conns connections to an answering process of the given
// shape and prints both rates of each round and their ratio.
func measure(shape string, conns, window int, d time.Duration, rounds int) error {
	l, port, err := loopback.Listen(4096)
	if err != nil {
		return err
	}
	defer unix.Close(l)
	cmd, err := loopback.StartChild("-child", strconv.Itoa(port), "-serve", shape, "-conns", strconv.Itoa(conns))
	if err != nil {
		return err
	}
	d0 := &driver{ep: -1}
	defer func() {
		d0.close()
		cmd.Wait() // it ends at the connections' end
	}()
	if d0.ep, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return err
	}
	for range conns {
		fd, _, err := unix.Accept4(l, unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK)
		if err != nil {
			return fmt.Errorf("accepting connection %d of %d: %w", len(d0.fds)+1, conns, err)
		}
		d0.fds = append(d0.fds, fd)
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
			return err
		}
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(len(d0.fds) - 1)}
		if err := unix.EpollCtl(d0.ep, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			return err
		}
	}
	d0.part = make([]int, conns)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var ratios []float64
	for r := range rounds {
		one, err := d0.rate(window, d, false)
		if err != nil {
			return err
		}
		rr, err := d0.rate(window, d, true)
		if err != nil {
			return err
		}
		ratios = append(ratios, rr/one)
		fmt.Printf("%-10s round %d: one connection %.3f Mops/s, round-robin over %d %.3f Mops/s, ratio %.2f\n",
			shape, r+1, one/1e6, conns, rr/1e6, rr/one)
	}
	slices.Sort(ratios)
	fmt.Printf("%-10s median ratio %.2f (%.2f-%.2f) over %d rounds, %d outstanding\n",
		shape, ratios[len(ratios)/2], ratios[0], ratios[len(ratios)-1], rounds, window)
	return nil
}

// driver is the driving process's side: its connections and the epoll
// instance that watches them.
type driver struct {
	fds  []int
	ep   int
	part []int // bytes of an answer read so far, per connection
	next int   // the connection the next round-robin request goes to
	out  int   // requests outstanding
}

func (d *driver) close() {
	for _, fd := range d.fds {
		unix.Close(fd)
	}
	if d.ep >= 0 {
		unix.Close(d.ep)
	}
}

// send writes one request to connection i.
func (d *driver) send(i int, req []byte) error {
	n, err := unix.Write(d.fds[i], req)
	if err != nil || n != len(req) { // 80 bytes into an empty-enough loopback socket
		return fmt.Errorf("writing a request to connection %d: wrote %d of %d: %v", i, n, len(req), err)
	}
	d.out++
	return nil
}

// target is the connection the next request goes to.
func (d *driver) target(rr bool) int {
	if !rr {
		return 0
	}
	i := d.next
	d.next = (d.next + 1) % len(d.fds)
	return i
}

// rate keeps window requests outstanding for dur, on connection 0 or
// round-robin, and returns the answers a second; it ends with none
// outstanding.
func (d *driver) rate(window int, dur time.Duration, rr bool) (float64, error) {
	var req [reqLen]byte
	var buf [4096]byte
	var evs [64]unix.EpollEvent
	for range window {
		if err := d.send(d.target(rr), req[:]); err != nil {
			return 0, err
		}
	}
	start := time.Now()
	deadline := start.Add(dur)
	done, sending := 0, true
	var end time.Time
	for d.out > 0 {
		if sending && done&63 == 0 && time.Now().After(deadline) {
			sending, end = false, time.Now()
		}
		n, err := unix.EpollWait(d.ep, evs[:], 0)
		if err != nil && err != unix.EINTR {
			return 0, err
		}
		for _, ev := range evs[:max(n, 0)] {
			i := int(ev.Fd)
			got, err := unix.Read(d.fds[i], buf[:])
			if err == unix.EAGAIN {
				continue
			}
			if err != nil || got == 0 {
				return 0, fmt.Errorf("reading answers on connection %d: %d, %v", i, got, err)
			}
			d.part[i] += got
			for d.part[i] >= ansLen {
				d.part[i] -= ansLen
				d.out--
				if sending {
					done++
					if err := d.send(d.target(rr), req[:]); err != nil {
						return 0, err
					}
				}
			}
		}
	}
	return float64(done) / end.Sub(start).Seconds(), nil
}

// answer is the child: it connects conns times to port and answers each
// request with one answer, in the given shape, until the connections end.
func answer(shape string, port, conns int) error {
	if shape == "goroutines" {
		return answerGoroutines(port, conns)
	}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return err
	}
	defer unix.Close(ep)
	fds := make([]int, 0, conns)
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for range conns {
		fd, err := loopback.Dial(port)
		if err != nil {
			return err
		}
		fds = append(fds, fd)
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
			return err
		}
		if err := unix.SetNonblock(fd, true); err != nil {
			return err
		}
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(len(fds) - 1)}
		if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &ev); err != nil {
			return err
		}
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	timeout := -1
	if shape == "epollspin" {
		timeout = 0
	}
	part := make([]int, conns)
	var evs [64]unix.EpollEvent
	var buf [4096]byte
	var answers [4096 / reqLen * ansLen]byte
	for open := conns; open > 0; {
		n, err := unix.EpollWait(ep, evs[:], timeout)
		if err != nil && err != unix.EINTR {
			return err
		}
		for _, ev := range evs[:max(n, 0)] {
			i := int(ev.Fd)
			got, err := unix.Read(fds[i], buf[:len(buf)/reqLen*reqLen])
			if err == unix.EAGAIN {
				continue
			}
			if err != nil || got == 0 {
				// The driver closed it: done with this one.
				unix.EpollCtl(ep, unix.EPOLL_CTL_DEL, fds[i], nil)
				open--
				continue
			}
			part[i] += got
			k := part[i] / reqLen
			part[i] %= reqLen
			if k > 0 {
				if _, err := unix.Write(fds[i], answers[:k*ansLen]); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// answerGoroutines answers with a goroutine per connection, each reading
// its net.Conn.
func answerGoroutines(port, conns int) error {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cs := make([]net.Conn, 0, conns)
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	for range conns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		cs = append(cs, c)
	}
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for _, c := range cs {
		wg.Go(func() {
			var buf [4096 / reqLen * reqLen]byte
			var answers [4096 / reqLen * ansLen]byte
			part := 0
			for {
				got, err := c.Read(buf[:])
				if errors.Is(err, io.EOF) {
					return
				}
				if err != nil {
					errs <- err
					return
				}
				part += got
				k := part / reqLen
				part %= reqLen
				if k > 0 {
					if _, err := c.Write(answers[:k*ansLen]); err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}
