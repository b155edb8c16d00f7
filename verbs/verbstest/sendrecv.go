package verbstest

import (
	"fmt"
	"testing"
	"time"

	"github.com/goverbs/goverbs/verbs"
)

// testPostOrder: receives are consumed in the order they were posted, and
// both sides' completions report what the verbs say they report.
func testPostOrder(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	sizes := []int{1, 17, 64, 33}
	const slot = 64
	src := newRegion(t, p.A, slot*len(sizes), localRW)
	dst := newRegion(t, p.B, slot*len(sizes), localRW)
	var recvs []verbs.RecvWR
	var sends []verbs.SendWR
	for i, n := range sizes {
		fill(t, p.A, src, i*slot, pattern(i, n))
		recvs = append(recvs, recvWR(uint64(100+i), dst.SGE(i*slot, slot)))
		sends = append(sends, sendWR(uint64(1+i), src.SGE(i*slot, n)))
	}
	postRecv(t, p.B, 0, recvs...)
	postSend(t, p.A, 0, sends...)
	swc := wait(t, p.A, SendCQ, len(sizes))
	rwc := wait(t, p.B, RecvCQ, len(sizes))
	for i, n := range sizes {
		expectSendWC(t, swc[i], uint64(1+i), verbs.WCSend, p.A.QPNum(0))
		expectRecvWC(t, rwc[i], uint64(100+i), verbs.WCRecv, n, p.B.QPNum(0))
		expectBytes(t, p.B, dst, i*slot, pattern(i, n), "message in its receive buffer")
		expectZero(t, p.B, dst, i*slot+n, slot-n, "receive buffer past the message")
	}
	expectCanaries(t, p.B, dst)
}

// testScatterGather: a Send gathers three SGEs from two regions and the
// receive scatters the message over two SGEs in two regions, in order.
func testScatterGather(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	a1 := newRegion(t, p.A, 64, localRW)
	a2 := newRegion(t, p.A, 64, localRW)
	fill(t, p.A, a1, 0, pattern(1, 64))
	fill(t, p.A, a2, 0, pattern(2, 64))
	b1 := newRegion(t, p.B, 64, localRW)
	b2 := newRegion(t, p.B, 64, localRW)

	var msg []byte
	msg = append(msg, pattern(1, 64)[0:10]...)
	msg = append(msg, pattern(2, 64)[5:25]...)
	msg = append(msg, pattern(1, 64)[40:52]...)
	postRecv(t, p.B, 0, recvWR(7, b1.SGE(8, 20), b2.SGE(0, 32)))
	wc := do(t, p, sendWR(1, a1.SGE(0, 10), a2.SGE(5, 20), a1.SGE(40, 12)))
	expectSendWC(t, wc, 1, verbs.WCSend, p.A.QPNum(0))
	expectRecvWC(t, waitOne(t, p.B, RecvCQ), 7, verbs.WCRecv, len(msg), p.B.QPNum(0))

	expectZero(t, p.B, b1, 0, 8, "first receive region before its SGE")
	expectBytes(t, p.B, b1, 8, msg[:20], "first receive SGE")
	expectZero(t, p.B, b1, 28, 36, "first receive region after its SGE")
	expectBytes(t, p.B, b2, 0, msg[20:], "second receive SGE")
	expectZero(t, p.B, b2, len(msg)-20, 64-(len(msg)-20), "second receive SGE past the message")
	expectCanaries(t, p.B, b1)
	expectCanaries(t, p.B, b2)
}

// testInline: an inline Send's payload is copied at post time, so the
// source may be overwritten as soon as PostSend returns. With RNR retry
// the receive is posted only after the overwrite, so the message cannot
// have been delivered before it.
func testInline(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	n := int(p.Opts.Cap.MaxInlineData)
	src := newRegion(t, p.A, n, localRW)
	dst := newRegion(t, p.B, n, localRW)
	orig := pattern(1, n)
	fill(t, p.A, src, 0, orig)
	late := p.A.Attr().Has(verbs.CapRNRRetry)
	if !late {
		postRecv(t, p.B, 0, recvWR(9, dst.SGE(0, n)))
	}
	wr := sendWR(1, src.SGE(0, n))
	wr.Flags |= verbs.SendInline
	postSend(t, p.A, 0, wr)
	fill(t, p.A, src, 0, pattern(2, n))
	if late {
		postRecv(t, p.B, 0, recvWR(9, dst.SGE(0, n)))
	}
	expectSendWC(t, waitOne(t, p.A, SendCQ), 1, verbs.WCSend, p.A.QPNum(0))
	expectRecvWC(t, waitOne(t, p.B, RecvCQ), 9, verbs.WCRecv, n, p.B.QPNum(0))
	expectBytes(t, p.B, dst, 0, orig, "inline payload as it was at post time")
}

