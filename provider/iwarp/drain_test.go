package iwarp_test

import (
	"testing"
	"time"

	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// TestLastWQEAfterReceiveFlushed: B (on an SRQ) moves to the error state
// while A's large Send is placed into B's SRQ buffer: by the time
// EventQPLastWQEReached comes, the receive has completed (flushed) and
// nothing more lands in its buffer. (Found by review, 2 December: shm0
// raised it while the copy went on.)
func TestLastWQEAfterReceiveFlushed(t *testing.T) {
	const size = 64 << 20
	open := func() (*verbs.Context, *verbs.PD, *verbs.CQ, *verbs.MR) {
		ctx, err := verbs.Open("tcp0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ctx.Close() })
		pd, _ := ctx.AllocPD()
		cq, _ := ctx.CreateCQ(64)
		mr, err := pd.AllocMR(size, verbs.AccessLocalWrite|verbs.RemoteAccess)
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
	verbstest.Connect(t, "tcp://127.0.0.1:0", bqp, aqp)
	if _, err := srq.PostRecv([]verbs.RecvWR{{WRID: 7, SGList: []verbs.SGE{bmr.SGE(0, size)}}}); err != nil {
		t.Fatal(err)
	}
	src := amr.Bytes()
	for i := range src {
		src[i] = 0xab
	}
	dst := bmr.Bytes()
	if _, err := aqp.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.OpSend, SGList: []verbs.SGE{amr.SGE(0, size)}}}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); dst[4096] != 0xab; {
		if time.Now().After(deadline) {
			t.Fatal("A's Send did not begin")
		}
	}
	if err := bqp.Modify(&verbs.QPAttr{State: verbs.QPSErr}, verbs.QPAttrState); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-bctx.Events():
		if ev.Type != verbs.EventQPLastWQEReached {
			t.Fatalf("event %v", ev.Type)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no EventQPLastWQEReached")
	}
	wc := make([]verbs.WorkCompletion, 4)
	n := bcq.Poll(wc)
	snap := append([]byte(nil), dst...)
	time.Sleep(200 * time.Millisecond)
	changed := string(snap) != string(dst)
	t.Logf("at the event: %d CQEs %+v; buffer changed after the event: %v", n, wc[:n], changed)
	if n == 0 || changed {
		t.Fatal("EventQPLastWQEReached before the SRQ receive was done")
	}
}

// TestSQDrainedAfterReadResponse: B's 64 MiB RDMA Read is under way (its
// response is arriving) when B moves to SQD. IB: SQ Drained means every
// response owed to the messages in progress has come, and their WQEs have
// completed (CQEs created). (Found by review, 2 December.)
func TestSQDrainedAfterReadResponse(t *testing.T) {
	const size = 64 << 20
	a, b, _, _ := connectPair(t, size, nil, nil)
	src := a.mr.Bytes()
	for i := range src {
		src[i] = 0xab
	}
	if _, err := b.qp.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{b.mr.SGE(0, size)}, RemoteAddr: a.mr.Addr(), RKey: a.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	got := b.mr.Bytes()
	for deadline := time.Now().Add(10 * time.Second); got[4096] != 0xab; {
		if time.Now().After(deadline) {
			t.Fatal("B's Read did not begin")
		}
	}
	if err := b.qp.Modify(&verbs.QPAttr{State: verbs.QPSSQD}, verbs.QPAttrState); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-b.ctx.Events():
		if ev.Type != verbs.EventSQDrained {
			t.Fatalf("B's event: %v", ev.Type)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no EventSQDrained")
	}
	wc := make([]verbs.WorkCompletion, 4)
	n := b.cq.Poll(wc)
	last := got[size-1] == 0xab
	if n == 0 {
		wb := b.wait(t, 1)
		t.Fatalf("EventSQDrained while the Read was outstanding (last byte in: %v); its completion came after: %+v", last, wb[0])
	}
}

