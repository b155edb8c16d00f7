package shm

import (
	"testing"
	"time"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/driver"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// TestForgedInvalidationNotReported: the peer writes a receive completion
// claiming that its Send invalidated a window of this process, without
// asking this process to invalidate it. Poll reports no invalidation,
// and the window stays bound under its key.
func TestForgedInvalidationNotReported(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	bq := driverQP(p.B.(*verbstest.Local).QPs[0])
	aq := driverQP(p.A.QPs[0])
	r, err := p.A.NewRegion(64, verbs.AccessLocalWrite|verbs.RemoteAccess|verbs.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	id, err := p.A.AllocMW(verbs.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	mw := p.A.Window(id)
	if _, err := p.A.PostSend(0, []verbs.SendWR{mw.Bind(1, p.A.Region(r.ID), r.Addr, 64, verbs.AccessRemoteRead, verbs.SendSignaled)}); err != nil {
		t.Fatal(err)
	}
	if wcs, err := p.A.Completions(verbstest.SendCQ, 1, 10*time.Second); err != nil || len(wcs) != 1 || wcs[0].Status != verbs.WCSuccess {
		t.Fatalf("bind: %+v, %v", wcs, err)
	}
	key := mw.RKey()
	ring := viewCQRing(connOf(bq).cqSeg.mem, aq.recvCQ.n) // the peer's view of A's receive CQ
	forged := driver.WorkCompletion{WRID: 7, Opcode: driver.WCRecv, QPNum: aq.num, Flags: driver.WCWithInv, InvalidatedRKey: key}
	if !ring.produce(&forged) {
		t.Fatal("the ring is full")
	}
	wc := make([]verbs.WorkCompletion, 2)
	if n := p.A.RecvCQ.Poll(wc); n != 1 {
		t.Fatalf("Poll returned %d completions, want 1", n)
	}
	if wc[0].Flags&verbs.WCWithInv != 0 || wc[0].InvalidatedRKey != 0 {
		t.Fatalf("a forged invalidation came out %+v; want no WCWithInv", wc[0])
	}
	if mw.RKey() != key {
		t.Fatal("the window's key changed")
	}
	dst := newRegion(t, p.B, 8, verbs.AccessLocalWrite)
	postSend(t, p.B, 0, verbs.SendWR{WRID: 8, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{dst.SGE(0, 8)}, RemoteAddr: r.Addr, RKey: key})
	if wcs := waitWCs(t, p.B, verbstest.SendCQ, 1); wcs[0].Status != verbs.WCSuccess {
		t.Fatalf("a Read through the window after the forged invalidation: %+v", wcs[0])
	}
}
