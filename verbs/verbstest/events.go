package verbstest

import (
	"testing"
	"time"

	"github.com/goverbs/goverbs/verbs"
)

// expectResponderEvent checks that B raised an asynchronous event of type
// typ naming its QP 0, and (within shortWait) no second one.
func expectResponderEvent(t *testing.T, p *Pair, typ verbs.EventType) {
	t.Helper()
	qp, ok, err := p.B.QPEvent(typ, timeout)
	if err != nil {
		t.Fatalf("waiting for %q on B: %v", typ, err)
	}
	if !ok {
		t.Fatalf("no %q on B within %v", typ, timeout)
	}
	if qp != 0 {
		t.Fatalf("%q on B names QP %d, want B's QP 0", typ, qp)
	}
	if _, again, err := p.B.QPEvent(typ, shortWait); err != nil || again {
		t.Fatalf("a second %q on B (error %v)", typ, err)
	}
	expectNoErrorEvent(t, p.A)
}

// expectNoErrorEvent checks that e, the requester, raised neither of the
// responder's affiliated errors: it learns of the responder's refusal
// from its completion. (EventQPFatal is allowed: iWARP devices raise it
// for the Terminate message the responder sends.)
func expectNoErrorEvent(t *testing.T, e *Local) {
	t.Helper()
	for {
		select {
		case ev := <-e.asyncEvs:
			switch ev.Type {
			case verbs.EventQPAccessErr, verbs.EventQPReqErr:
				t.Fatalf("the requester raised %q for its own QP: that error is the responder's", ev.Type)
			}
			continue
		default:
		}
		return
	}
}

// testQPAccessErrEvent: a responder that refuses an RDMA Write for a bad
// rkey raises EventQPAccessErr on its QP (the IB specification's local
// access violation work queue error).
func testQPAccessErrEvent(t *testing.T, h Harness) {
	requireCap(t, h, verbs.CapQPErrorEvents, "CapQPErrorEvents")
	p := h.NewPair(t, PairOptions{})
	dst := newRegion(t, p.B, 64, remoteAll)
	src := newRegion(t, p.A, 64, localRW)
	wr := writeWR(1, dst, 0, src.SGE(0, 16))
	wr.RKey = badKey(wr.RKey)
	postSend(t, p.A, 0, wr)
	waitOne(t, p.A, SendCQ)
	expectResponderEvent(t, p, verbs.EventQPAccessErr)
	expectState(t, p.B, 0, verbs.QPSErr)
}

// testQPReqErrEvent: a responder that refuses a Send longer than its
// receive raises EventQPReqErr on its QP (the invalid request work queue
// error).
func testQPReqErrEvent(t *testing.T, h Harness) {
	requireCap(t, h, verbs.CapQPErrorEvents, "CapQPErrorEvents")
	p := h.NewPair(t, PairOptions{})
	src := newRegion(t, p.A, 32, localRW)
	dst := newRegion(t, p.B, 8, localRW)
	postRecv(t, p.B, 0, recvWR(9, dst.SGE(0, 8)))
	postSend(t, p.A, 0, sendWR(1, src.SGE(0, 32)))
	waitOne(t, p.A, SendCQ)
	expectStatus(t, waitOne(t, p.B, RecvCQ), 9, verbs.WCLocLenErr)
	expectResponderEvent(t, p, verbs.EventQPReqErr)
	expectState(t, p.B, 0, verbs.QPSErr)
}

// expectCommEst checks that B raised EventCommEst naming its QP 0 and,
// within shortWait, no second one.
func expectCommEst(t *testing.T, p *Pair) {
	t.Helper()
	qp, ok, err := p.B.QPEvent(verbs.EventCommEst, timeout)
	switch {
	case err != nil:
		t.Fatalf("waiting for %q on B: %v", verbs.EventCommEst, err)
	case !ok:
		t.Fatalf("B's QP in RTR took A's requests and raised no %q within %v", verbs.EventCommEst, timeout)
	case qp != 0:
		t.Fatalf("%q on B names QP %d, want B's QP 0", verbs.EventCommEst, qp)
	}
	expectNoCommEst(t, p.B, "a second time")
}

// expectNoCommEst checks that e raises no EventCommEst within shortWait.
func expectNoCommEst(t *testing.T, e Endpoint, when string) {
	t.Helper()
	if qp, ok, err := e.QPEvent(verbs.EventCommEst, shortWait); err != nil || ok {
		t.Fatalf("%q raised %s, naming QP %d (error %v)", verbs.EventCommEst, when, qp, err)
	}
}

