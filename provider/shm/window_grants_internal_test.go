package shm

import (
	"bytes"
	"testing"
	"time"

	"github.com/goverbs/goverbs/internal/grant"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// bindType2 binds a new type 2 window of e to n bytes at the start of r,
// granting access, on e's QP 0, and returns the window.
func bindType2(t *testing.T, e *verbstest.Local, r verbstest.Region, n uint64, access verbs.AccessFlags) *verbs.MW {
	t.Helper()
	id, err := e.AllocMW(verbs.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	mw := e.Window(id)
	if _, err := e.PostSend(0, []verbs.SendWR{mw.Bind(1, e.Region(r.ID), r.Addr, n, access, verbs.SendSignaled)}); err != nil {
		t.Fatal(err)
	}
	if wcs, err := e.Completions(verbstest.SendCQ, 1, 10*time.Second); err != nil || len(wcs) != 1 || wcs[0].Status != verbs.WCSuccess {
		t.Fatalf("bind: %+v, %v", wcs, err)
	}
	return mw
}

// grantedKeys returns the keys in the grant table q's peer maps.
func grantedKeys(q *qp) []uint32 {
	tab := connOf(q).keys
	var keys []uint32
	for i := range tab.slots {
		if k := tab.slots[i].key.Load(); k != 0 {
			keys = append(keys, k)
		}
	}
	return keys
}

// TestWindowOnLocalOnlyRegion: A grants B a 64-byte read-only window on
// a region registered without remote rights. B reads through the
// window, the grant table B maps holds the window's key and not the
// region's, and the region's key reads nothing.
func TestWindowOnLocalOnlyRegion(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	a := p.A
	bq := driverQP(p.B.(*verbstest.Local).QPs[0])
	r, err := a.NewRegion(4096, verbs.AccessLocalWrite|verbs.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte{0x5a}, 64)
	if err := a.WriteRegion(r.ID, 0, want); err != nil {
		t.Fatal(err)
	}
	mw := bindType2(t, a, r, 64, verbs.AccessRemoteRead)
	for _, k := range grantedKeys(bq) {
		if k != mw.RKey() {
			t.Fatalf("the grant table B maps holds key %#x besides the window's %#x (region %#x)", k, mw.RKey(), r.RKey)
		}
	}
	dst := newRegion(t, p.B, 4096, verbs.AccessLocalWrite)
	postSend(t, p.B, 0, verbs.SendWR{WRID: 7, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{dst.SGE(0, 64)}, RemoteAddr: r.Addr, RKey: mw.RKey()})
	if wcs := waitWCs(t, p.B, verbstest.SendCQ, 1); wcs[0].Status != verbs.WCSuccess {
		t.Fatalf("a Read through the window: %+v", wcs[0])
	}
	if got, err := p.B.ReadRegion(dst.ID, 0, 64); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read through the window: %x, %v; want %x", got, err, want)
	}
	postSend(t, p.B, 0, verbs.SendWR{WRID: 8, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{dst.SGE(0, 4096)}, RemoteAddr: r.Addr, RKey: r.RKey})
	if wcs := waitWCs(t, p.B, verbstest.SendCQ, 1); wcs[0].Status == verbs.WCSuccess {
		t.Fatalf("B, granted 64 bytes through a window, read the whole region with its key %#x", r.RKey)
	}
}

// TestFailedSendWithInvKeepsWindow: a Send with Invalidate too long for
// the receive it meets fails there and leaves the window bound.
func TestFailedSendWithInvKeepsWindow(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	a := p.A
	aq := driverQP(a.QPs[0])
	r, err := a.NewRegion(4096, verbs.AccessLocalWrite|verbs.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	mw := bindType2(t, a, r, 512, verbs.AccessRemoteRead)
	key := mw.RKey()
	small := newRegion(t, p.A, 8, verbs.AccessLocalWrite)
	if _, err := a.PostRecv(0, []verbs.RecvWR{{WRID: 5, SGList: []verbs.SGE{small.SGE(0, 8)}}}); err != nil {
		t.Fatal(err)
	}
	src := newRegion(t, p.B, 64, verbs.AccessLocalWrite)
	postSend(t, p.B, 0, verbs.SendWR{WRID: 6, Opcode: verbs.OpSendWithInv, InvalidateRKey: key, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{src.SGE(0, 64)}})
	wcs := waitWCs(t, p.A, verbstest.RecvCQ, 1)
	if wcs[0].Status != verbs.WCLocLenErr || wcs[0].Flags&verbs.WCWithInv != 0 {
		t.Fatalf("receive of a Send with Invalidate too long for it: %+v; want %v without WCWithInv", wcs[0], verbs.WCLocLenErr)
	}
	w := grant.Lookup(&aq.ctx.mrs, key)
	if w == nil {
		t.Fatalf("key %#x names no window any more", key)
	}
	if b, ok := w.Current(); !ok || b.Key != key {
		t.Fatalf("the window was unbound by a Send with Invalidate that failed at the receive")
	}
}
