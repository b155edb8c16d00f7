package verbstest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// freshCap is the capacity of the QPs the lifecycle cases create.
var freshCap = verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}

// freshQPs creates n unconnected QPs on A's PD, sharing one new CQ; on a
// device with CapModifyConnect they are in the Reset state. The test's
// cleanup destroys whatever the case left of them.
func freshQPs(t testing.TB, p *Pair, n int) ([]*verbs.QP, *verbs.CQ) {
	t.Helper()
	cq, err := p.A.Ctx.CreateCQ(64)
	if err != nil {
		t.Fatalf("create CQ: %v", err)
	}
	var qps []*verbs.QP
	t.Cleanup(func() {
		for _, q := range qps {
			q.Destroy() // ErrClosed if the case destroyed it
		}
		cq.Destroy()
	})
	for range n {
		q, err := p.A.PD.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: freshCap})
		if err != nil {
			t.Fatalf("create QP: %v", err)
		}
		if s := q.State(); s != verbs.QPSReset && p.A.Attr().Has(verbs.CapModifyConnect) {
			t.Fatalf("a new QP is in state %v, want RESET", s)
		}
		qps = append(qps, q)
	}
	return qps, cq
}

// qpStep is a Modify: the attributes and the mask.
type qpStep struct {
	attr verbs.QPAttr
	mask verbs.QPAttrMask
}

// stepTo is the Modify that moves a QP to state along Reset→Init→RTR→RTS
// with exactly the attributes the transition requires (the move to Reset
// or Err takes the state alone); dest is the remote QP number for RTR.
func stepTo(state verbs.QPState, dest uint32) qpStep {
	switch state {
	case verbs.QPSInit:
		return qpStep{verbs.QPAttr{State: state, Port: 1, AccessFlags: verbs.RemoteAccess | verbs.AccessLocalWrite},
			verbs.QPAttrState | verbs.QPAttrPort | verbs.QPAttrAccessFlags}
	case verbs.QPSRTR:
		return qpStep{verbs.QPAttr{State: state, PathMTU: verbs.MTU1024, DestQPNum: dest, MaxDestRdAtomic: 1, MinRNRTimer: 1},
			verbs.QPAttrState | verbs.QPAttrPathMTU | verbs.QPAttrDestQPN | verbs.QPAttrRQPSN |
				verbs.QPAttrMaxDestRdAtomic | verbs.QPAttrMinRNRTimer}
	case verbs.QPSRTS:
		return rtsStep(PairOptions{RNRRetry: 7})
	}
	return qpStep{verbs.QPAttr{State: state}, verbs.QPAttrState}
}

// rtsStep is the Modify from RTR to RTS, with the transport retries cm
// gives a pair's QPs, o's RNR retries, and one Read or atomic
// outstanding.
func rtsStep(o PairOptions) qpStep {
	return qpStep{verbs.QPAttr{State: verbs.QPSRTS, Timeout: 14, RetryCnt: 7, RNRRetry: o.RNRRetry, MaxRdAtomic: 1},
		verbs.QPAttrState | verbs.QPAttrSQPSN | verbs.QPAttrTimeout | verbs.QPAttrRetryCnt |
			verbs.QPAttrRNRRetry | verbs.QPAttrMaxQPRdAtomic}
}

// without returns the step with the attributes of m left out of its mask.
func (s qpStep) without(m verbs.QPAttrMask) qpStep {
	s.mask &^= m
	return s
}

// expectQPState checks the state of a local QP.
func expectQPState(t testing.TB, q *verbs.QP, want verbs.QPState) {
	t.Helper()
	a, err := q.Query()
	if err != nil {
		t.Fatalf("query QP %d: %v", q.Num(), err)
	}
	if a.State != want {
		t.Fatalf("QP %d is in state %v, want %v", q.Num(), a.State, want)
	}
}

// modifyTo moves q to state with stepTo, which must succeed.
func modifyTo(t testing.TB, q *verbs.QP, state verbs.QPState, dest uint32) {
	t.Helper()
	s := stepTo(state, dest)
	if err := q.Modify(&s.attr, s.mask); err != nil {
		t.Fatalf("modify QP %d to %v: %v", q.Num(), state, err)
	}
	expectQPState(t, q, state)
}

