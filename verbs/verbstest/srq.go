package verbstest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/goverbs/goverbs/verbs"
)

// srqPair makes a pair of qps QPs whose B side draws its receives from
// one SRQ, skipping the case if the device has no SRQs.
func srqPair(t *testing.T, h Harness, qps int) *Pair {
	t.Helper()
	requireCap(t, h, verbs.CapSRQ, "CapSRQ")
	return h.NewPair(t, PairOptions{QPs: qps, SRQ: true})
}

// postSRQ posts k receives of 8 bytes each to B's SRQ, into consecutive
// slots of r from slot first, with WRIDs 100+slot.
func postSRQ(t testing.TB, p *Pair, r Region, first, k int) {
	t.Helper()
	var wrs []verbs.RecvWR
	for i := first; i < first+k; i++ {
		wrs = append(wrs, recvWR(uint64(100+i), r.SGE(8*i, 8)))
	}
	if n, err := p.B.PostSRQRecv(wrs); n != k || err != nil {
		t.Fatalf("PostSRQRecv of %d receives: posted %d: %v", k, n, err)
	}
}

// testSRQShared: three QPs draw their receives from one SRQ; each
// receive completion names the QP the message arrived on and its sender.
func testSRQShared(t *testing.T, h Harness) {
	const qps = 3
	p := srqPair(t, h, qps)
	size := func(i int) int { return 8 + 8*i }
	dst := newRegion(t, p.B, qps*64, localRW)
	var recvs []verbs.RecvWR
	for j := range qps {
		recvs = append(recvs, recvWR(uint64(100+j), dst.SGE(64*j, 64)))
	}
	if n, err := p.B.PostSRQRecv(recvs); n != qps || err != nil {
		t.Fatalf("PostSRQRecv: posted %d: %v", n, err)
	}
	src := newRegion(t, p.A, qps*64, localRW)
	for i := range qps {
		fill(t, p.A, src, 64*i, pattern(60+i, size(i)))
		postSend(t, p.A, i, sendWR(uint64(1+i), src.SGE(64*i, size(i))))
	}
	for _, wc := range wait(t, p.A, SendCQ, qps) {
		if wc.Status != verbs.WCSuccess {
			t.Fatalf("send completion %s", fmtWC(wc))
		}
	}
	byQP := map[uint32]int{}
	for i := range qps {
		byQP[p.B.QPNum(i)] = i
	}
	slots := map[uint64]bool{}
	for _, wc := range wait(t, p.B, RecvCQ, qps) {
		i, ok := byQP[wc.QPNum]
		if !ok {
			t.Fatalf("receive completion %s names no QP of B, or one twice", fmtWC(wc))
		}
		delete(byQP, wc.QPNum)
		if slots[wc.WRID] || wc.WRID < 100 || wc.WRID >= 100+qps {
			t.Fatalf("receive completion %s: WRID of no posted receive, or one consumed twice", fmtWC(wc))
		}
		slots[wc.WRID] = true
		expectRecvWC(t, wc, wc.WRID, verbs.WCRecv, size(i), p.B.QPNum(i))
		expectBytes(t, p.B, dst, 64*int(wc.WRID-100), pattern(60+i, size(i)), "message in the SRQ receive it consumed")
	}
}

// testSRQLimit: an armed SRQ raises its limit event once, when fewer than
// the limit receives remain posted, and disarms.
func testSRQLimit(t *testing.T, h Harness) {
	p := srqPair(t, h, 1)
	dst := newRegion(t, p.B, 16*8, localRW)
	src := newRegion(t, p.A, 8, localRW)
	send := func(k int) {
		t.Helper()
		for i := range k {
			postSend(t, p.A, 0, sendWR(uint64(1+i), src.SGE(0, 8)))
		}
		wait(t, p.A, SendCQ, k)
		for _, wc := range wait(t, p.B, RecvCQ, k) {
			if wc.Status != verbs.WCSuccess {
				t.Fatalf("receive completion %s", fmtWC(wc))
			}
		}
	}
	expectLimitEvent := func(want bool, within string) {
		t.Helper()
		d := shortWait
		if want {
			d = timeout
		}
		got, err := p.B.SRQLimitEvent(d)
		if err != nil {
			t.Fatalf("SRQLimitEvent: %v", err)
		}
		if got != want {
			t.Fatalf("SRQ limit event %s: got %v, want %v", within, got, want)
		}
	}
	postSRQ(t, p, dst, 0, 8)
	if err := p.B.ArmSRQLimit(4); err != nil {
		t.Fatalf("ArmSRQLimit: %v", err)
	}
	send(3)
	expectLimitEvent(false, "with 5 receives left and a limit of 4")
	send(1)
	expectLimitEvent(false, "with 4 receives left and a limit of 4")
	send(1)
	expectLimitEvent(true, "with 3 receives left and a limit of 4")
	postSRQ(t, p, dst, 8, 8)
	send(9)
	expectLimitEvent(false, "again without re-arming")
}

