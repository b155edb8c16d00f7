// Command tcpfloor measures the least that a 64-byte message between two
// processes over loopback TCP costs on this machine, with no iWARP around
// it: the floor under provider/iwarp's (tcp0's) latencies. Two processes
// ping-pong a message over one TCP connection, on raw sockets that the Go
// runtime's poller never sees, in one of two shapes:
//
//   - poll: each side busy-polls its socket with non-blocking reads, as an
//     application that polls a tcp0 CQ does (and as UCX's and libfabric's
//     TCP transports do, with epoll_wait and recv);
//   - block: each side sleeps in a blocking read until the message comes.
//
// A message is one write(2) of 64 bytes and one or more read(2) on the
// other side. It prints the median, 10th and 90th percentile of the
// one-way time, half a round trip, as goverbs bench's send_lat does
// (t_typical is its median).
//
// Usage: go run ./scripts/tcpfloor [-shape poll|block|all] [-n round trips]
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

const msgLen = 64

func main() {
	shape := flag.String("shape", "all", "how each side waits for the message: poll, block, or all of them in turn")
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
		shapes = []string{"poll", "block"}
	}
	for _, s := range shapes {
		if s != "poll" && s != "block" {
			fmt.Fprintf(os.Stderr, "tcpfloor: no shape %q: give poll, block or all\n", s)
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
	l, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(l)
	if err := unix.Bind(l, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return err
	}
	if err := unix.Listen(l, 1); err != nil {
		return err
	}
	sa, err := unix.Getsockname(l)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(exe, "-child", fmt.Sprint(sa.(*unix.SockaddrInet4).Port), "-shape", shape, "-n", fmt.Sprint(n))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	fd, _, err := unix.Accept4(l, unix.SOCK_CLOEXEC)
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return err
	}
	defer unix.Close(fd)
	if err := setup(fd, shape); err != nil {
		return err
	}
	var msg [msgLen]byte
	oneWay := make([]float64, n)
	for i := range oneWay {
		t := time.Now()
		if err := exchange(fd, msg[:], true); err != nil {
			return err
		}
		oneWay[i] = float64(time.Since(t).Nanoseconds()) / 2
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("the echoing process: %w", err)
	}
	slices.Sort(oneWay)
	fmt.Printf("%-6s one way: median %5.2f µs, p10 %5.2f, p90 %5.2f (%d round trips of %d bytes)\n", shape,
		oneWay[len(oneWay)/2]/1e3, oneWay[len(oneWay)/10]/1e3, oneWay[len(oneWay)*9/10]/1e3, n, msgLen)
	return nil
}

// echo is the child: it connects to port and answers n messages.
func echo(shape string, port, n int) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Connect(fd, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		return err
	}
	if err := setup(fd, shape); err != nil {
		return err
	}
	var msg [msgLen]byte
	for range n {
		if err := exchange(fd, msg[:], false); err != nil {
			return err
		}
	}
	return nil
}

// setup turns Nagle off, as tcp0 does, and makes the socket non-blocking
// for the poll shape.
func setup(fd int, shape string) error {
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
		return err
	}
	return unix.SetNonblock(fd, shape == "poll")
}

// exchange is one message each way: the sender writes first and then
// reads the answer, the echoing side reads and then answers.
func exchange(fd int, msg []byte, send bool) error {
	if send {
		if err := writeAll(fd, msg); err != nil {
			return err
		}
		return readAll(fd, msg)
	}
	if err := readAll(fd, msg); err != nil {
		return err
	}
	return writeAll(fd, msg)
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

func readAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Read(fd, b)
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
