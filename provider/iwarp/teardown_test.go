package iwarp_test

import (
	"net"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/provider/iwarp"
)

// TestNoDescriptorLeakAfterDestroyOrReset: QPs destroyed without a
// disconnect, and connections the peer resets, leave no descriptor open.
func TestNoDescriptorLeakAfterDestroyOrReset(t *testing.T) {
	for _, mode := range []string{"destroy", "reset"} {
		round := func() {
			t.Run(mode, func(t *testing.T) {
				if mode == "destroy" {
					a, b, _, _ := connectPair(t, 4096, nil, nil)
					for _, e := range []*pairEnd{a, b} {
						if err := e.qp.Destroy(); err != nil {
							t.Fatal(err)
						}
					}
					return
				}
				v := newVictim(t, 4)
				h := dialHostile(t, v, false, false, false)
				h.nc.(*net.TCPConn).SetLinger(0) // close with a reset
				h.nc.Close()
				select {
				case <-v.conn.Done():
				case <-time.After(5 * time.Second):
					t.Fatal("the connection did not end after the peer reset it")
				}
				if err := v.e.QPs[0].Destroy(); err != nil {
					t.Fatal(err)
				}
			})
		}
		leavesNoDescriptor(t, mode, 10, round)
	}
}

// TestConcurrentAbortWaitsForWriter: while one abort (a Close, Destroy or
// Modify to the error state) waits for a system call announced on the
// socket (a writev between sock.enter and its call), the receive
// goroutine ends (a poller's kick finds the connection aborted). Its own
// abort must wait too: rxLoop closes the socket's descriptor right after
// it, which would leave the writev to run on a closed, or reused,
// descriptor number: a second abort that returned at once would close
// the descriptor under the writer in every run.
func TestConcurrentAbortWaitsForWriter(t *testing.T) {
	_, b, _, _ := connectPair(t, 4096, nil, nil)
	fd, aborted, end, ok := iwarp.AbortWithSocketCallHeld(b.qp.Driver())
	if !ok {
		t.Fatal("no live connection to hold a system call on")
	}
	// Nothing signals that the descriptor was not closed: look for a while
	// (the receive goroutine, unblocked, ends within microseconds).
	for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); runtime.Gosched() {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			t.Errorf("descriptor %d closed while a system call on it was announced: %v", fd, err)
			break
		}
	}
	select {
	case <-aborted:
		t.Error("the first abort returned while a system call on the socket was announced")
	default:
	}
	end()
	<-aborted
}
