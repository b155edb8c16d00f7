package iwarp_test

import (
	"testing"
	"time"

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
