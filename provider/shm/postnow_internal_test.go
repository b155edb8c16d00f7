package shm

import (
	"bytes"
	"errors"
	"testing"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// postNow takes the WRs of a list that it can perform at once and leaves
// the rest, from the first it cannot, to the send queue. These tests post
// lists that cross from one road to the other.

// TestPostNowThenQueue: in a list of a good Write, a Write with a bad
// rkey and a Read, the first is performed at once, the second fails
// through the queue (RemAccessErr) and the third is flushed, each
// completion naming its WR and QP.
func TestPostNowThenQueue(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	rw := newRegion(t, p.B, 256, verbs.AccessLocalWrite|verbs.RemoteAccess)
	src := newRegion(t, p.A, 256, verbs.AccessLocalWrite)
	fill(t, p.A, src, 0, pattern(3, 256))
	bad := rdma(2, verbs.OpRDMAWrite, src.SGE(0, 8), rw, 0)
	bad.RKey ^= 0x55
	postSend(t, p.A, 0,
		rdma(1, verbs.OpRDMAWrite, src.SGE(0, 8), rw, 0),
		bad,
		rdma(3, verbs.OpRDMARead, src.SGE(8, 8), rw, 0))
	wcs := waitWCs(t, p.A, verbstest.SendCQ, 3)
	expectWC(t, wcs[0], 1, verbs.WCSuccess)
	expectWC(t, wcs[1], 2, verbs.WCRemAccessErr)
	expectWC(t, wcs[2], 3, verbs.WCWRFlushErr)
	for _, wc := range wcs {
		if wc.QPNum != p.A.QPNum(0) {
			t.Fatalf("completion of WR %d names QP %#x, want %#x", wc.WRID, wc.QPNum, p.A.QPNum(0))
		}
	}
}

// TestPostNowFillsTheQueue: unsignaled Writes performed at once still
// take send queue slots, and a QP that signals every WR completes each:
// six on a queue of four post four, then ErrQueueFull.
func TestPostNowFillsTheQueue(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{SigAll: true,
		Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 2, MaxRecvSGE: 2, MaxInlineData: 64}})
	rw := newRegion(t, p.B, 256, verbs.AccessLocalWrite|verbs.RemoteAccess)
	src := newRegion(t, p.A, 256, verbs.AccessLocalWrite)
	var wrs []verbs.SendWR
	for i := range 6 {
		w := rdma(uint64(i), verbs.OpRDMAWrite, src.SGE(i*8, 8), rw, i*8)
		w.Flags = 0
		wrs = append(wrs, w)
	}
	n, err := p.A.PostSend(0, wrs)
	if n != 4 || !errors.Is(err, verbs.ErrQueueFull) {
		t.Fatalf("six Writes on a queue of four: posted %d, %v; want 4 and ErrQueueFull", n, err)
	}
	for i, wc := range waitWCs(t, p.A, verbstest.SendCQ, 4) {
		expectWC(t, wc, uint64(i), verbs.WCSuccess)
		if wc.Opcode != verbs.WCRDMAWrite {
			t.Fatalf("completion %d: opcode %v, want %v", i, wc.Opcode, verbs.WCRDMAWrite)
		}
	}
}

// TestPostNowInlineOutsidePD: an inline Write whose memory lies outside
// the PD's regions is refused at post time, after the good inline Write
// before it in the list was performed.
func TestPostNowInlineOutsidePD(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	rw := newRegion(t, p.B, 256, verbs.AccessLocalWrite|verbs.RemoteAccess)
	src := newRegion(t, p.A, 256, verbs.AccessLocalWrite)
	w1 := rdma(1, verbs.OpRDMAWrite, src.SGE(0, 8), rw, 0)
	w1.Flags |= verbs.SendInline
	w2 := w1
	w2.WRID = 2
	w2.SGList = []verbs.SGE{{Addr: 12345, Length: 8, LKey: 999}}
	n, err := p.A.PostSend(0, []verbs.SendWR{w1, w2})
	if n != 1 || !errors.Is(err, verbs.ErrInvalidArg) {
		t.Fatalf("posted %d, %v; want 1 and ErrInvalidArg", n, err)
	}
	expectWC(t, waitWCs(t, p.A, verbstest.SendCQ, 1)[0], 1, verbs.WCSuccess)
}