// bringTo moves q from Reset to state along Init, RTR and RTS.
func bringTo(t testing.TB, q *verbs.QP, state verbs.QPState, dest uint32) {
	t.Helper()
	for _, s := range []verbs.QPState{verbs.QPSInit, verbs.QPSRTR, verbs.QPSRTS} {
		if s > state {
			return
		}
		modifyTo(t, q, s, dest)
	}
}

// expectModifyRefused checks that Modify with s fails with an error
// wrapping target and leaves q in its state.
func expectModifyRefused(t testing.TB, q *verbs.QP, s qpStep, target error, what string) {
	t.Helper()
	before := q.State()
	err := q.Modify(&s.attr, s.mask)
	if !errors.Is(err, target) {
		t.Fatalf("%s: Modify from %v returned %v, want an error wrapping %q", what, before, err, target)
	}
	expectQPState(t, q, before)
}

// waitCQ collects exactly n completions from a local CQ within timeout.
func waitCQ(t testing.TB, cq *verbs.CQ, n int) []verbs.WorkCompletion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var out []verbs.WorkCompletion
	buf := make([]verbs.WorkCompletion, n)
	for len(out) < n {
		k, err := cq.Wait(ctx, buf[:n-len(out)])
		out = append(out, buf[:k]...)
		if err != nil {
			t.Fatalf("waiting for %d completions: %v (got %s)", n, err, fmtWCs(out))
		}
	}
	return out
}

// testStateMachine: a QP goes Reset→Init→RTR→RTS with the attributes each
// transition requires, then to Err and back to Reset, and is usable again.
func testStateMachine(t *testing.T, h Harness) {
	requireCap(t, h, verbs.CapModifyConnect, "CapModifyConnect")
	p := h.NewPair(t, PairOptions{})
	qs, _ := freshQPs(t, p, 2)
	q, peer := qs[0], qs[1]
	bringTo(t, q, verbs.QPSRTS, peer.Num())
	a, err := q.Query()
	if err != nil {
		t.Fatalf("query: %v", err)
	}
	if a.DestQPNum != peer.Num() || a.PathMTU != verbs.MTU1024 || a.RNRRetry != 7 || a.RetryCnt != 7 {
		t.Fatalf("attributes after the move to RTS: %+v; want DestQPNum %d, PathMTU %v, RNRRetry 7, RetryCnt 7",
			a, peer.Num(), verbs.MTU1024)
	}
	modifyTo(t, q, verbs.QPSErr, 0)
	modifyTo(t, q, verbs.QPSReset, 0)
	bringTo(t, q, verbs.QPSRTS, peer.Num())
}

// testIllegalTransitions: transitions outside the state table are refused
// with ErrInvalidState and leave the QP as it was.
func testIllegalTransitions(t *testing.T, h Harness) {
	requireCap(t, h, verbs.CapModifyConnect, "CapModifyConnect")
	p := h.NewPair(t, PairOptions{})
	qs, _ := freshQPs(t, p, 2)
	q, dest := qs[0], qs[1].Num()
	expectModifyRefused(t, q, stepTo(verbs.QPSRTR, dest), verbs.ErrInvalidState, "Reset to RTR")
	expectModifyRefused(t, q, stepTo(verbs.QPSRTS, dest), verbs.ErrInvalidState, "Reset to RTS")
	modifyTo(t, q, verbs.QPSInit, dest)
	expectModifyRefused(t, q, stepTo(verbs.QPSRTS, dest), verbs.ErrInvalidState, "Init to RTS")
	modifyTo(t, q, verbs.QPSRTR, dest)
	expectModifyRefused(t, q, stepTo(verbs.QPSRTR, dest), verbs.ErrInvalidState, "RTR to RTR")
	modifyTo(t, q, verbs.QPSRTS, dest)
}

