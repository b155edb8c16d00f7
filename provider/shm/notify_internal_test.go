package shm

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/driver"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// A producer publishes a completion slot with a release store and then
// checks whether the CQ is armed; on x86 that check can be performed
// before the store is visible, and so miss an arming that comes in
// between. ReqNotify, after it arms, notifies for completions reserved
// before it armed. These tests play such a producer by hand: they
// reserve and publish slots without checking the arming, then arm, and
// look at the CQ's futex word, which every notification changes.

// notifyCQ returns the receive CQ of a fresh pair's A side and its QP.
func notifyCQ(t *testing.T) (*cq, *qp, *verbstest.Pair) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	q := driverQP(p.A.QPs[0])
	return q.recvCQ, q, p
}

// reserve takes the next slot of a QP's receive completion ring as a
// producer does, without publishing it.
func reserve(t *testing.T, r *cqRing) uint64 {
	t.Helper()
	pos := r.h.tail.Load()
	if !r.h.tail.CompareAndSwap(pos, pos+1) {
		t.Fatal("the CQ ring's tail moved under the test")
	}
	return pos
}

func recvWC(wrid uint64, flags driver.WCFlags) *driver.WorkCompletion {
	return &driver.WorkCompletion{WRID: wrid, Opcode: driver.WCRecv, Flags: flags}
}

// expectNotified checks whether ReqNotify(solicitedOnly) notified.
func expectNotified(t *testing.T, c *cq, solicitedOnly, want bool, what string) {
	t.Helper()
	w := c.ring.h.wake.Load()
	if err := c.ReqNotify(solicitedOnly); err != nil {
		t.Fatal(err)
	}
	if got := c.ring.h.wake.Load() != w; got != want {
		t.Fatalf("%s: notified %v, want %v", what, got, want)
	}
}

// drain polls the CQ until it is empty and returns how many it took.
func drain(c *cq) int {
	wc := make([]driver.WorkCompletion, 8)
	n := 0
	for k := c.Poll(wc); k > 0; k = c.Poll(wc) {
		n += k
	}
	return n
}

// TestReqNotifySeesReservedCompletions: a completion published by a
// producer that did not see the arming is notified for by ReqNotify — in
// a QP's receive completion ring and in the private one of sends, armed
// for any completion or for solicited ones only (then only if it is
// solicited or failed).
func TestReqNotifySeesReservedCompletions(t *testing.T) {
	c, q, p := notifyCQ(t)
	drain(c)
	expectNotified(t, c, false, false, "an empty CQ")
	drain(c)

	// The receives the completions below complete, at positions 0, 1, 2
	// (their WRID fields).
	buf := newRegion(t, p.A, 64, verbs.AccessLocalWrite)
	for i := range 3 {
		postRecv(t, p.A, 0, recv(uint64(i), buf.SGE(16*i, 16)))
	}
	r := q.sh.cring
	pos := reserve(t, r)
	r.slots[pos&r.mask].publish(recvWC(0, 0), nil, pos)
	expectNotified(t, c, false, true, "a receive completion published unseen, armed for any")
	if n := drain(c); n != 1 {
		t.Fatalf("polled %d completions, want 1", n)
	}

	pos = reserve(t, r)
	r.slots[pos&r.mask].publish(recvWC(1, 0), nil, pos)
	expectNotified(t, c, true, false, "an unsolicited receive completion, armed for solicited ones")
	drain(c)
	c.ring.h.armed.Store(unarmed)
	pos = reserve(t, r)
	r.slots[pos&r.mask].publish(recvWC(2, driver.WCSolicited), nil, pos)
	expectNotified(t, c, true, true, "a solicited receive completion, armed for solicited ones")
	drain(c)

	// The private ring of send completions, as qp.Complete fills it
	// before it checks the arming.
	sc := q.sendCQ
	produceSend := func(wrid uint64, status driver.WCStatus) {
		t.Helper()
		if !sc.local.produce(q, 1<<40, wrid, status, driver.WCRDMAWrite, 0, sc.shared.Load()) {
			t.Fatal("the send CQ is full")
		}
	}
	drain(sc)
	sc.ring.h.armed.Store(unarmed)
	produceSend(4, driver.WCSuccess)
	expectNotified(t, sc, false, true, "a send completion published unseen, armed for any")
	drain(sc)
	produceSend(5, driver.WCSuccess)
	expectNotified(t, sc, true, false, "a successful send completion, armed for solicited ones")
	drain(sc)
	sc.ring.h.armed.Store(unarmed)
	produceSend(6, driver.WCRemAccessErr)
	expectNotified(t, sc, true, true, "a failed send completion, armed for solicited ones")
	drain(sc)
}

// TestWaitSleepsDespiteReservedSlot: a peer that reserves a slot of this
// process's receive completion ring and never publishes it (a hostile one, or one killed
// in between) neither makes ReqNotify notify for it nor keeps CQ.Wait
// from sleeping.
func TestWaitSleepsDespiteReservedSlot(t *testing.T) {
	c, q, p := notifyCQ(t)
	drain(c)
	reserve(t, q.sh.cring)
	expectNotified(t, c, false, false, "a slot reserved and never published")
	c.ring.h.armed.Store(unarmed)

	const window = 300 * time.Millisecond
	before := processCPU(t)
	ctx, cancel := context.WithTimeout(context.Background(), window)
	defer cancel()
	wc := make([]verbs.WorkCompletion, 1)
	if n, err := p.A.RecvCQ.Wait(ctx, wc); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait returned %d completions, %v; want the deadline", n, err)
	}
	if used := processCPU(t) - before; used > window/3 {
		t.Fatalf("the process used %v of CPU in a %v Wait on a CQ with a slot reserved and never published", used, window)
	}
}
