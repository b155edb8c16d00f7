package perftest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
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

// runGoTCP runs the ping-pong or the stream of p on a fresh loopback
// connection.
func runGoTCP(ctx context.Context, p Params) (*Result, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer l.Close()
	srvErr := make(chan error, 1)
	go func() { srvErr <- serveGoTCP(ctx, l, p) }()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", l.Addr().String())
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	var r *Result
	if p.Test == SendLat {
		r, err = tcpPingPong(c, p)
	} else {
		r, err = tcpStream(c, p)
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

// serveGoTCP is the server: it echoes each message of the ping-pong, or
// reads the whole stream and answers with one byte.
func serveGoTCP(ctx context.Context, l net.Listener, p Params) error {
	c, err := l.Accept()
	if err != nil {
		return err
	}
	defer c.Close()
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
	_, err = c.Write([]byte{1})
	return err
}

// tcpPingPong sends each message and waits for its echo; the latency is
// half the round trip, with perftest's statistics.
func tcpPingPong(c net.Conn, p Params) (*Result, error) {
	buf := make([]byte, p.Size)
	posted := make([]int64, p.total())
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