// testMissingAttributes: a transition without an attribute it requires,
// or with one it does not take, is refused with ErrInvalidArg and leaves
// the QP as it was.
func testMissingAttributes(t *testing.T, h Harness) {
	requireCap(t, h, verbs.CapModifyConnect, "CapModifyConnect")
	p := h.NewPair(t, PairOptions{})
	qs, _ := freshQPs(t, p, 2)
	q, dest := qs[0], qs[1].Num()
	toInit, rtr, rts := stepTo(verbs.QPSInit, dest), stepTo(verbs.QPSRTR, dest), stepTo(verbs.QPSRTS, dest)
	expectModifyRefused(t, q, toInit.without(verbs.QPAttrPort), verbs.ErrInvalidArg, "Reset to Init without Port")
	expectModifyRefused(t, q, toInit.without(verbs.QPAttrAccessFlags), verbs.ErrInvalidArg, "Reset to Init without AccessFlags")
	extra := toInit
	extra.mask |= verbs.QPAttrPathMTU
	extra.attr.PathMTU = verbs.MTU1024
	expectModifyRefused(t, q, extra, verbs.ErrInvalidArg, "Reset to Init with PathMTU")
	modifyTo(t, q, verbs.QPSInit, dest)
	expectModifyRefused(t, q, rtr.without(verbs.QPAttrDestQPN), verbs.ErrInvalidArg, "Init to RTR without DestQPN")
	expectModifyRefused(t, q, rtr.without(verbs.QPAttrPathMTU), verbs.ErrInvalidArg, "Init to RTR without PathMTU")
	expectModifyRefused(t, q, rtr.without(verbs.QPAttrMinRNRTimer), verbs.ErrInvalidArg, "Init to RTR without MinRNRTimer")
	modifyTo(t, q, verbs.QPSRTR, dest)
	expectModifyRefused(t, q, rts.without(verbs.QPAttrRNRRetry), verbs.ErrInvalidArg, "RTR to RTS without RNRRetry")
	expectModifyRefused(t, q, rts.without(verbs.QPAttrSQPSN), verbs.ErrInvalidArg, "RTR to RTS without SQPSN")
	modifyTo(t, q, verbs.QPSRTS, dest)
}

// testErrAndReset: every state may move to Err, and Err to Reset.
func testErrAndReset(t *testing.T, h Harness) {
	requireCap(t, h, verbs.CapModifyConnect, "CapModifyConnect")
	p := h.NewPair(t, PairOptions{})
	qs, _ := freshQPs(t, p, 2)
	q, dest := qs[0], qs[1].Num()
	for _, s := range []verbs.QPState{verbs.QPSReset, verbs.QPSInit, verbs.QPSRTR, verbs.QPSRTS} {
		bringTo(t, q, s, dest)
		modifyTo(t, q, verbs.QPSErr, 0)
		modifyTo(t, q, verbs.QPSReset, 0)
	}
}

// testPostInWrongState: a QP in Reset takes no WRs and one in Init no
// sends (ErrInvalidState); Init takes receives, which flush on the move
// to Err.
func testPostInWrongState(t *testing.T, h Harness) {
	requireCap(t, h, verbs.CapModifyConnect, "CapModifyConnect")
	p := h.NewPair(t, PairOptions{})
	qs, cq := freshQPs(t, p, 2)
	q, dest := qs[0], qs[1].Num()
	r := newRegion(t, p.A, 64, localRW)
	send := []verbs.SendWR{writeWR(1, r, 0, r.SGE(0, 8))}
	recv := []verbs.RecvWR{recvWR(2, r.SGE(0, 64))}
	n, err := q.PostSend(send)
	expectRefused(t, "PostSend on a QP in Reset", n, err, verbs.ErrInvalidState)
	n, err = q.PostRecv(recv)
	expectRefused(t, "PostRecv on a QP in Reset", n, err, verbs.ErrInvalidState)
	modifyTo(t, q, verbs.QPSInit, dest)
	n, err = q.PostSend(send)
	expectRefused(t, "PostSend on a QP in Init", n, err, verbs.ErrInvalidState)
	if n, err := q.PostRecv(recv); n != 1 || err != nil {
		t.Fatalf("PostRecv on a QP in Init: posted %d: %v", n, err)
	}
	modifyTo(t, q, verbs.QPSErr, 0)
	expectStatus(t, waitCQ(t, cq, 1)[0], 2, verbs.WCWRFlushErr)
}

// queriedCap returns the capacities q has: at least those asked for, more
// where the device rounds them up (ibv_create_qp(3)).
func queriedCap(t testing.TB, q *verbs.QP) verbs.QPCap {
	t.Helper()
	a, err := q.Query()
	if err != nil {
		t.Fatalf("query QP %d: %v", q.Num(), err)
	}
	return a.Cap
}