// testInlineUnregistered: an inline SGE must lie inside a region
// registered on the QP's PD (goverbs' deviation from ibverbs, for memory
// safety): one that does not is refused at post time with ErrInvalidArg,
// and nothing is sent; the same for an inline RDMA Write.
func testInlineUnregistered(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	src := newRegion(t, p.A, 64, localRW)
	dst := newRegion(t, p.B, 64, localRW)
	target := newRegion(t, p.B, 64, remoteAll)
	postRecv(t, p.B, 0, recvWR(9, dst.SGE(0, 64)))
	// Address 0x1000 is never memory a Go program may read.
	wr := sendWR(1, verbs.SGE{Addr: 0x1000, Length: 16, LKey: src.LKey})
	wr.Flags |= verbs.SendInline
	n, err := p.A.PostSend(0, []verbs.SendWR{wr})
	expectRefused(t, "inline Send from unregistered memory", n, err, verbs.ErrInvalidArg)
	wr = writeWR(2, target, 0, verbs.SGE{Addr: 0x1000, Length: 16, LKey: src.LKey})
	wr.Flags |= verbs.SendInline | verbs.SendSignaled
	n, err = p.A.PostSend(0, []verbs.SendWR{wr})
	expectRefused(t, "inline RDMA Write from unregistered memory", n, err, verbs.ErrInvalidArg)
	expectEmpty(t, p.A, SendCQ)
	expectEmpty(t, p.B, RecvCQ)
	expectZero(t, p.B, dst, 0, 64, "receive buffer")
	expectZero(t, p.B, target, 0, 64, "RDMA Write target")
	expectState(t, p.A, 0, verbs.QPSRTS)
}

// testInlineTooLarge: an inline payload larger than MaxInlineData (as
// Query reports it) is refused at post time; exactly MaxInlineData is
// taken.
func testInlineTooLarge(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	limit := int(queriedCap(t, p.A.QPs[0]).MaxInlineData)
	src := newRegion(t, p.A, limit+1, localRW)
	fill(t, p.A, src, 0, pattern(3, limit+1))
	dst := newRegion(t, p.B, limit+1, localRW)
	postRecv(t, p.B, 0, recvWR(9, dst.SGE(0, limit+1)))

	big := sendWR(1, src.SGE(0, limit+1))
	big.Flags |= verbs.SendInline
	n, err := p.A.PostSend(0, []verbs.SendWR{big})
	expectRefused(t, "inline Send of MaxInlineData+1 bytes", n, err, verbs.ErrInvalidArg)
	expectEmpty(t, p.A, SendCQ)
	expectState(t, p.A, 0, verbs.QPSRTS)

	ok := sendWR(2, src.SGE(0, limit))
	ok.Flags |= verbs.SendInline
	expectSendWC(t, do(t, p, ok), 2, verbs.WCSend, p.A.QPNum(0))
	expectRecvWC(t, waitOne(t, p.B, RecvCQ), 9, verbs.WCRecv, limit, p.B.QPNum(0))
	expectBytes(t, p.B, dst, 0, pattern(3, limit+1)[:limit], "inline payload of MaxInlineData bytes")
}

