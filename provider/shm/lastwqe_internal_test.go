package shm

import (
	"testing"
	"time"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// TestLastWQEWhileSRQRecvPlaced (found by review, 2 December): B's QP
// takes its receives from an SRQ; A's 64 MiB Send is being copied into
// B's SRQ buffer when B moves to the error state. IB: EventQPLastWQEReached means this QP consumes no
// more SRQ WQEs, i.e. the WQE in progress is done (its CQE written).
func TestLastWQEWhileSRQRecvPlaced(t *testing.T) {
	const size = 64 << 20
	open := func() (*verbs.Context, *verbs.PD, *verbs.CQ, *verbs.MR) {
		ctx, err := verbs.Open(DeviceName)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ctx.Close() })
		pd, err := ctx.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		cq, err := ctx.CreateCQ(64)
		if err != nil {
			t.Fatal(err)
		}
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
	verbstest.Connect(t, uniqueAddr("lastwqe"), bqp, aqp)
	if _, err := srq.PostRecv([]verbs.RecvWR{{WRID: 7, SGList: []verbs.SGE{bmr.SGE(0, size)}}}); err != nil {
		t.Fatal(err)
	}
	src := amr.Bytes()
	for i := range src {
		src[i] = 0xab
	}
	dst := bmr.Bytes()
	sent := make(chan error, 1)
	go func() {
		_, err := aqp.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{amr.SGE(0, size)}}})
		sent <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); dst[4096] != 0xab; {
		if time.Now().After(deadline) {
			t.Fatal("A's Send did not begin")
		}
	}
	t0 := time.Now()
	midAtStart := dst[size/2] == 0xab
	if err := bqp.Modify(&verbs.QPAttr{State: verbs.QPSErr}, verbs.QPAttrState); err != nil {
		t.Fatal(err)
	}
	t.Logf("Modify took %v; mid byte placed before Modify=%v, last byte after Modify=%v", time.Since(t0), midAtStart, dst[size-1] == 0xab)
	select {
	case ev := <-bctx.Events():
		if ev.Type != verbs.EventQPLastWQEReached {
			t.Fatalf("event %v", ev.Type)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no EventQPLastWQEReached")
	}
	lastPlaced := dst[size-1] == 0xab
	wc := make([]verbs.WorkCompletion, 4)
	n := bcq.Poll(wc)
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	later := 0
	var lwc verbs.WorkCompletion
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && later == 0; {
		if later = bcq.Poll(wc); later > 0 {
			lwc = wc[0]
		}
	}
	t.Logf("at EventQPLastWQEReached: last byte placed=%v, CQEs in B's CQ=%d; CQEs after=%d %+v", lastPlaced, n, later, lwc)
	if !lastPlaced || (n == 0 && later > 0) {
		t.Fatalf("EventQPLastWQEReached raised while the SRQ receive (WRID 7) was still being placed; its completion (%v) came after the event", lwc.Status)
	}
}