// testSendQueueFull: posting beyond MaxSendWR outstanding WRs (as Query
// reports it) is refused
// with ErrQueueFull, without losing the WRs already posted, and works
// again once their completions are polled.
func testSendQueueFull(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	depth := int(queriedCap(t, p.A.QPs[0]).MaxSendWR)
	src := newRegion(t, p.A, 8*(depth+1), localRW)
	data := pattern(40, 8*(depth+1))
	fill(t, p.A, src, 0, data)
	dst := newRegion(t, p.B, 8*(depth+1), remoteAll)
	wr := func(i int) verbs.SendWR { return writeWR(uint64(1+i), dst, 8*i, src.SGE(8*i, 8)) }
	var wrids []uint64
	for i := range depth - 1 {
		postSend(t, p.A, 0, wr(i))
		wrids = append(wrids, uint64(1+i))
	}
	n, err := p.A.PostSend(0, []verbs.SendWR{wr(depth - 1), wr(depth)})
	expectRefusedAt(t, "a batch of two WRs into one free slot", 1, n, err, verbs.ErrQueueFull)
	wrids = append(wrids, uint64(depth))
	n, err = p.A.PostSend(0, []verbs.SendWR{wr(depth)})
	expectRefused(t, "PostSend on a full send queue", n, err, verbs.ErrQueueFull)

	expectStatuses(t, wait(t, p.A, SendCQ, depth), verbs.WCSuccess, wrids...)
	expectEmpty(t, p.A, SendCQ)
	expectBytes(t, p.B, dst, 0, data[:8*depth], "data of the posted Writes")
	expectZero(t, p.B, dst, 8*depth, 8, "target of the refused Write")
	expectSendWC(t, do(t, p, wr(depth)), uint64(1+depth), verbs.WCRDMAWrite, p.A.QPNum(0))
	expectBytes(t, p.B, dst, 0, data, "data of every Write")
}

// testRecvQueueFull: posting beyond MaxRecvWR receives (as Query reports
// it) is refused with
// ErrQueueFull, without losing the receives already posted, and works
// again once they are consumed and polled.
func testRecvQueueFull(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	depth := int(queriedCap(t, p.A.QPs[0]).MaxRecvWR)
	dst := newRegion(t, p.A, 8*(depth+1), localRW)
	src := newRegion(t, p.B, 8*(depth+1), localRW)
	data := pattern(41, 8*(depth+1))
	fill(t, p.B, src, 0, data)
	var recvs []verbs.RecvWR
	var sends []verbs.SendWR
	var wrids []uint64
	for i := range depth {
		recvs = append(recvs, recvWR(uint64(100+i), dst.SGE(8*i, 8)))
		sends = append(sends, sendWR(uint64(1+i), src.SGE(8*i, 8)))
		wrids = append(wrids, uint64(100+i))
	}
	postRecv(t, p.A, 0, recvs...)
	n, err := p.A.PostRecv(0, []verbs.RecvWR{recvWR(200, dst.SGE(8*depth, 8))})
	expectRefused(t, "PostRecv on a full receive queue", n, err, verbs.ErrQueueFull)

	for batch := int(p.Opts.Cap.MaxSendWR); len(sends) > 0; sends = sends[min(batch, len(sends)):] {
		k := min(batch, len(sends))
		postSend(t, p.B, 0, sends[:k]...)
		wait(t, p.B, SendCQ, k)
	}
	expectStatuses(t, wait(t, p.A, RecvCQ, depth), verbs.WCSuccess, wrids...)
	expectBytes(t, p.A, dst, 0, data[:8*depth], "messages in the posted receives")

	postRecv(t, p.A, 0, recvWR(200, dst.SGE(8*depth, 8)))
	postSend(t, p.B, 0, sendWR(99, src.SGE(8*depth, 8)))
	expectSendWC(t, waitOne(t, p.B, SendCQ), 99, verbs.WCSend, p.B.QPNum(0))
	expectRecvWC(t, waitOne(t, p.A, RecvCQ), 200, verbs.WCRecv, 8, p.A.QPNum(0))
	expectBytes(t, p.A, dst, 0, data, "every message")
}

// testDeregMR: after the responder deregisters a region, Writes and Reads
// naming it fail with WCRemAccessErr and its memory is not touched — also
// on QPs that used the region just before (a requester must not act on
// what it remembers of the key).
func testDeregMR(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{QPs: 2})
	target := newRegion(t, p.B, 64, remoteAll)
	local := newRegion(t, p.A, 64, localRW)
	for qp, wr := range []verbs.SendWR{writeWR(1, target, 0, local.SGE(0, 16)), readWR(2, target, 0, local.SGE(16, 16))} {
		wr.Flags |= verbs.SendSignaled
		postSend(t, p.A, qp, wr)
		expectStatus(t, waitOne(t, p.A, SendCQ), wr.WRID, verbs.WCSuccess)
	}
	fill(t, p.B, target, 0, pattern(42, 64))
	before := snap(t, p.B, target, "deregistered region")
	fill(t, p.A, local, 0, pattern(43, 64))
	if err := p.B.DeregRegion(target.ID); err != nil {
		t.Fatalf("deregister: %v", err)
	}
	expectFault(t, p, 0, writeWR(0, target, 0, local.SGE(0, 16)), verbs.WCRemAccessErr, true)
	expectFault(t, p, 1, readWR(0, target, 0, local.SGE(16, 16)), verbs.WCRemAccessErr, true)
	before.unchanged(t)
	expectBytes(t, p.A, local, 0, pattern(43, 64), "local buffer of the refused Read")
}