// testTooManySGEs: a WR with more SGEs than the QP's capacity (as Query
// reports it) is refused at post time with ErrInvalidArg; the WRs before
// it in the same post are posted and the ones after it are not.
func testTooManySGEs(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	qc := queriedCap(t, p.A.QPs[0])
	maxSGE := int(qc.MaxSendSGE)
	size := 12 * (maxSGE + 1)
	src := newRegion(t, p.A, size, localRW)
	dst := newRegion(t, p.B, size, remoteAll)
	sges := func(k int) []verbs.SGE {
		var sg []verbs.SGE
		for i := range k {
			sg = append(sg, src.SGE(4*i, 4))
		}
		return sg
	}
	fill(t, p.A, src, 0, pattern(4, size))
	wrs := []verbs.SendWR{
		writeWR(1, dst, 0, sges(maxSGE)...),
		writeWR(2, dst, 4*(maxSGE+1), sges(maxSGE+1)...),
		writeWR(3, dst, 8*(maxSGE+1), src.SGE(0, 8)),
	}
	n, err := p.A.PostSend(0, wrs)
	expectRefusedAt(t, "Write with MaxSendSGE+1 SGEs", 1, n, err, verbs.ErrInvalidArg)
	expectSendWC(t, waitOne(t, p.A, SendCQ), 1, verbs.WCRDMAWrite, p.A.QPNum(0))
	expectEmpty(t, p.A, SendCQ)
	k := 4 * maxSGE
	expectBytes(t, p.B, dst, 0, pattern(4, size)[:k], "the Write posted before the refused one")
	expectZero(t, p.B, dst, k, size-k, "the targets of the refused Write and the one after it")

	recv := newRegion(t, p.A, 4*(int(qc.MaxRecvSGE)+1), localRW)
	var rsg []verbs.SGE
	for i := range int(qc.MaxRecvSGE) + 1 {
		rsg = append(rsg, recv.SGE(4*i, 4))
	}
	n, err = p.A.PostRecv(0, []verbs.RecvWR{recvWR(4, rsg...)})
	expectRefused(t, "receive with MaxRecvSGE+1 SGEs", n, err, verbs.ErrInvalidArg)
	expectState(t, p.A, 0, verbs.QPSRTS)
}

// testSendWithImm: Send with immediate delivers the immediate value with
// WCWithImm in the receive completion.
func testSendWithImm(t *testing.T, h Harness) {
	requireCap(t, h, verbs.CapImmData, "CapImmData")
	p := h.NewPair(t, PairOptions{})
	src := newRegion(t, p.A, 16, localRW)
	fill(t, p.A, src, 0, pattern(5, 16))
	dst := newRegion(t, p.B, 16, localRW)
	postRecv(t, p.B, 0, recvWR(9, dst.SGE(0, 16)))
	wr := sendWR(1, src.SGE(0, 16))
	wr.Opcode, wr.Imm = verbs.OpSendWithImm, 0xdeadbeef
	expectSendWC(t, do(t, p, wr), 1, verbs.WCSend, p.A.QPNum(0))
	wc := waitOne(t, p.B, RecvCQ)
	expectRecvWC(t, wc, 9, verbs.WCRecv, 16, p.B.QPNum(0))
	if wc.Flags&verbs.WCWithImm == 0 || wc.Imm != 0xdeadbeef {
		t.Fatalf("receive completion %s: want WCWithImm and immediate 0xdeadbeef", fmtWC(wc))
	}
	expectBytes(t, p.B, dst, 0, pattern(5, 16), "payload of the Send with immediate")
}

// testZeroLengthSend: a Send without SGEs consumes a receive and completes
// with zero bytes on both sides; where the device takes receives without
// SGEs (CapRecvNoSGE), also one of those.
func testZeroLengthSend(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	dst := newRegion(t, p.B, 32, localRW)
	second := recvWR(10, dst.SGE(16, 16))
	if p.B.Attr().Has(verbs.CapRecvNoSGE) {
		second = recvWR(10)
	}
	postRecv(t, p.B, 0, recvWR(9, dst.SGE(0, 16)), second)
	expectSendWC(t, do(t, p, sendWR(1)), 1, verbs.WCSend, p.A.QPNum(0))
	expectSendWC(t, do(t, p, sendWR(2)), 2, verbs.WCSend, p.A.QPNum(0))
	wcs := wait(t, p.B, RecvCQ, 2)
	expectRecvWC(t, wcs[0], 9, verbs.WCRecv, 0, p.B.QPNum(0))
	expectRecvWC(t, wcs[1], 10, verbs.WCRecv, 0, p.B.QPNum(0))
	expectZero(t, p.B, dst, 0, 32, "receive buffers of zero-length Sends")
}

