package perftest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"time"
)

// goTCPPeer is plain Go TCP on the loopback, both ends in this process:
// a ping-pong of size-byte messages, the counterpart of send_lat, and a
// stream of them, the counterpart of send_bw. It is what a Go programmer
// writes without RDMA.
func goTCPPeer() *peer {
	return &peer{
		stack: "go", transport: "tcp",
		test: func(t Test) string {
			switch t {
			case SendLat:
				return "tcp_pingpong"
			case SendBW:
				return "tcp_stream"
			}
			return ""
		},
		missing: func() string { return "" },
		run:     runGoTCP,
	}
}

// GoTCPChild is the command that runs ServeGoTCPChild in another
// process (the goverbs command sets it to itself with a hidden flag); the
// Go TCP peer across two processes runs only where it is set. The
// address to dial back, tcp://host:port, is appended.
var GoTCPChild []string

// goTCP2Peer is plain Go TCP on the loopback with the server in another
// process, as goverbs' own bench server is for devices that cross
// processes: the like-for-like baseline of tcp0 across processes.
func goTCP2Peer() *peer {
	pr := goTCPPeer()
	pr.transport = "tcp-2proc"
	pr.missing = func() string {
		if len(GoTCPChild) == 0 {
			return "needs the goverbs command to start its server process"
		}
		return ""
	}
	pr.run = runGoTCP2
	return pr
}

// runGoTCP runs the ping-pong or the stream of p on a fresh loopback
// connection, with the server in this process.
func runGoTCP(ctx context.Context, p Params) (*Result, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer l.Close()
	srvErr := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			srvErr <- err
			return
		}
		defer c.Close()
		srvErr <- serveGoTCP(ctx, c, p)
	}()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", l.Addr().String())
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return goTCPClient(ctx, c, p, srvErr)
}

// runGoTCP2 runs the ping-pong or the stream of p with the server in a
// child process (GoTCPChild), which dials back and is told p first.
func runGoTCP2(ctx context.Context, p Params) (*Result, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer l.Close()
	args := append(append([]string(nil), GoTCPChild[1:]...), "tcp://"+l.Addr().String())
	cmd := exec.CommandContext(ctx, GoTCPChild[0], args...)
	DieWithParent(cmd)
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the Go TCP server process: %w", err)
	}
	srvErr := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		if err != nil {
			err = fmt.Errorf("%v: %s", err, firstLine(errOut.String()))
		}
		srvErr <- err
	}()
	type accepted struct {
		c   net.Conn
		err error
	}
	ac := make(chan accepted, 1)
	go func() {
		c, err := l.Accept()
		ac <- accepted{c, err}
	}()
	var c net.Conn
	select {
	case a := <-ac:
		if a.err != nil {
			cmd.Process.Kill()
			<-srvErr
			return nil, a.err
		}
		c = a.c
	case err := <-srvErr:
		return nil, fmt.Errorf("the Go TCP server process ended before it connected: %v", err)
	case <-ctx.Done():
		cmd.Process.Kill()
		<-srvErr
		return nil, ctx.Err()
	}
	defer c.Close()
	var hdr [goTCPHeaderLen]byte
	hdr[0] = byte(p.Test)
	binary.BigEndian.PutUint32(hdr[1:], uint32(p.Size))
	binary.BigEndian.PutUint64(hdr[5:], uint64(p.total()))
	if _, err := c.Write(hdr[:]); err != nil {
		cmd.Process.Kill()
		<-srvErr
		return nil, err
	}
	r, err := goTCPClient(ctx, c, p, srvErr)
	if r != nil && r.CPU != nil {
		// The server's processor time is the child's, not counted.
		r.CPU.SameProcess, r.CPU.ServerUnknown = false, true
	}
	return r, err
}

// goTCPHeaderLen is the length of what the client tells a server process:
// the test, the message size and the number of messages.
const goTCPHeaderLen = 13

