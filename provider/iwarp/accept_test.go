package iwarp_test

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/provider/iwarp/wire"
)

// TestAcceptSeesContextEnd: Accept returns when its context ends even
// while a client that connected says nothing (it waited out the MPA
// Request's 10 s setup timeout).
func TestAcceptSeesContextEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, done := acceptRaw(t, ctx, nil) // the client says nothing
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Accept: %v, want the context's end", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept did not return 5 s after its context ended")
	}
}

// acceptRaw listens on a loopback port, runs the listener's Accept(ctx)
// in a goroutine, which hands a request to then (when not nil) and sends
// the error of either to accepted, and dials the listener as a raw TCP
// client: nc. The listener and nc close when the test ends.
func acceptRaw(t testing.TB, ctx context.Context, then func(*cm.Request) error) (nc net.Conn, accepted <-chan error) {
	t.Helper()
	l, err := cm.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	done := make(chan error, 1)
	go func() {
		r, err := l.Accept(ctx)
		if err == nil && then != nil {
			err = then(r)
		}
		done <- err
	}()
	if nc, err = net.Dial("tcp", l.Addr()[len("tcp://"):]); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc, done
}

// TestSilentClientHoldsUpNoOther: a client that connects and says
// nothing does not hold up the one behind it (the listener read one MPA
// Request at a time, and waited out the silent one's 10 s).
func TestSilentClientHoldsUpNoOther(t *testing.T) {
	v := newVictim(t, 4)
	silent, err := net.Dial("tcp", v.l.Addr()[len("tcp://"):])
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	start := time.Now()
	dialHostile(t, v, false, false, false)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the connection behind a silent one was accepted after %v", d)
	}
}

// TestAcceptFailingAfterStartClosesOnce: an initiator that completes MPA
// but closes before its RTR ends the connection once it has started.
// The connection's descriptors must be closed once: were both Accept's
// failure path and the receive goroutine to close the socket's, the
// second close would hit whoever had reused the number (here, the test's
// own descriptors, which a goroutine keeps opening).
func TestAcceptFailingAfterStartClosesOnce(t *testing.T) {
	maxFD := func() int {
		d, _ := os.ReadDir("/proc/self/fd")
		m := 0
		for _, e := range d {
			if n, err := strconv.Atoi(e.Name()); err == nil && n > m {
				m = n
			}
		}
		return m
	}
	v := newVictim(t, 4)
	h := dialHostile(t, v, false, false, true) // no RTR: the connection is started
	limit := maxFD()
	var stop atomic.Bool
	got := make(chan []int)
	go func() {
		var kept []int
		for !stop.Load() {
			fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				continue
			}
			if fd <= limit {
				kept = append(kept, fd) // a number the victim freed
			} else {
				unix.Close(fd)
			}
		}
		got <- kept
	}()
	h.nc.Close()
	if err := <-v.accepted; err == nil {
		select {
		case <-v.conn.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the connection goes on after the initiator closed before its RTR")
		}
	}
	stop.Store(true)
	kept := <-got
	for _, fd := range kept {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			t.Errorf("descriptor %d, opened by the test, was closed under it: %v", fd, err)
		} else {
			unix.Close(fd)
		}
	}
}

// TestMalformedFirstFPDUGetsTerminate: the accepting side sends nothing
// before the first FPDU arrives; a first FPDU that is malformed (here an
// unknown opcode, with no RTR negotiated) must still get its Terminate
// rather than a silent close after terminateTimeout.
func TestMalformedFirstFPDUGetsTerminate(t *testing.T) {
	v := newVictim(t, 4)
	h := dialHostile(t, v, false, false, true)
	b := h.untagged(wire.OpSend, wire.QNSend, 0)
	b[3] = b[3]&^0xf | 0xd // an opcode RDMAP does not define
	h.send(h.fpdu(b, nil))
	h.expectTerminate(wire.LayerRDMAP, wire.RDMAPRemoteOperation, wire.RDMAPUnexpectedOpcode)
	h.nc.Close() // the victim drains until the peer closes
	<-v.accepted
}