// testRecvTooSmall: a message longer than the receive buffer completes
// the receive with WCLocLenErr and the Send with WCRemInvReqErr (or, on a
// device without CapAckedCompletion, which completes a Send once sent,
// with success), writes nothing past the buffer, and moves both QPs to
// the error state, where further WRs flush.
func testRecvTooSmall(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	src := newRegion(t, p.A, 32, localRW)
	fill(t, p.A, src, 0, pattern(6, 32))
	dst := newRegion(t, p.B, 8, localRW)
	postRecv(t, p.B, 0, recvWR(9, dst.SGE(0, 8)))
	sent := do(t, p, sendWR(1, src.SGE(0, 32)))
	if p.A.Attr().Has(verbs.CapAckedCompletion) || sent.Status != verbs.WCSuccess {
		expectStatus(t, sent, 1, verbs.WCRemInvReqErr)
	}
	wc := waitOne(t, p.B, RecvCQ)
	expectStatus(t, wc, 9, verbs.WCLocLenErr)
	if wc.QPNum != p.B.QPNum(0) {
		t.Fatalf("receive completion %s: want QP %d", fmtWC(wc), p.B.QPNum(0))
	}
	expectCanaries(t, p.B, dst)
	expectState(t, p.A, 0, verbs.QPSErr)
	expectState(t, p.B, 0, verbs.QPSErr)
	expectFlushAfterError(t, p.A, 0)
	expectFlushAfterError(t, p.B, 0)
}

// testSolicited: a CQ armed for solicited completions only stays quiet for
// an ordinary Send and wakes for one with SendSolicited. (ibverbs has no
// completion flag that says a receive was solicited; WCSolicited, where a
// provider sets it, is not checked.)
func testSolicited(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	src := newRegion(t, p.B, 32, localRW)
	fill(t, p.B, src, 0, pattern(7, 32))
	dst := newRegion(t, p.A, 32, localRW)
	postRecv(t, p.A, 0, recvWR(1, dst.SGE(0, 16)), recvWR(2, dst.SGE(16, 16)))
	if err := p.A.RecvCQ.ReqNotify(true); err != nil {
		t.Fatalf("ReqNotify(solicited only): %v", err)
	}

	postSend(t, p.B, 0, sendWR(11, src.SGE(0, 16)))
	expectSendWC(t, waitOne(t, p.B, SendCQ), 11, verbs.WCSend, p.B.QPNum(0))
	select {
	case <-p.A.RecvCQ.Notify():
		t.Fatal("a CQ armed for solicited events only was notified of an unsolicited Send")
	default:
	}

	wr := sendWR(12, src.SGE(16, 16))
	wr.Flags |= verbs.SendSolicited
	postSend(t, p.B, 0, wr)
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.A.RecvCQ.Notify():
	case <-timer.C:
		t.Fatalf("no notification within %v of a solicited Send", timeout)
	}
	expectSendWC(t, waitOne(t, p.B, SendCQ), 12, verbs.WCSend, p.B.QPNum(0))

	wcs := make([]verbs.WorkCompletion, 4)
	if n := p.A.RecvCQ.Poll(wcs); n != 2 {
		t.Fatalf("polled %d receive completions, want 2: %s", n, fmtWCs(wcs[:n]))
	}
	expectRecvWC(t, wcs[0], 1, verbs.WCRecv, 16, p.A.QPNum(0))
	expectRecvWC(t, wcs[1], 2, verbs.WCRecv, 16, p.A.QPNum(0))
	expectBytes(t, p.A, dst, 0, pattern(7, 32), "both messages")
}

// longSize is the size of the messages the long-message cases send:
// larger than any MTU or segment, and not a multiple of one.
const longSize = 300_000

// longSGEs splits n bytes of r from offset 0 into k SGEs of uneven sizes.
func longSGEs(r Region, n, k int) []verbs.SGE {
	var sg []verbs.SGE
	off := 0
	for i := range k {
		m := (n - off) / (k - i)
		if i < k-1 {
			m += 777 * (i%2*2 - 1) // uneven: a little less, then a little more
		}
		sg = append(sg, r.SGE(off, m))
		off += m
	}
	return sg
}

