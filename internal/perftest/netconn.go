package perftest

import (
	"context"
	"fmt"
	"net"
	"time"
)

// RunConn runs the Go TCP peer's program over any connected pair of
// net.Conns, client measuring and server (a goroutine) answering: for
// SendLat a ping-pong of p.Size-byte messages (half the round trip, with
// perftest's statistics), for SendBW a stream of p.Size-byte writes. It
// fills the result's figures and Iters; the caller names its source.
func RunConn(ctx context.Context, client, server net.Conn, p Params) (*Result, error) {
	if p.Test != SendLat && p.Test != SendBW {
		return nil, fmt.Errorf("perftest: %v over a net.Conn: only send_lat and send_bw run over a stream", p.Test)
	}
	srvErr := make(chan error, 1)
	go func() { srvErr <- serveGoTCP(ctx, server, p) }()
	r, err := goTCPClient(ctx, client, p, srvErr)
	if err != nil {
		return nil, err
	}
	r.Test, r.Size = p.Test, p.Size
	return r, nil
}

// PingPong runs warmup and then iters round trips of call, and returns
// perftest's latency figures of half the round trip and the process's
// CPU time per iteration, as the ping-pong tests report them.
func PingPong(iters, warmup int, call func() error) (*Result, error) {
	posted := stamps(warmup + iters + 1)
	var cpu0 time.Duration
	t0 := time.Now()
	for i := range warmup + iters + 1 {
		if i == warmup {
			cpu0, _ = processCPU()
		}
		posted[i] = int64(time.Since(t0))
		if i == warmup+iters {
			break
		}
		if err := call(); err != nil {
			return nil, err
		}
	}
	cpu1, ok := processCPU()
	lat, _ := latencyStats(posted[warmup:], true, nil)
	r := &Result{Lat: &lat, Iters: iters}
	if ok {
		r.CPU = &CPU{ClientUs: float64(cpu1-cpu0) / 1e3 / float64(iters), SameProcess: true}
	}
	return r, nil
}
