package perftest

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// loopbackListener listens on a TCP port of the loopback, closed when the
// test ends.
func loopbackListener(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// TestMeasureIdleOverTCP measures idle TCP connections on loopback: the
// figure covers the window and all of them, and no connection or
// goroutine outlives the call (TestMain's goleak).
func TestMeasureIdleOverTCP(t *testing.T) {
	l := loopbackListener(t)
	var d net.Dialer
	idle, err := MeasureIdle(context.Background(), l, func(ctx context.Context, a string) (net.Conn, error) {
		return d.DialContext(ctx, "tcp", a)
	}, 5, time.Millisecond, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if idle.Conns != 5 || idle.Seconds < 0.02 || idle.Cores < 0 || idle.PerConn != idle.Cores/5 {
		t.Errorf("%+v: want 5 connections over at least 20ms, the cores shared among them", *idle)
	}
}

// TestMeasureIdleDialFails returns the dialler's error and leaves nothing
// behind.
func TestMeasureIdleDialFails(t *testing.T) {
	l := loopbackListener(t)
	refused := errors.New("refused")
	_, err := MeasureIdle(context.Background(), l, func(context.Context, string) (net.Conn, error) { return nil, refused }, 3, 0, time.Millisecond)
	if !errors.Is(err, refused) {
		t.Fatalf("got %v, want the dialler's error", err)
	}
	if err := goleak.Find(); err != nil {
		t.Fatalf("after a failed dial: %v", err)
	}
	if _, err := MeasureIdle(context.Background(), l, nil, 0, 0, time.Millisecond); err == nil {
		t.Fatal("no connections: no error")
	}
}

// TestMeasureIdleBrokenConnection returns the error of a connection that
// fails its first exchange, and leaves no goroutine or connection behind.
func TestMeasureIdleBrokenConnection(t *testing.T) {
	l := loopbackListener(t)
	var d net.Dialer
	_, err := MeasureIdle(context.Background(), l, func(ctx context.Context, a string) (net.Conn, error) {
		c, err := d.DialContext(ctx, "tcp", a)
		if err == nil {
			c.Close() // its Write fails
		}
		return c, err
	}, 3, 0, time.Millisecond)
	if err == nil {
		t.Fatal("a closed connection measured without error")
	}
	if err := goleak.Find(); err != nil {
		t.Fatalf("left behind: %v", err)
	}
}
