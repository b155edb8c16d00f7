package iwarp_test

import (
	"testing"
	"time"

	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/verbs"
)

// TestSQDrainedAfterCompletion: B's 64 MiB RDMA Read (its response
// arriving) or Write is under way when B moves to SQD. IB: SQ Drained
// means every message in progress is out, every response owed to them
// has come, and their WRs have completed; so the WR's completion is in
// B's CQ when the event comes, not once the last frame is built.
func TestSQDrainedAfterCompletion(t *testing.T) {
	const size = 64 << 20
	for _, op := range []verbs.Opcode{verbs.OpRDMARead, verbs.OpRDMAWrite} {
		t.Run(op.String(), func(t *testing.T) {
			a, b, _, _ := connectPair(t, size, nil, nil)
			from, to := b, a // the Write's source and target
			if op == verbs.OpRDMARead {
				from, to = a, b
			}
			mem := from.mr.Bytes()
			for i := range mem {
				mem[i] = 0xab
			}
			if _, err := b.qp.PostSend([]verbs.SendWR{{WRID: 1, Opcode: op, Flags: verbs.SendSignaled,
				SGList: []verbs.SGE{b.mr.SGE(0, size)}, RemoteAddr: a.mr.Addr(), RKey: a.mr.RKey()}}); err != nil {
				t.Fatal(err)
			}
			got := to.mr.Bytes()
			for deadline := time.Now().Add(10 * time.Second); got[4096] != 0xab; a.cq.Poll(nil) {
				if time.Now().After(deadline) {
					t.Fatalf("B's %v did not begin", op)
				}
			}
			if err := b.qp.Modify(&verbs.QPAttr{State: verbs.QPSSQD}, verbs.QPAttrState); err != nil {
				t.Fatal(err)
			}
			expectEvent(t, b.ctx, verbs.EventSQDrained)
			wc := make([]verbs.WorkCompletion, 4)
			if n := b.cq.Poll(wc); n == 0 {
				last := got[size-1] == 0xab
				wb := b.wait(t, 1)
				t.Fatalf("EventSQDrained before the %v under way completed (its last byte placed: %v); its completion came after: %+v", op, last, wb[0])
			}
		})
	}
}

// TestSQDKeepsUnbuiltWR: a WR none of whose frames fitted the batch when
// the QP moved to SQD has not begun, and waits for the move back to RTS:
// it does not go out in SQD.
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
	expectEvent(t, b.ctx, verbs.EventSQDrained)
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

// expectEvent waits up to 10 s for ctx's next asynchronous event and
// fails unless it is of type typ.
func expectEvent(t *testing.T, ctx *verbs.Context, typ verbs.EventType) {
	t.Helper()
	select {
	case ev := <-ctx.Events():
		if ev.Type != typ {
			t.Fatalf("event %v, want %v", ev.Type, typ)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no %v", typ)
	}
}
