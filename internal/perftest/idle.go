package perftest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// Idle is what connections that are open and unused cost the process
// they are in: the CPU it used over a window in which it did nothing but
// keep them (both ends of each) open.
type Idle struct {
	// Stack and Device name what carried the connections (rsock on shm0,
	// go on tcp, ...).
	Stack     string `json:"stack"`
	Device    string `json:"device,omitempty"`
	Transport string `json:"transport,omitempty"`
	// Conns is how many connections were open, Seconds how long the
	// window was.
	Conns   int     `json:"conns"`
	Seconds float64 `json:"seconds"`
	// Cores is the CPU time used over the window, in cores (1 is one
	// core busy all the time), for all the connections together;
	// PerConn is that divided by Conns.
	Cores   float64 `json:"cores"`
	PerConn float64 `json:"cores_per_conn"`
}

// MeasureIdle opens n connections from dial to l, sends one byte each
// way on each (so that each has run its data path and whatever it does
// after a message, such as polling for the next before it parks), lets
// them settle for settle, and then measures the process's CPU time over
// window while they stay open and unused. The caller fills in the
// result's names. A process that does other work meanwhile adds it to the
// figure: run it alone. On an error MeasureIdle closes l; either way no
// connection or goroutine of its own outlives it.
func MeasureIdle(ctx context.Context, l net.Listener, dial func(context.Context, string) (net.Conn, error), n int, settle, window time.Duration) (*Idle, error) {
	if n < 1 || window <= 0 {
		return nil, fmt.Errorf("perftest: idle: %d connections over %v: give at least one over a positive window", n, window)
	}
	type accepted struct {
		c   net.Conn
		err error
	}
	acc := make(chan accepted, n)
	accepting := make(chan struct{})
	go func() {
		defer close(accepting)
		for range n {
			c, err := l.Accept()
			acc <- accepted{c, err}
			if err != nil {
				return
			}
		}
	}()
	conns := make([]net.Conn, 0, 2*n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	// fail ends the accepting goroutine (closing l) and closes what it
	// accepted that the loop did not take.
	fail := func(err error) (*Idle, error) {
		l.Close()
		<-accepting
		close(acc)
		for a := range acc {
			if a.c != nil {
				a.c.Close()
			}
		}
		return nil, err
	}
	var b [1]byte
	for i := range n {
		c, err := dial(ctx, l.Addr().String())
		if err != nil {
			return fail(fmt.Errorf("idle: connection %d of %d: %w", i+1, n, err))
		}
		conns = append(conns, c)
		var a accepted
		select {
		case a = <-acc:
		case <-ctx.Done():
			return fail(ctx.Err())
		}
		if a.err != nil {
			return fail(fmt.Errorf("idle: accepting connection %d of %d: %w", i+1, n, a.err))
		}
		conns = append(conns, a.c)
		if deadline, ok := ctx.Deadline(); ok {
			c.SetDeadline(deadline)
			a.c.SetDeadline(deadline)
		}
		if err := echoByte(c, a.c, b[:]); err != nil {
			return fail(fmt.Errorf("idle: connection %d of %d: %w", i+1, n, err))
		}
	}
	<-accepting
	if err := sleepCtx(ctx, settle); err != nil {
		return nil, err
	}
	cpu0, ok := processCPU()
	if !ok {
		return nil, errors.New("perftest: idle: this system does not report the process's CPU time")
	}
	t0 := time.Now()
	if err := sleepCtx(ctx, window); err != nil {
		return nil, err
	}
	cpu1, _ := processCPU()
	elapsed := time.Since(t0)
	cores := float64(cpu1-cpu0) / float64(elapsed)
	return &Idle{Conns: n, Seconds: elapsed.Seconds(), Cores: cores, PerConn: cores / float64(n)}, nil
}

// echoByte sends b's one byte from c to s and back.
func echoByte(c, s net.Conn, b []byte) error {
	if _, err := c.Write(b); err != nil {
		return err
	}
	if _, err := io.ReadFull(s, b); err != nil {
		return err
	}
	if _, err := s.Write(b); err != nil {
		return err
	}
	_, err := io.ReadFull(c, b)
	return err
}

// sleepCtx waits d, or until ctx ends, and returns ctx's error then.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
