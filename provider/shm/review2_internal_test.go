package shm

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/driver"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// Regressions from the second adversarial review (1 December, night).

// spinSink keeps the busy loops below from being optimised away.
var spinSink atomic.Uint64

// TestPostRecvRacingDestroy: a PostRecv that read the QP's state before
// a concurrent Destroy published it is still writing the receive ring
// when Destroy unmaps the block that holds the ring; Destroy must wait
// it out (before the fix: a fault in recvRing.produce).
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

// TestWriteImmFailedCopyCompletesReceive: an RDMA Write with immediate
// takes the responder's receive before it copies; when the copy then
// fails (the target is process memory whose pages are gone), that
// receive must still complete — flushed, as the responder's QP moves to
// the error state — rather than vanish from the ring unreported.
func TestWriteImmFailedCopyCompletesReceive(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	b := p.B.(*verbstest.Local)
	buf, err := unix.Mmap(-1, 0, 1<<16, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	mr, err := b.PD.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		unix.Munmap(buf)
		t.Fatal(err)
	}
	defer mr.Dereg()
	addr := uint64(uintptr(unsafe.Pointer(&buf[0])))
	if err := unix.Munmap(buf); err != nil { // the registered pages go away
		t.Fatal(err)
	}
	rbuf := newRegion(t, p.B, 4096, verbs.AccessLocalWrite)
	postRecv(t, p.B, 0, recv(42, rbuf.SGE(0, 64)))
	src := newRegion(t, p.A, 4096, verbs.AccessLocalWrite)
	postSend(t, p.A, 0, verbs.SendWR{WRID: 1, Opcode: verbs.OpRDMAWriteWithImm, Flags: verbs.SendSignaled, Imm: 5,
		SGList: []verbs.SGE{src.SGE(0, 64)}, RemoteAddr: addr, RKey: mr.RKey()})
	expectWC(t, waitWCs(t, p.A, verbstest.SendCQ, 1)[0], 1, verbs.WCRemAccessErr)
	wc := waitWCs(t, p.B, verbstest.RecvCQ, 1)[0]
	expectWC(t, wc, 42, verbs.WCWRFlushErr)
}

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
	wake := uintptr(unsafe.Pointer(&vcq.ring.h.wake))
	untilTrue(t, 5*time.Second, "CQ.Wait never armed the CQ and slept on its word", func() bool {
		_, asleep := futexSleeper(wake)
		return vcq.armings.Load() > 0 && h.armed.Load() != unarmed && asleep
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
// goroutine by bumping the shared futex word; a peer that puts the word
// back at that moment must not leave the goroutine (and Destroy, which
// waits for it) asleep for good.
func TestNotifyWaiterStopsWithoutWake(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	c := driverQP(p.A.QPs[0]).recvCQ
	if err := c.ReqNotify(false); err != nil {
		t.Fatal(err)
	}
	wake := uintptr(unsafe.Pointer(&c.ring.h.wake))
	untilTrue(t, 5*time.Second, "the notification goroutine never slept on the CQ's word", func() bool {
		_, asleep := futexSleeper(wake)
		return asleep
	})
	// As Destroy, with the word's bump undone by the peer.
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
		t.Fatal("the notification goroutine kept sleeping on an unchanged word after it was told to stop")
	}
}

// TestForgedReceiveCompletionsSanitized: a peer writes receive
// completions into this process's CQ ring, and may write anything. What
// Poll hands the application says only what a receive completion of
// shm0 can: a known status, a receive's opcode, the immediate and
// solicited flags alone, and for a success no more bytes than a message
// may have; anything else comes out failed, with no byte count.
func TestForgedReceiveCompletionsSanitized(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	bq := driverQP(p.B.(*verbstest.Local).QPs[0])
	aq := driverQP(p.A.QPs[0])
	ring := viewCQRing(connOf(bq).cqSeg.mem, aq.recvCQ.n) // the peer's view of A's receive CQ
	forged := []driver.WorkCompletion{
		{WRID: 1, Opcode: 77, ByteLen: 8, QPNum: aq.num},
		{WRID: 2, Opcode: driver.WCRecv, ByteLen: 0xffffffff, QPNum: aq.num},
		{WRID: 3, Opcode: driver.WCRecv, ByteLen: 8, QPNum: aq.num, Flags: driver.WCWithInv | 0x80, InvalidatedRKey: 5},
		{WRID: 4, Opcode: driver.WCRecv, Status: 200, QPNum: aq.num},
	}
	for i := range forged {
		if !ring.produce(&forged[i]) {
			t.Fatal("the ring is full")
		}
	}
	wc := make([]verbs.WorkCompletion, 8)
	if n := p.A.RecvCQ.Poll(wc); n != len(forged) {
		t.Fatalf("Poll returned %d completions, want %d", n, len(forged))
	}
	for i, w := range wc[:len(forged)] {
		if w.Opcode != verbs.WCRecv && w.Opcode != verbs.WCRecvRDMAWithImm {
			t.Errorf("completion %d: opcode %v", i, w.Opcode)
		}
		if w.Flags&^(verbs.WCWithImm|verbs.WCSolicited) != 0 || w.InvalidatedRKey != 0 {
			t.Errorf("completion %d: flags %v, invalidated key %#x", i, w.Flags, w.InvalidatedRKey)
		}
		if w.Status > verbs.WCGeneralErr {
			t.Errorf("completion %d: status %d", i, w.Status)
		}
	}
	for _, i := range []int{0, 1} {
		if wc[i].Status == verbs.WCSuccess || wc[i].ByteLen != 0 {
			t.Errorf("forged completion %d came out %+v; want a failure with no byte count", i, wc[i])
		}
	}
	if wc[2].Status != verbs.WCSuccess || wc[2].ByteLen != 8 || wc[2].Flags != 0 {
		t.Errorf("a plausible completion came out %+v; want a success of 8 bytes with no flags", wc[2])
	}
}