// testCommEst: a QP that cm leaves in RTR (HoldRTR) takes its peer's
// Send, completes the receive, and raises EventCommEst naming it, once,
// however many requests follow (a Write, a Send, a Write with
// immediate); moved to RTS it sends, and raises no second event. A QP
// connected straight to RTS raises none.
func testCommEst(t *testing.T, h Harness) {
	p := heldPair(t, h)
	expectNoCommEst(t, p.B, "before any request came")
	src := newRegion(t, p.A, 64, localRW)
	dst := newRegion(t, p.B, 64, remoteAll)
	data := pattern(29, 32)
	fill(t, p.A, src, 0, data)
	postRecv(t, p.B, 0, recvWR(9, dst.SGE(0, 16)))
	postSend(t, p.A, 0, sendWR(1, src.SGE(0, 16)))
	expectStatus(t, waitOne(t, p.A, SendCQ), 1, verbs.WCSuccess)
	wc := waitOne(t, p.B, RecvCQ)
	expectStatus(t, wc, 9, verbs.WCSuccess)
	if wc.Opcode != verbs.WCRecv || wc.ByteLen != 16 {
		t.Fatalf("B's receive completed as %v of %d bytes, want a receive of 16", wc.Opcode, wc.ByteLen)
	}
	expectBytes(t, p.B, dst, 0, data[:16], "the Send B took in RTR")
	// More requests: a Write and another Send.
	postRecv(t, p.B, 0, recvWR(10, dst.SGE(48, 16)))
	postSend(t, p.A, 0, writeWR(2, dst, 16, src.SGE(16, 16)), sendWR(3, src.SGE(0, 8)))
	expectStatuses(t, wait(t, p.A, SendCQ, 2), verbs.WCSuccess, 2, 3)
	expectStatus(t, waitOne(t, p.B, RecvCQ), 10, verbs.WCSuccess)
	expectBytes(t, p.B, dst, 16, data[16:], "the Write B took in RTR")
	if p.A.Attr().Has(verbs.CapImmData) {
		postRecv(t, p.B, 0, recvWR(12, dst.SGE(56, 8)))
		wr := writeWR(5, dst, 32, src.SGE(0, 8))
		wr.Opcode, wr.Imm = verbs.OpRDMAWriteWithImm, 0x5eed
		postSend(t, p.A, 0, wr)
		expectStatus(t, waitOne(t, p.A, SendCQ), 5, verbs.WCSuccess)
		wc := waitOne(t, p.B, RecvCQ)
		expectStatus(t, wc, 12, verbs.WCSuccess)
		if wc.Opcode != verbs.WCRecvRDMAWithImm || wc.Flags&verbs.WCWithImm == 0 || wc.Imm != 0x5eed {
			t.Fatalf("B's receive of a Write with immediate in RTR completed as %s", fmtWC(wc))
		}
		expectBytes(t, p.B, dst, 32, data[:8], "the Write with immediate B took in RTR")
	}
	expectCommEst(t, p)
	expectNoErrorEvent(t, p.A)
	expectState(t, p.B, 0, verbs.QPSRTR)

	// In RTS B sends, and A's next Send raises nothing.
	if err := p.B.SetQPState(0, verbs.QPSRTS); err != nil {
		t.Fatalf("move B's QP from RTR to RTS: %v", err)
	}
	back := newRegion(t, p.A, 16, localRW)
	postRecv(t, p.A, 0, recvWR(20, back.SGE(0, 16)))
	postSend(t, p.B, 0, sendWR(21, dst.SGE(0, 16)))
	expectStatus(t, waitOne(t, p.B, SendCQ), 21, verbs.WCSuccess)
	expectStatus(t, waitOne(t, p.A, RecvCQ), 20, verbs.WCSuccess)
	expectBytes(t, p.A, back, 0, data[:16], "B's Send once in RTS")
	postRecv(t, p.B, 0, recvWR(11, dst.SGE(0, 16)))
	postSend(t, p.A, 0, sendWR(4, src.SGE(0, 16)))
	expectStatus(t, waitOne(t, p.A, SendCQ), 4, verbs.WCSuccess)
	expectStatus(t, waitOne(t, p.B, RecvCQ), 11, verbs.WCSuccess)
	expectNoCommEst(t, p.B, "after the move to RTS")
	expectNoCommEst(t, p.A, "on A, whose QP was in RTS when B's Send came")

	// A pair connected straight to RTS: its first message raises nothing.
	q := h.NewPair(t, PairOptions{})
	qdst := newRegion(t, q.B, 16, localRW)
	qsrc := newRegion(t, q.A, 16, localRW)
	postRecv(t, q.B, 0, recvWR(9, qdst.SGE(0, 16)))
	postSend(t, q.A, 0, sendWR(1, qsrc.SGE(0, 16)))
	expectStatus(t, waitOne(t, q.A, SendCQ), 1, verbs.WCSuccess)
	expectStatus(t, waitOne(t, q.B, RecvCQ), 9, verbs.WCSuccess)
	expectNoCommEst(t, q.B, "for a QP connected straight to RTS")
}