// TestSQDrainedAfterWriteConfirmed: as TestSQDFinishesMessage, but checks
// the order: the drained event must not precede the Write's completion.
// (Found by review, 2 December.)
func TestSQDrainedAfterWriteConfirmed(t *testing.T) {
	const size = 64 << 20
	a, b, _, _ := connectPair(t, size, nil, nil)
	mem := b.mr.Bytes()
	for i := range mem {
		mem[i] = 0xab
	}
	if _, err := b.qp.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{b.mr.SGE(0, size)}, RemoteAddr: a.mr.Addr(), RKey: a.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	got := a.mr.Bytes()
	for deadline := time.Now().Add(10 * time.Second); got[4096] != 0xab; a.cq.Poll(nil) {
		if time.Now().After(deadline) {
			t.Fatal("B's Write did not begin")
		}
	}
	if err := b.qp.Modify(&verbs.QPAttr{State: verbs.QPSSQD}, verbs.QPAttrState); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-b.ctx.Events():
		if ev.Type != verbs.EventSQDrained {
			t.Fatalf("B's event: %v", ev.Type)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no EventSQDrained")
	}
	wc := make([]verbs.WorkCompletion, 4)
	n := b.cq.Poll(wc)
	last := got[size-1] == 0xab
	if n == 0 {
		wb := b.wait(t, 1)
		t.Fatalf("EventSQDrained before the Write in progress completed (its last byte at A: %v); completion after: %+v", last, wb[0])
	}
}

// TestSQDKeepsUnbuiltWR: a WR none of whose frames fitted the batch when
// the QP moved to SQD has not begun, and waits for the move back to RTS.
// (Found by review, 2 December: it went out in SQD.)
func TestSQDKeepsUnbuiltWR(t *testing.T) {
	const p = 100
	defer iwarp.SetMaxPayload(p)()
	a, b, _, _ := connectPair(t, 1<<20, nil, nil)
	mem := b.mr.Bytes()
	for i := range 128 * p {
		mem[i] = 0xab
	}
	copy(mem[200000:], []byte{1, 2, 3, 4, 5, 6, 7, 8})
	round, release := iwarp.HoldTx(b.qp.Driver())
	// WR 1: exactly 128 frames, a whole batch. WR 2: 8 bytes.
	if _, err := b.qp.PostSend([]verbs.SendWR{
		{WRID: 1, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
			SGList: []verbs.SGE{b.mr.SGE(0, 128*p)}, RemoteAddr: a.mr.Addr(), RKey: a.mr.RKey()},
		{WRID: 2, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
			SGList: []verbs.SGE{b.mr.SGE(200000, 8)}, RemoteAddr: a.mr.Addr() + 200000, RKey: a.mr.RKey()},
	}); err != nil {
		release()
		t.Fatal(err)
	}
	round() // WR 1's 128 frames; WR 2 does not fit
	if err := b.qp.Modify(&verbs.QPAttr{State: verbs.QPSSQD}, verbs.QPAttrState); err != nil {
		release()
		t.Fatal(err)
	}
	release()
	// Drained once WR 1 is confirmed: WR 2, had it gone, would have
	// gone before the confirming Read, and be at A by now.
	select {
	case ev := <-b.ctx.Events():
		if ev.Type != verbs.EventSQDrained {
			t.Fatalf("B's event: %v", ev.Type)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no EventSQDrained")
	}
	if wb := b.wait(t, 1); wb[0].WRID != 1 || wb[0].Status != verbs.WCSuccess {
		t.Fatalf("WR 1: %+v", wb[0])
	}
	got := a.mr.Bytes()
	if got[128*p-1] != 0xab {
		t.Fatal("WR 1 completed and its last byte is not at A")
	}
	if got[200000] != 0 {
		t.Fatalf("WR 2, none of which was built when the QP moved to SQD, went out in SQD (A has %v)", got[200000:200008])
	}
	if err := b.qp.Modify(&verbs.QPAttr{State: verbs.QPSRTS}, verbs.QPAttrState); err != nil {
		t.Fatal(err)
	}
	if wb := b.wait(t, 1); wb[0].WRID != 2 || wb[0].Status != verbs.WCSuccess {
		t.Fatalf("WR 2 after the move back to RTS: %+v", wb[0])
	}
}
