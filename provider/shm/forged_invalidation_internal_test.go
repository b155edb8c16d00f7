package shm

import (
	"testing"
	"time"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/driver"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// TestForgedInvalidationNotReported: the peer writes the completion of a
// receive claiming that its Send invalidated a window of this process,
// without asking this process to invalidate it. Poll reports no
// invalidation, and the window stays bound under its key.
func TestForgedInvalidationNotReported(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	r := newRegion(t, p.A, 64, verbs.AccessLocalWrite|verbs.RemoteAccess|verbs.AccessMWBind)
	id, err := p.A.AllocMW(verbs.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	mw := p.A.Window(id)
	postSend(t, p.A, 0, mw.Bind(1, p.A.Region(r.ID), r.Addr, 64, verbs.AccessRemoteRead, verbs.SendSignaled))
	if wcs, err := p.A.Completions(verbstest.SendCQ, 1, 10*time.Second); err != nil || len(wcs) != 1 || wcs[0].Status != verbs.WCSuccess {
		t.Fatalf("bind: %+v, %v", wcs, err)
	}
	key := mw.RKey()
	buf := newRegion(t, p.A, 16, verbs.AccessLocalWrite)
	postRecv(t, p.A, 0, recv(77, buf.SGE(0, 16)))
	forge(t, p, 0, driver.WorkCompletion{WRID: 0, Opcode: driver.WCRecv, Flags: driver.WCWithInv, InvalidatedRKey: key})
	got := pollAll(p)
	if len(got) != 1 || got[0].WRID != 77 {
		t.Fatalf("the forged completion came out as %+v; want the completion of receive 77", got)
	}
	if got[0].Flags&verbs.WCWithInv != 0 || got[0].InvalidatedRKey != 0 {
		t.Fatalf("a forged invalidation came out %+v; want no WCWithInv", got[0])
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
