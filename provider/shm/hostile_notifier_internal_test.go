package shm

import (
	"context"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// hostileBound is how long a call a hostile peer tries to block may take
// before the test calls it blocked.
const hostileBound = 10 * time.Second

// fillNotifier makes the notifier socket fd blocking, as a holder of the
// same open file may, and sends on it until the CQ's notification
// socket is full.
func fillNotifier(t *testing.T, fd int) {
	t.Helper()
	if err := unix.SetNonblock(fd, false); err != nil {
		t.Fatal(err)
	}
	for {
		if err := unix.Send(fd, []byte{1}, unix.MSG_DONTWAIT); err != nil {
			if err != unix.EAGAIN {
				t.Fatal(err)
			}
			return
		}
	}
}

// returnsWithin fails the test if call does not return within
// hostileBound.
func returnsWithin(t *testing.T, what string, call func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		call()
	}()
	select {
	case <-done:
	case <-time.After(hostileBound):
		t.Fatalf("%s blocked for %v", what, hostileBound)
	}
}

// TestHostileCQOwnerCannotBlockPostSend: the owner of a CQ that a QP's
// Sends complete into fills the CQ's notification socket, makes the
// notifier it handed over blocking, and says in the CQ's shared header
// that it is armed and waits: the peer's PostSend, which notifies the
// CQ, still returns at once.
func TestHostileCQOwnerCannotBlockPostSend(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	rbuf := newRegion(t, p.A, 4096, verbs.AccessLocalWrite)
	sbuf := newRegion(t, p.B, 64, verbs.AccessLocalWrite)
	postRecv(t, p.A, 0, recv(7, rbuf.SGE(0, 64)))
	// B's notifier of A's CQ: the same open file as the owner's copy
	// would be, had it kept one.
	fillNotifier(t, connOf(driverQP(p.B.(*verbstest.Local).QPs[0])).peerNotify.notifier.fd)
	h := driverQP(p.A.QPs[0]).recvCQ.ring.h
	h.eventWaiter.Store(1)
	h.armed.Store(armedAny)
	returnsWithin(t, "PostSend notifying a CQ whose notification socket is full", func() {
		postSend(t, p.B, 0, send(1, sbuf.SGE(0, 16)))
	})
	expectWC(t, waitWCs(t, p.A, verbstest.RecvCQ, 1)[0], 7, verbs.WCSuccess)
}

// TestHostilePeerCannotBlockCQDestroy: a peer that fills a CQ's
// notification socket through its notifier leaves the owner's Destroy
// of the CQ, which notifies it, free to return.
func TestHostilePeerCannotBlockCQDestroy(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	fillNotifier(t, connOf(driverQP(p.B.(*verbstest.Local).QPs[0])).peerNotify.notifier.fd)
	c := driverQP(p.A.QPs[0]).recvCQ
	if err := c.ReqNotify(false); err != nil {
		t.Fatal(err)
	}
	returnsWithin(t, "Destroy of a CQ whose notification socket is full", func() { c.Destroy() })
}

// TestSleepRacesDestroy: a CQ.Wait whose thread sleeps, or is about to,
// when the CQ is destroyed returns, and the sleep touches no shared
// memory after Destroy unmapped it (which would fault).
func TestSleepRacesDestroy(t *testing.T) {
	vctx, err := verbs.Open(DeviceName)
	if err != nil {
		t.Fatal(err)
	}
	defer vctx.Close()
	for i := range 300 {
		cq, err := vctx.CreateCQ(4)
		if err != nil {
			t.Fatal(err)
		}
		res := make(chan error, 1)
		go func() {
			_, err := cq.Wait(context.Background(), make([]verbs.WorkCompletion, 1))
			res <- err
		}()
		// Destroy at a different moment of the Wait each round: right
		// away, during its own sleep (up to a millisecond), or after.
		for end := time.Now().Add(time.Duration(i%40) * 50 * time.Microsecond); time.Now().Before(end); {
		}
		cq.Destroy()
		if err := <-res; err == nil {
			t.Fatal("Wait on a destroyed CQ returned no error")
		}
	}
}