// testLongMessages: a Send, an RDMA Write and a Write with immediate of
// 300 000 bytes, gathered from three SGEs and (for the Send) scattered
// over four, arrive byte-exact.
func testLongMessages(t *testing.T, h Harness) {
	ops := []verbs.Opcode{verbs.OpSend, verbs.OpRDMAWrite}
	if deviceAttr(t, h).Has(verbs.CapImmData) {
		ops = append(ops, verbs.OpRDMAWriteWithImm)
	}
	for i, op := range ops {
		t.Run(op.String(), func(t *testing.T) {
			p := h.NewPair(t, PairOptions{})
			n := longSize
			if m := p.A.Attr().MaxMsgSize; uint64(n) > m {
				n = int(m)
			}
			src := newRegion(t, p.A, n, localRW)
			data := pattern(70+i, n)
			fill(t, p.A, src, 0, data)
			dst := newRegion(t, p.B, n+64, remoteAll)
			wr := sendWR(1, longSGEs(src, n, 3)...)
			wcOp := verbs.WCSend
			switch op {
			case verbs.OpSend:
				var sg []verbs.SGE
				for _, s := range longSGEs(dst, n, 4) {
					s.Addr += 32 // leave 32 bytes before the message
					sg = append(sg, s)
				}
				postRecv(t, p.B, 0, recvWR(9, sg...))
			case verbs.OpRDMAWrite, verbs.OpRDMAWriteWithImm:
				wr = writeWR(1, dst, 32, wr.SGList...)
				wr.Opcode, wr.Imm, wcOp = op, 0x01020304, verbs.WCRDMAWrite
				if op == verbs.OpRDMAWriteWithImm {
					postRecv(t, p.B, 0, recvWR(9, newRegion(t, p.B, 8, localRW).SGE(0, 8)))
				}
			}
			expectSendWC(t, do(t, p, wr), 1, wcOp, p.A.QPNum(0))
			switch op {
			case verbs.OpSend:
				expectRecvWC(t, waitOne(t, p.B, RecvCQ), 9, verbs.WCRecv, n, p.B.QPNum(0))
			case verbs.OpRDMAWriteWithImm:
				wc := waitOne(t, p.B, RecvCQ)
				expectRecvWC(t, wc, 9, verbs.WCRecvRDMAWithImm, n, p.B.QPNum(0))
				if wc.Flags&verbs.WCWithImm == 0 || wc.Imm != 0x01020304 {
					t.Fatalf("receive completion %s: want WCWithImm and immediate 0x01020304", fmtWC(wc))
				}
			}
			expectZero(t, p.B, dst, 0, 32, "bytes before the message")
			expectBytes(t, p.B, dst, 32, data, "a message of "+fmt.Sprint(n)+" bytes")
			expectZero(t, p.B, dst, 32+n, 32, "bytes after the message")
			expectCanaries(t, p.B, dst)
		})
	}
}

// testRecvBadLKey: a Send into a receive whose SGE names no region fails
// at the responder with WCLocProtErr and at the requester with an error
// (or, without CapAckedCompletion, possibly success), both QPs reach the
// error state, and nothing is written.
func testRecvBadLKey(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	dst := newRegion(t, p.B, 32, localRW)
	sge := dst.SGE(0, 32)
	sge.LKey = badKey(sge.LKey)
	expectResponderFault(t, p, dst, recvWR(9, sge))
}

// testRecvNoLocalWrite: a Send into a receive whose region lacks
// AccessLocalWrite fails the same way: the responder may not write there.
func testRecvNoLocalWrite(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	dst := newRegion(t, p.B, 32, 0)
	expectResponderFault(t, p, dst, recvWR(9, dst.SGE(0, 32)))
}