// testSRQOtherPD: a QP cannot draw its receives from an SRQ of another
// PD (a PD's objects are used only with each other: a Send is placed
// only into memory of the receiving QP's PD). CreateQP refuses it with
// ErrInvalidArg and takes nothing: the other PD can be deallocated at
// once, and a QP of the SRQ's own PD gets the SRQ.
func testSRQOtherPD(t *testing.T, h Harness) {
	requireCap(t, h, verbs.CapSRQ, "CapSRQ")
	ctx, pd1, cq := openLocal(t, h.Device)
	pd2, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	srq, err := pd2.CreateSRQ(verbs.SRQInitAttr{MaxWR: 4, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	attr := verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, SRQ: srq, Cap: verbs.QPCap{MaxSendWR: 4, MaxSendSGE: 1}}
	if q, err := pd1.CreateQP(attr); !errors.Is(err, verbs.ErrInvalidArg) {
		if q != nil {
			q.Destroy()
		}
		t.Fatalf("CreateQP on one PD with an SRQ of another: %v, want ErrInvalidArg", err)
	}
	if err := pd1.Dealloc(); err != nil {
		t.Fatalf("deallocating the PD after the refused CreateQP: %v", err)
	}
	q, err := pd2.CreateQP(attr)
	if err != nil {
		t.Fatalf("CreateQP on the SRQ's own PD: %v", err)
	}
	if err := q.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := srq.Destroy(); err != nil {
		t.Fatalf("destroying the SRQ once its QP is gone: %v", err)
	}
}

// testSRQLastWQE: a QP that takes its receives from an SRQ raises
// EventQPLastWQEReached, once, when it moves to the error state (it will
// take no more receives from the SRQ, so the application may destroy it);
// a QP with receives of its own raises none.
func testSRQLastWQE(t *testing.T, h Harness) {
	requireCap(t, h, verbs.CapSRQ, "CapSRQ")
	ctx, pd, cq := openLocal(t, h.Device)
	srq, err := pd.CreateSRQ(verbs.SRQInitAttr{MaxWR: 4, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	onSRQ, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, SRQ: srq, Cap: verbs.QPCap{MaxSendWR: 4, MaxSendSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer onSRQ.Destroy()
	own, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxSendSGE: 1, MaxRecvWR: 4, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer own.Destroy()
	for _, q := range []*verbs.QP{own, onSRQ} {
		if err := q.Modify(&verbs.QPAttr{State: verbs.QPSErr}, verbs.QPAttrState); err != nil {
			t.Fatalf("move QP %d to the error state: %v", q.Num(), err)
		}
	}
	got := 0
	for deadline := time.After(timeout); got == 0; {
		select {
		case ev := <-ctx.Events():
			if ev.Type != verbs.EventQPLastWQEReached {
				continue
			}
			if ev.Element != onSRQ {
				t.Fatalf("EventQPLastWQEReached for %v, want the QP on the SRQ (%d)", ev.Element, onSRQ.Num())
			}
			got++
		case <-deadline:
			t.Fatal("no EventQPLastWQEReached for a QP on an SRQ moved to the error state")
		}
	}
	// Once: moving it to the error state again, or the other QP's move,
	// raises no other.
	if err := onSRQ.Modify(&verbs.QPAttr{State: verbs.QPSErr}, verbs.QPAttrState); err != nil {
		t.Fatal(err)
	}
	for deadline := time.After(shortWait); ; {
		select {
		case ev := <-ctx.Events():
			if ev.Type == verbs.EventQPLastWQEReached {
				t.Fatalf("a second EventQPLastWQEReached, for %v", ev.Element)
			}
			continue
		case <-deadline:
		}
		break
	}
}

// srqPlacement is B's side of a large Send from A being placed into the
// receive B's QP took from its SRQ (startSRQPlacement).
type srqPlacement struct {
	ctx  *verbs.Context
	qp   *verbs.QP
	cq   *verbs.CQ
	dst  []byte     // the receive's buffer
	sent chan error // A's PostSend's result
}

// startSRQPlacement connects A to B, whose QP takes its receives from an
// SRQ holding one receive (WRID 7) of 32 MiB, and has A send 32 MiB into
// it; it returns once the first bytes have landed. Both ends live in the
// test's process, where B's events can be read, so the cases that use it
// run in the harnesses without a remote B (each provider's in-process
// one). The Send is posted from a goroutine, since a provider may copy it
// within PostSend.
func startSRQPlacement(t *testing.T, h Harness) *srqPlacement {
	t.Helper()
	requireCap(t, h, verbs.CapSRQ, "CapSRQ")
	if h.Remote != nil {
		skip(t, bothLocal)
	}
	const size = 32 << 20
	open := func() (*verbs.Context, *verbs.PD, *verbs.CQ, *verbs.MR) {
		ctx, pd, cq := openLocal(t, h.Device)
		mr, err := pd.AllocMR(size, localRW)
		if err != nil {
			t.Fatal(err)
		}
		return ctx, pd, cq, mr
	}
	_, apd, acq, amr := open()
	bctx, bpd, bcq, bmr := open()
	srq, err := bpd.CreateSRQ(verbs.SRQInitAttr{MaxWR: 4, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	aqp, err := apd.CreateQP(verbs.QPInitAttr{SendCQ: acq, RecvCQ: acq, Cap: verbs.QPCap{MaxSendWR: 4, MaxSendSGE: 1, MaxRecvWR: 4, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	bqp, err := bpd.CreateQP(verbs.QPInitAttr{SendCQ: bcq, RecvCQ: bcq, SRQ: srq, Cap: verbs.QPCap{MaxSendWR: 4, MaxSendSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	Connect(t, h.Addr(t), bqp, aqp)
	if _, err := srq.PostRecv([]verbs.RecvWR{recvWR(7, bmr.SGE(0, size))}); err != nil {
		t.Fatal(err)
	}
	src := amr.Bytes()
	for i := range src {
		src[i] = 0xab
	}
	p := &srqPlacement{ctx: bctx, qp: bqp, cq: bcq, dst: bmr.Bytes(), sent: make(chan error, 1)}
	go func() {
		_, err := aqp.PostSend([]verbs.SendWR{sendWR(1, amr.SGE(0, size))})
		p.sent <- err
	}()
	for deadline := time.Now().Add(timeout); p.dst[4096] != 0xab; bcq.Poll(nil) {
		if time.Now().After(deadline) {
			t.Fatal("A's Send did not begin to land in B's SRQ receive")
		}
	}
	return p
}

// testSRQLastWQEAfterPlacement: B's QP, on an SRQ, moves to the error
// state while A's large Send is being placed into the SRQ receive it
// took. By the time EventQPLastWQEReached comes, that receive has
// completed (with success or flushed) and nothing more lands in its
// buffer: the event tells the application the QP takes nothing more
// from the SRQ.
func testSRQLastWQEAfterPlacement(t *testing.T, h Harness) {
	p := startSRQPlacement(t, h)
	if err := p.qp.Modify(&verbs.QPAttr{State: verbs.QPSErr}, verbs.QPAttrState); err != nil {
		t.Fatal(err)
	}
	for deadline := time.After(timeout); ; {
		select {
		case ev := <-p.ctx.Events():
			if ev.Type != verbs.EventQPLastWQEReached {
				continue
			}
		case <-deadline:
			t.Fatal("no EventQPLastWQEReached")
		}
		break
	}
	wc := make([]verbs.WorkCompletion, 4)
	// A flushed completion's opcode means nothing (ibv_poll_cq(3)).
	if n := p.cq.Poll(wc); n != 1 || wc[0].WRID != 7 || (wc[0].Status == verbs.WCSuccess && wc[0].Opcode != verbs.WCRecv) {
		t.Fatalf("at EventQPLastWQEReached, B's CQ held %d completions (%v), want the SRQ receive's", n, wc[:n])
	}
	snap := append([]byte(nil), p.dst...)
	if err := <-p.sent; err != nil {
		t.Fatalf("A's PostSend: %v", err)
	}
	quiet, cancel := context.WithTimeout(context.Background(), shortWait)
	defer cancel()
	if n, _ := p.cq.Wait(quiet, wc); n != 0 {
		t.Fatalf("a completion after EventQPLastWQEReached: %v", wc[:n])
	}
	if !bytes.Equal(snap, p.dst) {
		t.Fatal("bytes landed in the SRQ receive's buffer after EventQPLastWQEReached")
	}
}

// testSRQNoLastWQEAfterReset: as testSRQLastWQEAfterPlacement, but B's QP
// moves on to Reset at once: EventQPLastWQEReached may come before Reset
// returns, never after (the QP it would name is no longer in the error
// state; it may be connected again).
func testSRQNoLastWQEAfterReset(t *testing.T, h Harness) {
	p := startSRQPlacement(t, h)
	for _, st := range []verbs.QPState{verbs.QPSErr, verbs.QPSReset} {
		if err := p.qp.Modify(&verbs.QPAttr{State: st}, verbs.QPAttrState); err != nil {
			t.Fatal(err)
		}
	}
	for len(p.ctx.Events()) > 0 {
		<-p.ctx.Events() // raised before Reset returned
	}
	if err := <-p.sent; err != nil {
		t.Fatalf("A's PostSend: %v", err)
	}
	for deadline := time.After(shortWait); ; {
		select {
		case ev := <-p.ctx.Events():
			if ev.Type == verbs.EventQPLastWQEReached {
				t.Fatal("EventQPLastWQEReached after the QP had moved to Reset")
			}
			continue
		case <-deadline:
		}
		break
	}
}

// testSRQPostRecvOnQP: a QP that takes its receives from an SRQ refuses
// receives of its own, taking none, and still receives through the SRQ.
func testSRQPostRecvOnQP(t *testing.T, h Harness) {
	p := srqPair(t, h, 1)
	dst := newRegion(t, p.B, 64, localRW)
	n, err := p.B.PostRecv(0, []verbs.RecvWR{recvWR(1, dst.SGE(0, 32))})
	if n != 0 || err == nil {
		t.Fatalf("PostRecv on a QP that has an SRQ: posted %d, error %v; want it refused", n, err)
	}
	postSRQ(t, p, dst, 4, 1)
	src := newRegion(t, p.A, 8, localRW)
	fill(t, p.A, src, 0, pattern(61, 8))
	expectSendWC(t, do(t, p, sendWR(2, src.SGE(0, 8))), 2, verbs.WCSend, p.A.QPNum(0))
	expectRecvWC(t, waitOne(t, p.B, RecvCQ), 104, verbs.WCRecv, 8, p.B.QPNum(0))
	expectBytes(t, p.B, dst, 32, pattern(61, 8), "message in the SRQ's receive")
	expectZero(t, p.B, dst, 0, 32, "buffer of the refused receive")
}

// localSRQ opens the device in this process and creates an SRQ of maxWR
// receives of maxSGE SGEs each on a new PD, with a region of size bytes
// on that PD.
func localSRQ(t *testing.T, h Harness, maxWR, maxSGE uint32, size int) (*verbs.SRQ, *verbs.MR) {
	t.Helper()
	requireCap(t, h, verbs.CapSRQ, "CapSRQ")
	_, pd, _ := openLocal(t, h.Device)
	srq, err := pd.CreateSRQ(verbs.SRQInitAttr{MaxWR: maxWR, MaxSGE: maxSGE})
	if err != nil {
		t.Fatalf("create SRQ of %d WRs, %d SGEs: %v", maxWR, maxSGE, err)
	}
	mr, err := pd.AllocMR(size, localRW)
	if err != nil {
		t.Fatal(err)
	}
	return srq, mr
}

// querySRQ queries srq, failing the test if it cannot.
func querySRQ(t testing.TB, srq *verbs.SRQ) verbs.SRQAttr {
	t.Helper()
	a, err := srq.Query()
	if err != nil {
		t.Fatalf("query SRQ: %v", err)
	}
	return a
}

// testSRQFull: an SRQ takes as many receives as Query says it holds (at
// least what was asked for) and refuses the next with ErrQueueFull.
func testSRQFull(t *testing.T, h Harness) {
	srq, mr := localSRQ(t, h, 4, 1, 8)
	a := querySRQ(t, srq)
	if a.MaxWR < 4 || a.MaxSGE < 1 {
		t.Fatalf("SRQ created for 4 WRs of 1 SGE reports %+v", a)
	}
	for i := range int(a.MaxWR) {
		if n, err := srq.PostRecv([]verbs.RecvWR{recvWR(uint64(i), mr.SGE(0, 8))}); n != 1 || err != nil {
			t.Fatalf("receive %d of an SRQ of %d: posted %d: %v", i, a.MaxWR, n, err)
		}
	}
	n, err := srq.PostRecv([]verbs.RecvWR{recvWR(99, mr.SGE(0, 8))})
	expectRefused(t, "PostRecv on a full SRQ", n, err, verbs.ErrQueueFull)
}

// testSRQTooManySGEs: a receive with more SGEs than the SRQ takes is
// refused with ErrInvalidArg; the receives before it in the same post
// are posted.
func testSRQTooManySGEs(t *testing.T, h Harness) {
	srq, mr := localSRQ(t, h, 4, 2, 256)
	k := int(querySRQ(t, srq).MaxSGE)
	var sg []verbs.SGE
	for i := range k + 1 {
		sg = append(sg, mr.SGE(4*i, 4))
	}
	n, err := srq.PostRecv([]verbs.RecvWR{recvWR(1, sg[:k]...), recvWR(2, sg...)})
	expectRefusedAt(t, fmt.Sprintf("SRQ receive with MaxSGE+1 (%d) SGEs", k+1), 1, n, err, verbs.ErrInvalidArg)
}

// testSRQQueryLimit: Query reports the limit Modify armed, and a limit
// above the SRQ's MaxWR is refused with ErrInvalidArg, leaving the armed
// one.
func testSRQQueryLimit(t *testing.T, h Harness) {
	srq, _ := localSRQ(t, h, 8, 1, 8)
	if err := srq.Modify(verbs.SRQAttr{Limit: 3}, verbs.SRQAttrLimit); err != nil {
		t.Fatalf("arm the SRQ limit at 3: %v", err)
	}
	if a := querySRQ(t, srq); a.Limit != 3 {
		t.Fatalf("SRQ armed at 3 reports %+v", a)
	}
	maxWR := querySRQ(t, srq).MaxWR
	if err := srq.Modify(verbs.SRQAttr{Limit: maxWR + 1}, verbs.SRQAttrLimit); !errors.Is(err, verbs.ErrInvalidArg) {
		t.Fatalf("arming the limit at MaxWR+1 (%d) returned %v, want an error wrapping ErrInvalidArg", maxWR+1, err)
	}
	if a := querySRQ(t, srq); a.Limit != 3 {
		t.Fatalf("after a refused Modify the SRQ reports %+v, want limit 3", a)
	}
}

// testSRQLongMessage: a Send of 300 000 bytes is scattered over the four
// SGEs of the SRQ receive it takes, byte-exact.
func testSRQLongMessage(t *testing.T, h Harness) {
	p := srqPair(t, h, 1)
	n := longSize
	src := newRegion(t, p.A, n, localRW)
	data := pattern(62, n)
	fill(t, p.A, src, 0, data)
	dst := newRegion(t, p.B, n, localRW)
	if k, err := p.B.PostSRQRecv([]verbs.RecvWR{recvWR(5, longSGEs(dst, n, 4)...)}); k != 1 || err != nil {
		t.Fatalf("PostSRQRecv: posted %d: %v", k, err)
	}
	expectSendWC(t, do(t, p, sendWR(1, longSGEs(src, n, 3)...)), 1, verbs.WCSend, p.A.QPNum(0))
	expectRecvWC(t, waitOne(t, p.B, RecvCQ), 5, verbs.WCRecv, n, p.B.QPNum(0))
	expectBytes(t, p.B, dst, 0, data, "a long message in an SRQ receive")
	expectCanaries(t, p.B, dst)
}

// testSRQRecvBadLKey: a Send into an SRQ receive whose SGE names no
// region fails at the responder with WCLocProtErr and nothing is
// written; the receiving QP moves to the error state.
func testSRQRecvBadLKey(t *testing.T, h Harness) {
	p := srqPair(t, h, 1)
	dst := newRegion(t, p.B, 32, localRW)
	before := snap(t, p.B, dst, "region of an SRQ receive named with a bad key")
	sge := dst.SGE(0, 32)
	sge.LKey = badKey(sge.LKey)
	if k, err := p.B.PostSRQRecv([]verbs.RecvWR{recvWR(5, sge)}); k != 1 || err != nil {
		t.Fatalf("PostSRQRecv: posted %d: %v", k, err)
	}
	src := newRegion(t, p.A, 16, localRW)
	sent := do(t, p, sendWR(1, src.SGE(0, 16)))
	if sent.Status == verbs.WCWRFlushErr || (sent.Status == verbs.WCSuccess && p.A.Attr().Has(verbs.CapAckedCompletion)) {
		t.Fatalf("Send into an SRQ receive the responder cannot write completed %s, want an error", fmtWC(sent))
	}
	expectStatus(t, waitOne(t, p.B, RecvCQ), 5, verbs.WCLocProtErr)
	expectState(t, p.A, 0, verbs.QPSErr)
	expectState(t, p.B, 0, verbs.QPSErr)
	before.unchanged(t)
}