// TestPostNowOverrunMidList: a send CQ that overruns in the middle of a
// list of Writes performed at once moves the QP to the error state; the
// rest of the list is posted to the failed QP, and none of it is
// performed: the Writes after the one whose completion overran leave the
// remote region as it was.
func TestPostNowOverrunMidList(t *testing.T) {
	const wrs = 8
	p := localHarness().NewPair(t, verbstest.PairOptions{CQDepth: 2,
		Cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 4, MaxSendSGE: 2, MaxRecvSGE: 2}})
	depth := p.A.SendCQ.CQE()
	if depth+2 > wrs {
		t.Fatalf("a CQ of %d leaves no Write of %d after the overrun", depth, wrs)
	}
	rw := newRegion(t, p.B, 8*wrs, verbs.AccessLocalWrite|verbs.RemoteAccess)
	src := newRegion(t, p.A, 8*wrs, verbs.AccessLocalWrite)
	fill(t, p.A, src, 0, pattern(1, 8*wrs))
	fill(t, p.B, rw, 0, pattern(2, 8*wrs))
	var list []verbs.SendWR
	for i := range wrs {
		list = append(list, rdma(uint64(i), verbs.OpRDMAWrite, src.SGE(i*8, 8), rw, i*8))
	}
	if n, err := p.A.PostSend(0, list); n != len(list) || err != nil {
		t.Fatalf("posted %d of %d: %v", n, len(list), err)
	}
	if st, _ := p.A.QPState(0); st != verbs.QPSErr {
		t.Fatalf("QP state %v after its CQ overran, want %v", st, verbs.QPSErr)
	}
	// The CQ holds CQE() completions: WR depth is the one whose
	// completion found it full.
	after := 8 * (depth + 1)
	if got, want := contents(t, p.B, rw, after, 8*wrs-after), pattern(2, 8*wrs)[after:]; !bytes.Equal(got, want) {
		t.Fatalf("the Writes after the overrun wrote %x, want %x left as it was", got, want)
	}
}

// TestPostNowSendFailsAfterTakingReceive: a Send performed at once that
// finds the peer's receive too small has taken that receive, so it is
// completed where it was posted — WCRemInvReqErr, the receive
// WCLocLenErr — and the QP moves to the error state, flushing the Write
// posted after it in the same list. A Send that finds no receive posted
// is left to the queue, which retries it, and then lands.
func TestPostNowSendFailsAfterTakingReceive(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	src := newRegion(t, p.A, 64, verbs.AccessLocalWrite)
	fill(t, p.A, src, 0, pattern(5, 64))
	small := newRegion(t, p.B, 8, verbs.AccessLocalWrite)
	rw := newRegion(t, p.B, 64, verbs.AccessLocalWrite|verbs.RemoteAccess)
	postRecv(t, p.B, 0, recv(9, small.SGE(0, 8)))
	postSend(t, p.A, 0, send(1, src.SGE(0, 32)), rdma(2, verbs.OpRDMAWrite, src.SGE(0, 8), rw, 0))
	wcs := waitWCs(t, p.A, verbstest.SendCQ, 2)
	expectWC(t, wcs[0], 1, verbs.WCRemInvReqErr)
	expectWC(t, wcs[1], 2, verbs.WCWRFlushErr)
	expectWC(t, waitWCs(t, p.B, verbstest.RecvCQ, 1)[0], 9, verbs.WCLocLenErr)
	if st, _ := p.A.QPState(0); st != verbs.QPSErr {
		t.Fatalf("sender's QP in %v after its Send failed, want %v", st, verbs.QPSErr)
	}
	expectCanaries(t, p.B, small, rw)

	q := localHarness().NewPair(t, verbstest.PairOptions{})
	src = newRegion(t, q.A, 64, verbs.AccessLocalWrite)
	fill(t, q.A, src, 0, pattern(6, 64))
	dst := newRegion(t, q.B, 64, verbs.AccessLocalWrite)
	postSend(t, q.A, 0, send(3, src.SGE(0, 16)))
	postRecv(t, q.B, 0, recv(4, dst.SGE(0, 64)))
	expectWC(t, waitWCs(t, q.A, verbstest.SendCQ, 1)[0], 3, verbs.WCSuccess)
	expectWC(t, waitWCs(t, q.B, verbstest.RecvCQ, 1)[0], 4, verbs.WCSuccess)
	if got := contents(t, q.B, dst, 0, 16); string(got) != string(pattern(6, 64)[:16]) {
		t.Fatalf("the retried Send delivered %x, want %x", got, pattern(6, 64)[:16])
	}
}
