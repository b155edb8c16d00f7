package iwarp_test

import (
	"bytes"
	"runtime"
	"testing"
	"time"

	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/provider/iwarp/wire"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// boundWindow binds a type 2 window of the victim, on its QP 0, to the
// whole of g granting remote write, and returns the window and its key.
func boundWindow(t *testing.T, v *victim, g guarded) (int, uint32) {
	t.Helper()
	id, err := v.e.AllocMW(verbs.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	k, _ := v.e.MWRKey(id)
	bind := verbs.SendWR{WRID: 1, Opcode: verbs.OpBindMW, Flags: verbs.SendSignaled,
		Bind: verbs.MWBind{RKey: k, LKey: g.r.LKey, Addr: g.r.Addr, Length: uint64(g.r.Len), Access: verbs.AccessRemoteWrite}}
	if n, err := v.e.PostSend(0, []verbs.SendWR{bind}); n != 1 {
		t.Fatalf("post bind: %v", err)
	}
	expectVictimWC(t, v, 1, verbs.WCBindMW)
	k, _ = v.e.MWRKey(id)
	return id, k
}

// expectVictimWC waits for the victim's successful send completion wrid
// of opcode op.
func expectVictimWC(t *testing.T, v *victim, wrid uint64, op verbs.WCOpcode) {
	t.Helper()
	wcs, err := v.e.Completions(verbstest.SendCQ, 1, 10*time.Second)
	if err != nil || len(wcs) != 1 || wcs[0].WRID != wrid || wcs[0].Status != verbs.WCSuccess || wcs[0].Opcode != op {
		t.Fatalf("victim's completion: %+v, %v; want WR %d %v done", wcs, err, wrid, op)
	}
}

// noPlacementAfterRevoke: an RDMA Write through a window whose payload
// arrives in two parts, the window revoked by revoke in between. Nothing
// of the second part is placed once revoke has returned: the victim
// terminates the stream instead.
func noPlacementAfterRevoke(t *testing.T, revoke func(v *victim, g guarded, id int, key uint32)) {
	v := newVictim(t, 4)
	g := guard(t, v, 4096, verbs.AccessLocalWrite|verbs.RemoteAccess|verbs.AccessMWBind)
	h := dialHostile(t, v, false, false, false)
	id, key := boundWindow(t, v, g)
	const n = 3000
	f := h.write(key, g.r.Addr, append(bytes.Repeat([]byte{0xee}, 1000), bytes.Repeat([]byte{0xdd}, n-1000)...))
	h.send(f[:wire.TaggedLen+1000])
	waitPlaced(t, v, g, 0xee)
	revoke(v, g, id, key)
	h.send(f[wire.TaggedLen+1000:])
	h.expectTerminate(wire.LayerDDP, wire.DDPTaggedError, wire.DDPInvalidSTag)
	b, _ := v.e.ReadRegion(g.r.ID, 0, 4096)
	if k := bytes.Count(b, []byte{0xdd}); k > 0 {
		t.Fatalf("%d bytes placed through the window after its revocation completed", k)
	}
	g.intact(t, v, 0, 1000)
}

// TestNoPlacementAfterLocalInv: the revocation is an OpLocalInv, and
// its completion is what the victim waits for.
func TestNoPlacementAfterLocalInv(t *testing.T) {
	noPlacementAfterRevoke(t, func(v *victim, _ guarded, _ int, key uint32) {
		if n, err := v.e.PostSend(0, []verbs.SendWR{{WRID: 2, Opcode: verbs.OpLocalInv, Flags: verbs.SendSignaled, InvalidateRKey: key}}); n != 1 {
			t.Fatalf("post local invalidate: %v", err)
		}
		expectVictimWC(t, v, 2, verbs.WCLocalInv)
	})
}

// TestNoPlacementAfterWindowDealloc: the revocation is the window's
// Dealloc.
func TestNoPlacementAfterWindowDealloc(t *testing.T) {
	noPlacementAfterRevoke(t, func(v *victim, _ guarded, id int, _ uint32) {
		if err := v.e.DeallocMW(id); err != nil {
			t.Fatal(err)
		}
	})
}

// TestNoPlacementThroughWindowAfterDereg: the revocation is the Dereg of the
// region the window is bound to.
func TestNoPlacementThroughWindowAfterDereg(t *testing.T) {
	noPlacementAfterRevoke(t, func(v *victim, g guarded, _ int, _ uint32) {
		if err := v.e.DeregRegion(g.r.ID); err != nil {
			t.Fatal(err)
		}
	})
}

// TestLocalInvCompletesBeforeFlush: a QP moved to the error state while
// its OpLocalInv waits for the old binding's quiesce completes nothing
// until the quiesce ends; then the invalidation, which took effect,
// completes with success, and the Send posted after it is flushed, in
// that order.
func TestLocalInvCompletesBeforeFlush(t *testing.T) {
	v := newVictimN(t, 4, 2)
	g := guard(t, v, 4096, verbs.AccessLocalWrite|verbs.RemoteAccess|verbs.AccessMWBind)
	dialHostile(t, v, false, false, false)
	dialHostile(t, v, false, false, false)
	_, key := boundWindow(t, v, g)
	release := iwarp.HoldQuiesce(v.e.QPs[1].Driver())
	defer func() {
		if release != nil {
			release()
		}
	}()
	if n, err := v.e.PostSend(0, []verbs.SendWR{{WRID: 2, Opcode: verbs.OpLocalInv, Flags: verbs.SendSignaled, InvalidateRKey: key}}); n != 1 {
		t.Fatalf("post local invalidate: %v", err)
	}
	for !iwarp.Unbinding(v.e.QPs[0].Driver()) {
		runtime.Gosched()
	}
	if err := v.e.QPs[0].Modify(&verbs.QPAttr{State: verbs.QPSErr}, verbs.QPAttrState); err != nil {
		t.Fatal(err)
	}
	if n, err := v.e.PostSend(0, []verbs.SendWR{{WRID: 3, Opcode: verbs.OpSend, Flags: verbs.SendSignaled}}); n != 1 {
		t.Fatalf("post send: %v", err)
	}
	if wcs, err := v.e.Completions(verbstest.SendCQ, 0, 0); len(wcs) != 0 || err != nil {
		t.Fatalf("completions while the invalidation quiesces: %+v, %v; want none", wcs, err)
	}
	release()
	release = nil
	wcs, err := v.e.Completions(verbstest.SendCQ, 2, 10*time.Second)
	if err != nil || len(wcs) != 2 || wcs[0].WRID != 2 || wcs[0].Status != verbs.WCSuccess || wcs[1].WRID != 3 || wcs[1].Status != verbs.WCWRFlushErr {
		t.Fatalf("completions: %+v, %v; want the LocalInv done, then the Send flushed", wcs, err)
	}
}
