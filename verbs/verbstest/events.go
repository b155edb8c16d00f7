package verbstest

import (
	"testing"

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
