package shm

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/driver"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// spinSink keeps the busy loops below from being optimised away.
var spinSink atomic.Uint64

// TestPostRecvRacingDestroy: a PostRecv that read the QP's state before
// a concurrent Destroy published it is still writing the receive ring
// when Destroy unmaps the block that holds the ring; Destroy must wait
// it out, or PostRecv faults in recvRing.produce.
func TestPostRecvRacingDestroy(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	a := p.A
	rbuf := newRegion(t, p.A, 4096, verbs.AccessLocalWrite)
	const n = 1 << 13
	wrs := make([]verbs.RecvWR, n)
	for i := range wrs {
		wrs[i] = recv(uint64(i), rbuf.SGE(0, 64))
	}
	for it := range 100 {
		q, err := a.PD.CreateQP(verbs.QPInitAttr{SendCQ: a.SendCQ, RecvCQ: a.RecvCQ,
			Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: n, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if err := toInit(q); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		started := make(chan struct{})
		wg.Go(func() {
			close(started)
			q.PostRecv(wrs) // all of them, or ErrClosed: either is right
		})
		<-started
		for i := range it % 50 * 200 { // vary where in the post Destroy lands
			spinSink.Add(uint64(i))
		}
		if err := q.Destroy(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
	}
}

// TestHandshakeOfDestroyedQPSendsNothing: a QP destroyed while cm makes
// its handshake (Dial, or Accept after the move to RTR) has no
// descriptors to hand the peer: makeHello fails with ErrClosed rather
// than send descriptor numbers its Destroy closed, which the process may
// have reused for other files since.
func TestHandshakeOfDestroyedQPSendsNothing(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	q, err := p.A.PD.CreateQP(verbs.QPInitAttr{SendCQ: p.A.SendCQ, RecvCQ: p.A.RecvCQ,
		Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	dq := driverQP(q)
	epoch, err := dq.ctx.epochs.alloc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer epoch.release()
	h, fds, err := makeHello(msgReq, dq, driver.ConnParam{}, epoch)
	if err != nil || h == nil {
		t.Fatalf("the handshake of a live QP: %v", err)
	}
	closeFDs(fds)
	if err := q.Destroy(); err != nil {
		t.Fatal(err)
	}
	if _, fds, err := makeHello(msgReq, dq, driver.ConnParam{}, epoch); !errors.Is(err, driver.ErrClosed) || fds != nil {
		closeFDs(fds)
		t.Fatalf("the handshake of a destroyed QP: %d descriptors, error %v; want none, ErrClosed", len(fds), err)
	}
}