// expectResponderFault posts recv on B, sends 16 bytes into it from A,
// and checks the failure at the responder.
func expectResponderFault(t *testing.T, p *Pair, dst Region, recv verbs.RecvWR) {
	t.Helper()
	before := snap(t, p.B, dst, "receive buffer the responder may not write")
	src := newRegion(t, p.A, 16, localRW)
	fill(t, p.A, src, 0, pattern(73, 16))
	postRecv(t, p.B, 0, recv)
	sent := do(t, p, sendWR(1, src.SGE(0, 16)))
	if sent.Status == verbs.WCSuccess && p.A.Attr().Has(verbs.CapAckedCompletion) {
		t.Fatalf("Send into a receive the responder cannot write completed %s, want an error", fmtWC(sent))
	}
	if sent.Status == verbs.WCWRFlushErr {
		t.Fatalf("Send into a receive the responder cannot write completed %s, want the error itself", fmtWC(sent))
	}
	expectStatus(t, waitOne(t, p.B, RecvCQ), 9, verbs.WCLocProtErr)
	expectState(t, p.A, 0, verbs.QPSErr)
	expectState(t, p.B, 0, verbs.QPSErr)
	before.unchanged(t)
	expectFlushAfterError(t, p.B, 0)
}

// testSolicitedOnly: a CQ armed for solicited completions only fires for
// an unsuccessful completion, never for successful unsolicited ones, and
// once per arming; a solicited Write with immediate fires it too.
func testSolicitedOnly(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	src := newRegion(t, p.B, 32, localRW)
	fill(t, p.B, src, 0, pattern(74, 32))
	dst := newRegion(t, p.A, 64, remoteAll)
	cq := p.A.RecvCQ
	notified := func(want bool, what string) {
		t.Helper()
		d := shortWait
		if want {
			d = timeout
		}
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-cq.Notify():
			if !want {
				t.Fatalf("%s: the CQ armed for solicited events only was notified", what)
			}
		case <-timer.C:
			if want {
				t.Fatalf("%s: no notification within %v", what, d)
			}
		}
	}
	arm := func() {
		t.Helper()
		if err := cq.ReqNotify(true); err != nil {
			t.Fatalf("ReqNotify(solicited only): %v", err)
		}
	}
	postRecv(t, p.A, 0, recvWR(1, dst.SGE(0, 8)), recvWR(2, dst.SGE(8, 8)), recvWR(3, dst.SGE(16, 8)), recvWR(4, dst.SGE(24, 8)))
	arm()
	postSend(t, p.B, 0, sendWR(11, src.SGE(0, 8)))
	expectSendWC(t, waitOne(t, p.B, SendCQ), 11, verbs.WCSend, p.B.QPNum(0))
	notified(false, "an unsolicited Send")
	if p.B.Attr().Has(verbs.CapImmData) {
		wr := writeWR(12, dst, 40, src.SGE(8, 8))
		wr.Opcode, wr.Imm, wr.Flags = verbs.OpRDMAWriteWithImm, 7, verbs.SendSignaled|verbs.SendSolicited
		postSend(t, p.B, 0, wr)
		notified(true, "a solicited Write with immediate")
		expectSendWC(t, waitOne(t, p.B, SendCQ), 12, verbs.WCRDMAWrite, p.B.QPNum(0))
	} else {
		wr := sendWR(12, src.SGE(8, 8))
		wr.Flags |= verbs.SendSolicited
		postSend(t, p.B, 0, wr)
		notified(true, "a solicited Send")
		expectSendWC(t, waitOne(t, p.B, SendCQ), 12, verbs.WCSend, p.B.QPNum(0))
	}
	wr := sendWR(13, src.SGE(16, 8))
	wr.Flags |= verbs.SendSolicited
	postSend(t, p.B, 0, wr)
	expectSendWC(t, waitOne(t, p.B, SendCQ), 13, verbs.WCSend, p.B.QPNum(0))
	notified(false, "a solicited Send after the one notification, without arming again")
	wcs := wait(t, p.A, RecvCQ, 3)
	expectStatuses(t, wcs, verbs.WCSuccess, 1, 2, 3)
	arm()
	if err := p.A.QPs[0].Modify(&verbs.QPAttr{State: verbs.QPSErr}, verbs.QPAttrState); err != nil {
		t.Fatalf("move A's QP to the error state: %v", err)
	}
	notified(true, "a flushed receive")
	expectStatus(t, waitOne(t, p.A, RecvCQ), 4, verbs.WCWRFlushErr)
}