// testDeregLocalKey: once a region is deregistered its local key is
// refused: a Send from it fails with WCLocProtErr, on the QP that sent
// from it just before too (a provider that caches its lookups of local
// keys must forget the key), and the peer receives nothing.
func testDeregLocalKey(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	src := newRegion(t, p.A, 64, localRW)
	dst := newRegion(t, p.B, 64, localRW)
	fill(t, p.A, src, 0, pattern(46, 64))
	postRecv(t, p.B, 0, recvWR(1, dst.SGE(0, 32)))
	expectStatus(t, do(t, p, sendWR(2, src.SGE(0, 16))), 2, verbs.WCSuccess)
	expectRecvWC(t, waitOne(t, p.B, RecvCQ), 1, verbs.WCRecv, 16, p.B.QPNum(0))
	if err := p.A.DeregRegion(src.ID); err != nil {
		t.Fatalf("deregister: %v", err)
	}
	postRecv(t, p.B, 0, recvWR(3, dst.SGE(32, 32)))
	expectFault(t, p, 0, sendWR(0, src.SGE(16, 16)), verbs.WCLocProtErr, false)
	expectZero(t, p.B, dst, 32, 32, "receive buffer of a Send from a deregistered region")
}

// testDeregContainer: a region registered inside provider memory keeps
// that memory alive when the allocation around it is deregistered: Writes
// and Reads through the region, and Sends into it, still work, on both
// sides, and nothing outside it changes.
func testDeregContainer(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	target := newRegion(t, p.B, 64, remoteAll)
	local := newRegion(t, p.A, 64, localRW)
	fill(t, p.A, local, 0, pattern(44, 64))
	for _, e := range []struct {
		ep Endpoint
		r  Region
	}{{p.B, target}, {p.A, local}} {
		if err := e.ep.DeregContainer(e.r.ID); err != nil {
			t.Fatalf("deregister the allocation around region %d: %v", e.r.ID, err)
		}
	}
	expectStatus(t, do(t, p, writeWR(1, target, 0, local.SGE(0, 32))), 1, verbs.WCSuccess)
	expectStatus(t, do(t, p, readWR(2, target, 0, local.SGE(32, 32))), 2, verbs.WCSuccess)
	expectBytes(t, p.B, target, 0, pattern(44, 64)[:32], "region written after its container was deregistered")
	expectBytes(t, p.A, local, 32, pattern(44, 64)[:32], "region read into after its container was deregistered")
	postRecv(t, p.B, 0, recvWR(3, target.SGE(32, 32)))
	expectStatus(t, do(t, p, sendWR(4, local.SGE(0, 16))), 4, verbs.WCSuccess)
	expectStatus(t, waitOne(t, p.B, RecvCQ), 3, verbs.WCSuccess)
	expectBytes(t, p.B, target, 32, pattern(44, 64)[:16], "receive placed after its container was deregistered")
	expectCanaries(t, p.B, target)
}