// testCommEstOneSided: a QP held in RTR serves one-sided requests — an
// RDMA Read, which its responder answers from RTR, then a Write and an
// atomic — and the first of them raises EventCommEst, once: the event
// marks the first request to arrive, whether or not it consumes a
// receive.
func testCommEstOneSided(t *testing.T, h Harness) {
	p := heldPair(t, h)
	remote := newRegion(t, p.B, 64, remoteAll)
	local := newRegion(t, p.A, 64, localRW)
	data := pattern(31, 32)
	fill(t, p.B, remote, 0, data)
	postSend(t, p.A, 0, readWR(1, remote, 0, local.SGE(0, 32)))
	wc := waitOne(t, p.A, SendCQ)
	expectStatus(t, wc, 1, verbs.WCSuccess)
	expectBytes(t, p.A, local, 0, data, "the Read B answered in RTR")
	postSend(t, p.A, 0, writeWR(2, remote, 32, local.SGE(0, 16)))
	expectStatus(t, waitOne(t, p.A, SendCQ), 2, verbs.WCSuccess)
	expectBytes(t, p.B, remote, 32, data[:16], "the Write B took in RTR")
	if p.A.Attr().Has(verbs.CapAtomics) {
		postSend(t, p.A, 0, atomicWR(3, verbs.OpAtomicFetchAndAdd, remote, 56, local.SGE(40, 8), 5, 0))
		expectStatus(t, waitOne(t, p.A, SendCQ), 3, verbs.WCSuccess)
		expectZero(t, p.A, local, 40, 8, "the atomic's result: the word's old value")
	}
	expectCommEst(t, p)
	expectNoErrorEvent(t, p.A)
	expectState(t, p.B, 0, verbs.QPSRTR)
	expectEmpty(t, p.B, RecvCQ)
}

// testCommEstHeldPeerLeaves: a QP that cm leaves in RTR, whose peer
// closes the connection before sending anything, moves to the error
// state as one in RTS would: the receive posted to it flushes, and no
// EventCommEst is raised.
func testCommEstHeldPeerLeaves(t *testing.T, h Harness) {
	p := heldPair(t, h)
	dst := newRegion(t, p.B, 16, remoteAll)
	postRecv(t, p.B, 0, recvWR(9, dst.SGE(0, 16)))
	if err := p.A.Conns[0].Close(); err != nil {
		t.Fatalf("close A's connection: %v", err)
	}
	expectState(t, p.B, 0, verbs.QPSErr)
	expectStatus(t, waitOne(t, p.B, RecvCQ), 9, verbs.WCWRFlushErr)
	expectNoCommEst(t, p.B, "for a connection its peer closed unused")
}

// testCommEstNotForLocalError: a request that fails at its requester,
// before any of it leaves (a Send whose local key is bad), reaches
// nothing: the peer's QP held in RTR raises no EventCommEst. (The
// requester's QP moves to the error state; whether that ends the peer's
// connection too depends on the transport, so the case does not ask.)
func testCommEstNotForLocalError(t *testing.T, h Harness) {
	p := heldPair(t, h)
	src := newRegion(t, p.A, 16, localRW)
	dst := newRegion(t, p.B, 16, remoteAll)
	postRecv(t, p.B, 0, recvWR(9, dst.SGE(0, 16)))
	bad := src.SGE(0, 16)
	bad.LKey ^= 0x5a5a00
	n, err := p.A.PostSend(0, []verbs.SendWR{sendWR(1, bad)})
	if err == nil && n == 1 {
		expectStatus(t, waitOne(t, p.A, SendCQ), 1, verbs.WCLocProtErr)
	}
	expectNoCommEst(t, p.B, "for a Send that failed at its requester")
}

// testCommEstHeldLeaves: a QP held in RTR that closes its connection
// before it ever reaches RTS ends it as one in RTS would: its peer's
// connection ends, the peer's QP moves to the error state and its
// receive flushes.
func testCommEstHeldLeaves(t *testing.T, h Harness) {
	p := heldPair(t, h)
	dst := newRegion(t, p.A, 16, localRW)
	postRecv(t, p.A, 0, recvWR(9, dst.SGE(0, 16)))
	if err := p.B.Close(); err != nil {
		t.Fatalf("close B: %v", err)
	}
	select {
	case <-p.A.Conns[0].Done():
	case <-time.After(timeout):
		t.Fatalf("A's connection did not end within %v of B, held in RTR, closing", timeout)
	}
	expectState(t, p.A, 0, verbs.QPSErr)
	expectStatus(t, waitOne(t, p.A, RecvCQ), 9, verbs.WCWRFlushErr)
}

// heldPair makes a pair whose B side cm left in RTR (PairOptions.HoldRTR),
// on a device that raises EventCommEst; it skips the case on others.
func heldPair(t *testing.T, h Harness) *Pair {
	t.Helper()
	requireCap(t, h, verbs.CapCommEstEvent, "CapCommEstEvent")
	p := h.NewPair(t, PairOptions{HoldRTR: true})
	expectState(t, p.B, 0, verbs.QPSRTR)
	return p
}
