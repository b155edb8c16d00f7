package shm

import (
	"context"
	"testing"
	"time"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// untilTrue waits, polling each millisecond, until cond holds; it fails
// the test after limit.
func untilTrue(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", limit, what)
		}
		<-tick.C
	}
}

// TestNotifyDespitePeerDisarming: the arming of a CQ lives in its shared
// header, which a peer can write. A peer that clears it after this
// process's CQ.Wait armed the CQ keeps the producers from waking the
// waiter; the waiter must still find the completion (within
// notifyRecheck) instead of sleeping until the caller's deadline.
func TestNotifyDespitePeerDisarming(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	h := header(connOf(driverQP(p.B.(*verbstest.Local).QPs[0])).cqSeg.mem) // the peer's view of A's receive CQ
	vcq := driverQP(p.A.QPs[0]).recvCQ
	rbuf := newRegion(t, p.A, 4096, verbs.AccessLocalWrite)
	postRecv(t, p.A, 0, recv(7, rbuf.SGE(0, 64)))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type result struct {
		n   int
		wc  verbs.WorkCompletion
		err error
	}
	res := make(chan result, 1)
	go func() {
		wc := make([]verbs.WorkCompletion, 4)
		n, err := p.A.RecvCQ.Wait(ctx, wc)
		res <- result{n, wc[0], err}
	}()
	untilTrue(t, 5*time.Second, "CQ.Wait never armed the CQ", func() bool {
		return vcq.armings.Load() > 0 && h.armed.Load() != unarmed
	})
	h.armed.Store(unarmed) // the peer disarms the CQ
	// A completion this process produces itself: the flush of the
	// receive, as the QP moves to the error state.
	if err := p.A.QPs[0].Modify(&verbs.QPAttr{State: verbs.QPSErr}, verbs.QPAttrState); err != nil {
		t.Fatal(err)
	}
	r := <-res
	if r.err != nil || r.n != 1 {
		t.Fatalf("CQ.Wait with a completion in the CQ: %d completions, %v", r.n, r.err)
	}
	expectWC(t, r.wc, 7, verbs.WCWRFlushErr)
}

// TestNotifyWaiterStopsWithoutWake: Destroy stops the CQ's notification
// goroutine by bumping the shared futex word and sending a byte to the
// CQ's notification socket; a peer that puts the word back and has
// filled the socket, so that the byte is dropped, at that moment must
// not leave the goroutine (and Destroy, which waits for it) parked for
// good.
func TestNotifyWaiterStopsWithoutWake(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	c := driverQP(p.A.QPs[0]).recvCQ
	before := notifiers()
	if err := c.ReqNotify(false); err != nil {
		t.Fatal(err)
	}
	if st := notifierState(t, before); st != "IO wait" {
		t.Fatalf("armed, the notification goroutine is in state %q, want IO wait (parked on the CQ's notification socket)", st)
	}
	// As Destroy, with the word's bump undone and the byte dropped.
	c.stop.Store(true)
	c.nudgeWaiter()
	done := make(chan struct{})
	go func() {
		c.waiter.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the notification goroutine stayed parked after it was told to stop")
	}
}