// testDestroyOrder: objects in use cannot be destroyed (ErrBusy): a CQ
// used by a QP, a PD with a live region, an SRQ used by a QP; once their
// users are gone they can.
func testDestroyOrder(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	qs, cq := freshQPs(t, p, 1)
	if err := cq.Destroy(); !errors.Is(err, verbs.ErrBusy) {
		t.Fatalf("destroying a CQ a QP uses returned %v, want an error wrapping ErrBusy", err)
	}

	pd, err := p.A.Ctx.AllocPD()
	if err != nil {
		t.Fatalf("alloc PD: %v", err)
	}
	mr, err := pd.AllocMR(64, localRW)
	if err != nil {
		t.Fatalf("alloc MR: %v", err)
	}
	if err := pd.Dealloc(); !errors.Is(err, verbs.ErrBusy) {
		t.Fatalf("deallocating a PD with a live region returned %v, want an error wrapping ErrBusy", err)
	}
	if err := mr.Dereg(); err != nil {
		t.Fatalf("dereg: %v", err)
	}
	if err := pd.Dealloc(); err != nil {
		t.Fatalf("deallocating an unused PD: %v", err)
	}

	if p.A.Attr().Has(verbs.CapSRQ) {
		srq, err := p.A.PD.CreateSRQ(verbs.SRQInitAttr{MaxWR: 4, MaxSGE: 1})
		if err != nil {
			t.Fatalf("create SRQ: %v", err)
		}
		q, err := p.A.PD.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, SRQ: srq, Cap: verbs.QPCap{MaxSendWR: 1}})
		if err != nil {
			srq.Destroy()
			t.Fatalf("create QP on an SRQ: %v", err)
		}
		if err := srq.Destroy(); !errors.Is(err, verbs.ErrBusy) {
			q.Destroy()
			t.Fatalf("destroying an SRQ a QP uses returned %v, want an error wrapping ErrBusy", err)
		}
		if err := q.Destroy(); err != nil {
			t.Fatalf("destroy QP: %v", err)
		}
		if err := srq.Destroy(); err != nil {
			t.Fatalf("destroying an unused SRQ: %v", err)
		}
	}

	if err := qs[0].Destroy(); err != nil {
		t.Fatalf("destroy QP: %v", err)
	}
	if err := cq.Destroy(); err != nil {
		t.Fatalf("destroying a CQ no QP uses: %v", err)
	}
}

// testCQOverrun: more completions than a CQ holds (CQE, at least what
// was asked for) are an overrun that is reported, not silent: CQ.Err
// wraps ErrCQOverrun, EventCQErr arrives, and the QP that lost
// completions moves to the error state. (What Poll then returns is the
// device's affair: ibv_poll_cq(3) says an overrun CQ cannot be used.)
func testCQOverrun(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{CQDepth: 4, Cap: verbs.QPCap{MaxSendWR: 64}})
	depth := p.A.SendCQ.CQE()
	if depth < 4 {
		t.Fatalf("a CQ created for 4 completions holds %d", depth)
	}
	n := int(queriedCap(t, p.A.QPs[0]).MaxSendWR)
	if n <= depth {
		t.Fatalf("a send queue of %d WRs cannot overrun a CQ of %d", n, depth)
	}
	src := newRegion(t, p.A, 8, localRW)
	dst := newRegion(t, p.B, 8*n, remoteAll)
	var wrs []verbs.SendWR
	for i := range n {
		wrs = append(wrs, writeWR(uint64(1+i), dst, 8*i, src.SGE(0, 8)))
	}
	postSend(t, p.A, 0, wrs...)
	ev, ok := p.A.WaitEvent(verbs.EventCQErr, timeout)
	if !ok {
		t.Fatalf("no EventCQErr within %v of %d completions on a CQ of %d", timeout, n, depth)
	}
	if ev.Element != any(p.A.SendCQ) {
		t.Fatalf("EventCQErr names %v, want the send CQ %p", ev.Element, p.A.SendCQ)
	}
	if err := p.A.SendCQ.Err(); !errors.Is(err, verbs.ErrCQOverrun) {
		t.Fatalf("CQ.Err after an overrun returned %v, want an error wrapping ErrCQOverrun", err)
	}
	expectState(t, p.A, 0, verbs.QPSErr)
	if p.A.Attr().Has(verbs.CapQPErrorEvents) {
		if ev, ok := p.A.WaitEvent(verbs.EventQPFatal, timeout); !ok || ev.Element != any(p.A.QPs[0]) {
			t.Fatalf("no EventQPFatal naming the QP whose completions the overrun CQ lost (got %v)", ev.Element)
		}
	}
}

// testQueriedCap: Query reports capacities at least as large as those
// CreateQP asked for (ibv_create_qp(3) may give more, never less).
func testQueriedCap(t *testing.T, h Harness) {
	want := verbs.QPCap{MaxSendWR: 13, MaxRecvWR: 11, MaxSendSGE: 3, MaxRecvSGE: 2, MaxInlineData: 40}
	p := h.NewPair(t, PairOptions{Cap: want})
	got := queriedCap(t, p.A.QPs[0])
	if got.MaxSendWR < want.MaxSendWR || got.MaxRecvWR < want.MaxRecvWR || got.MaxSendSGE < want.MaxSendSGE ||
		got.MaxRecvSGE < want.MaxRecvSGE || got.MaxInlineData < want.MaxInlineData {
		t.Fatalf("Query reports %+v, less than the %+v asked for", got, want)
	}
}