// ServeGoTCPChild is the Go TCP peer's server process: it dials addr
// (tcp://host:port), reads what to serve, and serves it.
func ServeGoTCPChild(ctx context.Context, addr string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", strings.TrimPrefix(addr, "tcp://"))
	if err != nil {
		return err
	}
	defer c.Close()
	var hdr [goTCPHeaderLen]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return err
	}
	var p Params
	p.Test = Test(hdr[0])
	p.Size = int(binary.BigEndian.Uint32(hdr[1:]))
	total := binary.BigEndian.Uint64(hdr[5:])
	if (p.Test != SendLat && p.Test != SendBW) || p.Size < 1 || p.Size > 64<<20 || total < 1 || total > 1<<32 {
		return fmt.Errorf("a Go TCP bench request of test %d, %d bytes, %d messages: not one this server runs", hdr[0], p.Size, total)
	}
	p.Iters = int(total)
	return serveGoTCP(ctx, c, p)
}

// goTCPClient runs the client side of p on c, and waits for the server's
// verdict on srvErr.
func goTCPClient(ctx context.Context, c net.Conn, p Params, srvErr <-chan error) (*Result, error) {
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	var (
		r   *Result
		err error
	)
	if p.Test == SendLat {
		r, err = tcpPingPong(c, p)
	} else {
		r, err = tcpStream(c, p)
	}
	if err != nil {
		c.Close() // the server sees the end rather than waiting on
	}
	if serr := <-srvErr; err == nil && serr != nil {
		err = fmt.Errorf("server: %w", serr)
	}
	if err != nil {
		return nil, err
	}
	r.Iters = p.Iters
	return r, nil
}

// serveGoTCP is the server on c: it echoes each message of the
// ping-pong, or reads the whole stream and answers with one byte.
func serveGoTCP(ctx context.Context, c net.Conn, p Params) error {
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	if p.Test == SendLat {
		buf := make([]byte, p.Size)
		for range p.total() {
			if _, err := io.ReadFull(c, buf); err != nil {
				return err
			}
			if _, err := c.Write(buf); err != nil {
				return err
			}
		}
		return nil
	}
	buf := make([]byte, 256<<10)
	for left := int64(p.total()) * int64(p.Size); left > 0; {
		n, err := c.Read(buf[:min(int64(len(buf)), left)])
		left -= int64(n)
		if err != nil && left > 0 {
			return err
		}
	}
	_, err := c.Write([]byte{1})
	return err
}

// tcpPingPong sends each message and waits for its echo; the latency is
// half the round trip, with perftest's statistics.
func tcpPingPong(c net.Conn, p Params) (*Result, error) {
	buf := make([]byte, p.Size)
	posted := stamps(p.total())
	t0 := time.Now()
	var cpu0 time.Duration
	for i := range p.total() {
		if i == p.Warmup {
			cpu0, _ = processCPU()
		}
		posted[i] = int64(time.Since(t0))
		if _, err := c.Write(buf); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return nil, err
		}
	}
	cpu1, ok := processCPU()
	lat, _ := latencyStats(posted[p.Warmup:], true, nil)
	r := &Result{Lat: &lat}
	if ok {
		r.CPU = &CPU{ClientUs: float64(cpu1-cpu0) / 1e3 / float64(p.Iters), SameProcess: true}
	}
	return r, nil
}

// tcpStream writes the messages, one write each, and waits for the
// server's byte that says it has read them all.
func tcpStream(c net.Conn, p Params) (*Result, error) {
	buf := make([]byte, p.Size)
	var start time.Time
	var cpu0 time.Duration
	for i := range p.total() {
		if i == p.Warmup {
			start = time.Now()
			cpu0, _ = processCPU()
		}
		if _, err := c.Write(buf); err != nil {
			return nil, err
		}
	}
	var ack [1]byte
	if _, err := io.ReadFull(c, ack[:]); err != nil {
		return nil, err
	}
	secs := time.Since(start).Seconds()
	cpu1, ok := processCPU()
	if secs <= 0 {
		return nil, errors.New("the stream took no time")
	}
	r := &Result{BW: &Bandwidth{
		AvgMiBps: float64(p.Size) * float64(p.Iters) / secs / (1 << 20),
		Mpps:     float64(p.Iters) / secs / 1e6,
	}}
	if ok {
		r.CPU = &CPU{ClientUs: float64(cpu1-cpu0) / 1e3 / float64(p.Iters), SameProcess: true}
	}
	return r, nil
}