// testReuse: connected QPs moved to Err and back to Reset are connected
// again through cm (Reset→Init→RTR→RTS), three times, and carry traffic
// each time; their CQs hold the flushes of the old connection's WRs,
// polled before the reset, and afterwards nothing but the new
// connection's completions. B is in another process where the harness
// puts it there.
func testReuse(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	src := newRegion(t, p.A, 64, localRW)
	dst := newRegion(t, p.B, 64, localRW)
	const rounds = 3
	for round := range rounds {
		msg := pattern(80+round, 16)
		fill(t, p.A, src, 0, msg)
		base := uint64(100 * round)
		postRecv(t, p.B, 0, recvWR(base+1, dst.SGE(0, 16)), recvWR(base+2, dst.SGE(16, 16)))
		postRecv(t, p.A, 0, recvWR(base+3, src.SGE(32, 16)))
		expectSendWC(t, do(t, p, sendWR(base+4, src.SGE(0, 16))), base+4, verbs.WCSend, p.A.QPNum(0))
		expectRecvWC(t, waitOne(t, p.B, RecvCQ), base+1, verbs.WCRecv, 16, p.B.QPNum(0))
		expectBytes(t, p.B, dst, 0, msg, fmt.Sprintf("message of connection %d", round+1))
		if round == rounds-1 {
			break
		}
		for _, e := range []Endpoint{p.A, p.B} {
			if err := e.SetQPState(0, verbs.QPSErr); err != nil {
				t.Fatalf("round %d: move QP to Err: %v", round, err)
			}
		}
		expectStatus(t, waitOne(t, p.A, RecvCQ), base+3, verbs.WCWRFlushErr)
		expectStatus(t, waitOne(t, p.B, RecvCQ), base+2, verbs.WCWRFlushErr)
		for _, e := range []Endpoint{p.A, p.B} {
			if err := e.SetQPState(0, verbs.QPSReset); err != nil {
				t.Fatalf("round %d: move QP to Reset: %v", round, err)
			}
			expectState(t, e, 0, verbs.QPSReset)
			for _, cq := range []CQKind{SendCQ, RecvCQ} {
				expectEmpty(t, e, cq)
			}
		}
		addr := h.Addr(t)
		if err := p.B.Relisten(0, addr); err != nil {
			t.Fatalf("round %d: B listens again: %v", round, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		c, err := cm.Dial(ctx, addr, p.A.QPs[0], p.Opts.param())
		cancel()
		if err != nil {
			t.Fatalf("round %d: dial again: %v", round, err)
		}
		p.A.Conns = append(p.A.Conns, c)
		if err := p.B.Reaccepted(); err != nil {
			t.Fatalf("round %d: B accepts again: %v", round, err)
		}
	}
	for _, e := range []Endpoint{p.A, p.B} {
		for _, cq := range []CQKind{SendCQ, RecvCQ} {
			expectEmpty(t, e, cq)
		}
	}
}

// testConnectWrongState: cm connects only a QP in Reset or Init. Dial
// with a connected QP, in RTS and then in Err, fails with ErrInvalidState
// and leaves the QP as it was.
func testConnectWrongState(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	addr := h.Addr(t)
	for _, state := range []verbs.QPState{verbs.QPSRTS, verbs.QPSErr} {
		if state == verbs.QPSErr {
			if err := p.A.SetQPState(0, verbs.QPSErr); err != nil {
				t.Fatalf("move QP to Err: %v", err)
			}
		}
		expectState(t, p.A, 0, state)
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		c, err := cm.Dial(ctx, addr, p.A.QPs[0], p.Opts.param())
		cancel()
		if c != nil {
			c.Close()
		}
		if !errors.Is(err, verbs.ErrInvalidState) {
			t.Fatalf("Dial with a QP in %v: %v, want ErrInvalidState", state, err)
		}
		expectState(t, p.A, 0, state)
	}
}

// testDrain: a QP moved to SQD finishes the WRs under way, then raises
// EventSQDrained, by which time their completions are in the CQ; the WRs
// it had not begun, and a WR posted in SQD, wait for the move back to
// RTS. Which of the Writes posted just before the move had begun is the
// device's affair: the ones that completed by the event are a prefix of
// them, in order.
func testDrain(t *testing.T, h Harness) {
	requireCap(t, h, verbs.CapSQD, "CapSQD")
	p := h.NewPair(t, PairOptions{})
	const n = 8
	src := newRegion(t, p.A, 8*(n+1), localRW)
	data := pattern(47, 8*(n+1))
	fill(t, p.A, src, 0, data)
	dst := newRegion(t, p.B, 8*(n+1), remoteAll)
	var wrs []verbs.SendWR
	for i := range n {
		wrs = append(wrs, writeWR(uint64(1+i), dst, 8*i, src.SGE(8*i, 8)))
	}
	postSend(t, p.A, 0, wrs...)
	qp := p.A.QPs[0]
	if err := qp.Modify(&verbs.QPAttr{State: verbs.QPSSQD}, verbs.QPAttrState); err != nil {
		t.Fatalf("move to SQD: %v", err)
	}
	postSend(t, p.A, 0, writeWR(100, dst, 8*n, src.SGE(8*n, 8)))
	if _, ok := p.A.WaitEvent(verbs.EventSQDrained, timeout); !ok {
		t.Fatalf("no EventSQDrained within %v of the move to SQD", timeout)
	}
	before, err := p.A.Completions(SendCQ, 0, 0)
	if err != nil {
		t.Fatalf("poll the send CQ: %v", err)
	}
	expectQuiet(t, p.A, SendCQ, "a Write completed in SQD after EventSQDrained")
	expectZero(t, p.B, dst, 8*n, 8, "target of the Write posted in SQD")
	if err := qp.Modify(&verbs.QPAttr{State: verbs.QPSRTS}, verbs.QPAttrState); err != nil {
		t.Fatalf("move back to RTS: %v", err)
	}
	after := wait(t, p.A, SendCQ, n+1-len(before))
	var wrids []uint64
	for i := range n {
		wrids = append(wrids, uint64(1+i))
	}
	expectStatuses(t, append(before, after...), verbs.WCSuccess, append(wrids, 100)...)
	expectBytes(t, p.B, dst, 0, data, "every Write")
	t.Logf("%d of the %d Writes had completed by EventSQDrained", len(before), n)
}

// testRecvCQOverrun: a receive CQ overrun by the peer's Sends is
// reported on the receiver's side: EventCQErr, CQ.Err wrapping
// ErrCQOverrun, and the receiving QP in the error state. (On shm0 the
// peer writes the receive completions into the CQ itself.)
func testRecvCQOverrun(t *testing.T, h Harness) {
	const n = 64
	p := h.NewPair(t, PairOptions{CQDepth: 4, Cap: verbs.QPCap{MaxSendWR: n, MaxRecvWR: n}})
	if d := p.A.SendCQ.CQE(); d >= n {
		t.Fatalf("a CQ created for 4 completions holds %d: %d Sends cannot overrun it", d, n)
	}
	src := newRegion(t, p.A, 8, localRW)
	dst := newRegion(t, p.B, 8*n, localRW)
	var recvs []verbs.RecvWR
	var sends []verbs.SendWR
	for i := range n {
		recvs = append(recvs, recvWR(uint64(100+i), dst.SGE(8*i, 8)))
		wr := sendWR(uint64(1+i), src.SGE(0, 8))
		wr.Flags &^= verbs.SendSignaled
		sends = append(sends, wr)
	}
	postRecv(t, p.B, 0, recvs...)
	postSend(t, p.A, 0, sends...)
	if _, ok, err := p.B.QPEvent(verbs.EventCQErr, timeout); err != nil || !ok {
		t.Fatalf("no EventCQErr on B within %v of %d Sends into a receive CQ of 4 (error %v)", timeout, n, err)
	}
	if _, err := p.B.Completions(RecvCQ, 0, 0); !errors.Is(err, verbs.ErrCQOverrun) {
		t.Fatalf("B's receive CQ after an overrun reports %v, want an error wrapping ErrCQOverrun", err)
	}
	expectState(t, p.B, 0, verbs.QPSErr)
	if p.B.Attr().Has(verbs.CapQPErrorEvents) {
		if qp, ok, err := p.B.QPEvent(verbs.EventQPFatal, timeout); err != nil || !ok || qp != 0 {
			t.Fatalf("no EventQPFatal on B naming the QP whose completions the overrun CQ lost (QP %d, error %v)", qp, err)
		}
	}
}
