package verbstest

import (
	"testing"

	"github.com/goverbs/goverbs/verbs"
)

// The MemoryWindow cases, after rdma-core's tests/test_mr.py memory window
// tests and test_qpex's bind test: B owns a region registered with
// AccessMWBind and grants A a window on it; A accesses the region through
// the window's key. Accesses that must fail are RDMA Reads, whose
// response reports the remote access error on every device (a device
// without CapAckedCompletion may complete a failed Write successfully).

// mwRegionAccess is the access of the regions windows are bound to.
const mwRegionAccess = remoteAll | verbs.AccessMWBind

// requireMW skips a case on a device without memory windows.
func requireMW(t *testing.T, h Harness) {
	t.Helper()
	requireCap(t, h, verbs.CapMemoryWindows, "CapMemoryWindows")
}

// allocMW allocates a window of type typ on e.
func allocMW(t testing.TB, e Endpoint, typ verbs.MWType) int {
	t.Helper()
	id, err := e.AllocMW(typ)
	if err != nil {
		t.Fatalf("AllocMW(%v): %v", typ, err)
	}
	return id
}

// mwKey returns the current key of window id of e.
func mwKey(t testing.TB, e Endpoint, id int) uint32 {
	t.Helper()
	k, err := e.MWRKey(id)
	if err != nil {
		t.Fatalf("MW key: %v", err)
	}
	return k
}

// bindWR is the OpBindMW WR that binds window id of e to n bytes at
// offset off of r with the rights access.
func bindWR(t testing.TB, e Endpoint, wrid uint64, id int, r Region, off, n int, access verbs.AccessFlags) verbs.SendWR {
	return verbs.SendWR{WRID: wrid, Opcode: verbs.OpBindMW, Flags: verbs.SendSignaled,
		Bind: verbs.MWBind{RKey: mwKey(t, e, id), LKey: r.LKey, Addr: r.Addr + uint64(off), Length: uint64(n), Access: access}}
}

// bind posts a bind on QP qp of B and returns its completion.
func bind(t testing.TB, p *Pair, qp int, wr verbs.SendWR) verbs.WorkCompletion {
	t.Helper()
	postSend(t, p.B, qp, wr)
	return waitOne(t, p.B, SendCQ)
}

// bindOK binds and checks that the bind completed, and that it gave the
// window a new key, which it returns.
func bindOK(t testing.TB, p *Pair, qp, id int, r Region, off, n int, access verbs.AccessFlags) uint32 {
	t.Helper()
	old := mwKey(t, p.B, id)
	wc := bind(t, p, qp, bindWR(t, p.B, 0xb1, id, r, off, n, access))
	expectSendWC(t, wc, 0xb1, verbs.WCBindMW, p.B.QPNum(qp))
	k := mwKey(t, p.B, id)
	if k == old {
		t.Fatalf("the bind kept the window's key %#x; each bind must give it a new one", k)
	}
	return k
}

// viaKey returns a copy of wr that names key instead of r's rkey.
func viaKey(wr verbs.SendWR, key uint32) verbs.SendWR {
	wr.RKey = key
	return wr
}

// expectBindRefused checks that a bind completed with WCMWBindErr, left
// the window's key alone and moved B's QP to the error state.
func expectBindRefused(t testing.TB, p *Pair, qp, id int, wr verbs.SendWR) {
	t.Helper()
	old := mwKey(t, p.B, id)
	wc := bind(t, p, qp, wr)
	expectStatus(t, wc, wr.WRID, verbs.WCMWBindErr)
	if k := mwKey(t, p.B, id); k != old {
		t.Fatalf("a refused bind changed the window's key from %#x to %#x", old, k)
	}
	expectState(t, p.B, qp, verbs.QPSErr)
}

// expectReadRefused checks that A's Read of n bytes at offset off of r
// through key fails with WCRemAccessErr and touches nothing.
func expectReadRefused(t testing.TB, p *Pair, qp int, r Region, off, n int, key uint32, what string) {
	t.Helper()
	local := newRegion(t, p.A, n, localRW)
	wr := viaKey(readWR(0xbad, r, off, local.SGE(0, n)), key)
	postSend(t, p.A, qp, wr)
	wc := waitOne(t, p.A, SendCQ)
	if wc.Status != verbs.WCRemAccessErr {
		t.Fatalf("%s: the Read completed %s; want %v", what, fmtWC(wc), verbs.WCRemAccessErr)
	}
	expectZero(t, p.A, local, 0, n, what+": the failed Read's buffer")
}

// testMWType1 (test_mr.py's type 1 bind): a type 1 window bound to part of
// a region takes RDMA Writes and Reads inside it, placing them in the
// region, and refuses an access that reaches past it.
func testMWType1(t *testing.T, h Harness) {
	requireMW(t, h)
	p := h.NewPair(t, PairOptions{})
	r := newRegion(t, p.B, 4096, mwRegionAccess)
	id := allocMW(t, p.B, verbs.MWType1)
	key := bindOK(t, p, 0, id, r, 1024, 512, verbs.AccessRemoteRead|verbs.AccessRemoteWrite)

	src := newRegion(t, p.A, 512, localRW)
	data := pattern(1, 512)
	fill(t, p.A, src, 0, data)
	expectStatus(t, do(t, p, viaKey(writeWR(1, r, 1024, src.SGE(0, 512)), key)), 1, verbs.WCSuccess)
	expectBytes(t, p.B, r, 1024, data, "the region behind the window")
	expectZero(t, p.B, r, 0, 1024, "the region below the window")
	expectZero(t, p.B, r, 1536, 4096-1536, "the region above the window")

	dst := newRegion(t, p.A, 256, localRW)
	expectStatus(t, do(t, p, viaKey(readWR(2, r, 1280, dst.SGE(0, 256)), key)), 2, verbs.WCSuccess)
	expectBytes(t, p.A, dst, 0, data[256:], "the Read through the window")

	expectReadRefused(t, p, 0, r, 1536-8, 16, key, "a Read reaching past the window")
	expectCanaries(t, p.B, r)
}

// testMWRights: a window's rights are the bind's, not the region's: a
// window grants Read and Write on a region registered without remote
// rights, whose own key grants nothing; a bind granting Write needs a
// region registered with LocalWrite; and a window granting Read only
// refuses a Write through it.
func testMWRights(t *testing.T, h Harness) {
	requireMW(t, h)
	t.Run("BeyondRegionRights", func(t *testing.T) {
		p := h.NewPair(t, PairOptions{})
		r := newRegion(t, p.B, 256, localRW|verbs.AccessMWBind)
		id := allocMW(t, p.B, verbs.MWType1)
		key := bindOK(t, p, 0, id, r, 0, 128, verbs.AccessRemoteRead|verbs.AccessRemoteWrite)
		src := newRegion(t, p.A, 64, localRW)
		fill(t, p.A, src, 0, pattern(3, 64))
		if wc := do(t, p, viaKey(writeWR(4, r, 0, src.SGE(0, 64)), key)); wc.Status != verbs.WCSuccess {
			t.Fatalf("a Write through a window on a region without remote rights completed %s", fmtWC(wc))
		}
		expectBytes(t, p.B, r, 0, pattern(3, 64), "the region written through the window")
		expectFault(t, p, 0, writeWR(0, r, 128, src.SGE(0, 16)), verbs.WCRemAccessErr, true)
		expectZero(t, p.B, r, 128, 128, "the region beyond the window, written with its own key")
		expectCanaries(t, p.B, r)
	})
	t.Run("WriteNeedsLocalWrite", func(t *testing.T) {
		p := h.NewPair(t, PairOptions{})
		r := newRegion(t, p.B, 256, verbs.AccessRemoteRead|verbs.AccessMWBind)
		id := allocMW(t, p.B, verbs.MWType1)
		expectBindRefused(t, p, 0, id, bindWR(t, p.B, 3, id, r, 0, 256, verbs.AccessRemoteRead|verbs.AccessRemoteWrite))
	})
	t.Run("WriteThroughReadOnly", func(t *testing.T) {
		p := h.NewPair(t, PairOptions{})
		r := newRegion(t, p.B, 256, mwRegionAccess)
		id := allocMW(t, p.B, verbs.MWType1)
		key := bindOK(t, p, 0, id, r, 0, 256, verbs.AccessRemoteRead)
		src := newRegion(t, p.A, 64, localRW)
		fill(t, p.A, src, 0, pattern(2, 64))
		wc := do(t, p, viaKey(writeWR(4, r, 0, src.SGE(0, 64)), key))
		if p.A.Attr().Has(verbs.CapAckedCompletion) && wc.Status != verbs.WCRemAccessErr {
			t.Fatalf("a Write through a read-only window completed %s; want %v", fmtWC(wc), verbs.WCRemAccessErr)
		}
		expectZero(t, p.B, r, 0, 256, "the region behind a read-only window")
		expectCanaries(t, p.B, r)
	})
}

// testMWBindNeedsMWBind: a region registered without AccessMWBind takes
// no window.
func testMWBindNeedsMWBind(t *testing.T, h Harness) {
	requireMW(t, h)
	p := h.NewPair(t, PairOptions{})
	r := newRegion(t, p.B, 256, remoteAll)
	id := allocMW(t, p.B, verbs.MWType1)
	expectBindRefused(t, p, 0, id, bindWR(t, p.B, 5, id, r, 0, 256, verbs.AccessRemoteRead))
}

// testMWType2QP (test_qpex's bind): a type 2 window bound on one QP is
// reachable through that QP's connection only: the peer's other QP is
// refused.
func testMWType2QP(t *testing.T, h Harness) {
	requireMW(t, h)
	p := h.NewPair(t, PairOptions{QPs: 2})
	r := newRegion(t, p.B, 256, mwRegionAccess)
	fill(t, p.B, r, 0, pattern(3, 256))
	id := allocMW(t, p.B, verbs.MWType2)
	key := bindOK(t, p, 0, id, r, 0, 256, verbs.AccessRemoteRead)
	dst := newRegion(t, p.A, 64, localRW)
	expectStatus(t, do(t, p, viaKey(readWR(6, r, 64, dst.SGE(0, 64)), key)), 6, verbs.WCSuccess)
	expectBytes(t, p.A, dst, 0, pattern(3, 256)[64:128], "the Read through the window on its QP")
	expectReadRefused(t, p, 1, r, 0, 64, key, "a Read through a type 2 window on another QP")
}

// testMWRebind: binding a type 1 window again gives it a new key; the old
// key fails from then on.
func testMWRebind(t *testing.T, h Harness) {
	requireMW(t, h)
	p := h.NewPair(t, PairOptions{})
	r := newRegion(t, p.B, 256, mwRegionAccess)
	id := allocMW(t, p.B, verbs.MWType1)
	k1 := bindOK(t, p, 0, id, r, 0, 128, verbs.AccessRemoteRead)
	dst := newRegion(t, p.A, 64, localRW)
	expectStatus(t, do(t, p, viaKey(readWR(7, r, 0, dst.SGE(0, 64)), k1)), 7, verbs.WCSuccess)
	k2 := bindOK(t, p, 0, id, r, 128, 128, verbs.AccessRemoteRead)
	expectStatus(t, do(t, p, viaKey(readWR(8, r, 128, dst.SGE(0, 64)), k2)), 8, verbs.WCSuccess)
	expectReadRefused(t, p, 0, r, 128, 64, k1, "a Read through the key of the previous binding")
}

// type2Bound is a pair with a type 2 window bound on QP 0 of B to a
// region of 256 bytes granting Read and Write, its key proven by a Read.
func type2Bound(t *testing.T, h Harness) (p *Pair, r Region, id int, key uint32) {
	p = h.NewPair(t, PairOptions{})
	r = newRegion(t, p.B, 256, mwRegionAccess)
	id = allocMW(t, p.B, verbs.MWType2)
	key = bindOK(t, p, 0, id, r, 0, 256, verbs.AccessRemoteRead|verbs.AccessRemoteWrite)
	dst := newRegion(t, p.A, 64, localRW)
	expectStatus(t, do(t, p, viaKey(readWR(9, r, 0, dst.SGE(0, 64)), key)), 9, verbs.WCSuccess)
	return p, r, id, key
}

// testMWLocalInv: OpLocalInv of a bound type 2 window completes, and an
// access through its key then fails.
func testMWLocalInv(t *testing.T, h Harness) {
	requireMW(t, h)
	p, r, _, key := type2Bound(t, h)
	postSend(t, p.B, 0, verbs.SendWR{WRID: 10, Opcode: verbs.OpLocalInv, Flags: verbs.SendSignaled, InvalidateRKey: key})
	expectSendWC(t, waitOne(t, p.B, SendCQ), 10, verbs.WCLocalInv, p.B.QPNum(0))
	expectReadRefused(t, p, 0, r, 0, 64, key, "a Read through an invalidated window")
}

// testMWSendWithInv: a Send with Invalidate from A invalidates B's type 2
// window: B's receive completion says so, and an access through the key
// then fails.
func testMWSendWithInv(t *testing.T, h Harness) {
	requireMW(t, h)
	p, r, _, key := type2Bound(t, h)
	rb := newRegion(t, p.B, 64, localRW)
	postRecv(t, p.B, 0, recvWR(11, rb.SGE(0, 64)))
	src := newRegion(t, p.A, 16, localRW)
	fill(t, p.A, src, 0, pattern(4, 16))
	wr := sendWR(12, src.SGE(0, 16))
	wr.Opcode = verbs.OpSendWithInv
	wr.InvalidateRKey = key
	expectStatus(t, do(t, p, wr), 12, verbs.WCSuccess)
	wc := waitOne(t, p.B, RecvCQ)
	expectRecvWC(t, wc, 11, verbs.WCRecv, 16, p.B.QPNum(0))
	if wc.Flags&verbs.WCWithInv == 0 || wc.InvalidatedRKey != key {
		t.Fatalf("receive completion %s: want WCWithInv and InvalidatedRKey %#x", fmtWC(wc), key)
	}
	expectBytes(t, p.B, rb, 0, pattern(4, 16), "the Send with Invalidate's payload")
	expectReadRefused(t, p, 0, r, 0, 64, key, "a Read through a window the peer invalidated")
}

// testMWDealloc: an access through a deallocated window's key fails.
func testMWDealloc(t *testing.T, h Harness) {
	requireMW(t, h)
	p := h.NewPair(t, PairOptions{})
	r := newRegion(t, p.B, 256, mwRegionAccess)
	id := allocMW(t, p.B, verbs.MWType1)
	key := bindOK(t, p, 0, id, r, 0, 256, verbs.AccessRemoteRead)
	dst := newRegion(t, p.A, 64, localRW)
	expectStatus(t, do(t, p, viaKey(readWR(13, r, 0, dst.SGE(0, 64)), key)), 13, verbs.WCSuccess)
	if err := p.B.DeallocMW(id); err != nil {
		t.Fatal(err)
	}
	expectReadRefused(t, p, 0, r, 0, 64, key, "a Read through a deallocated window")
}

// testMWBadRange: binds of zero length (type 2), past the region's end
// and below its start are refused.
func testMWBadRange(t *testing.T, h Harness) {
	requireMW(t, h)
	cases := []struct {
		name   string
		typ    verbs.MWType
		off, n int
	}{
		{"ZeroLength", verbs.MWType2, 0, 0},
		{"PastEnd", verbs.MWType1, 128, 256},
		{"BelowStart", verbs.MWType2, -8, 64},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := h.NewPair(t, PairOptions{})
			r := newRegion(t, p.B, 256, mwRegionAccess)
			id := allocMW(t, p.B, c.typ)
			expectBindRefused(t, p, 0, id, bindWR(t, p.B, 14, id, r, c.off, c.n, verbs.AccessRemoteRead))
		})
	}
}

// testMWDeregRegion: deregistering the region a window is bound to ends
// access through the window.
func testMWDeregRegion(t *testing.T, h Harness) {
	requireMW(t, h)
	p := h.NewPair(t, PairOptions{})
	r := newRegion(t, p.B, 256, mwRegionAccess)
	id := allocMW(t, p.B, verbs.MWType1)
	key := bindOK(t, p, 0, id, r, 0, 256, verbs.AccessRemoteRead)
	dst := newRegion(t, p.A, 64, localRW)
	expectStatus(t, do(t, p, viaKey(readWR(15, r, 0, dst.SGE(0, 64)), key)), 15, verbs.WCSuccess)
	if err := p.B.DeregRegion(r.ID); err != nil {
		t.Fatal(err)
	}
	expectReadRefused(t, p, 0, r, 0, 64, key, "a Read through a window over a deregistered region")
}

// testMWSendWithInvRefused: a Send with Invalidate of a key the peer may
// not invalidate — a type 1 window's, or a type 2 window's bound to
// another QP — invalidates nothing: B's receive completes in error,
// without WCWithInv, and (on a device with CapAckedCompletion) A's Send
// fails.
func testMWSendWithInvRefused(t *testing.T, h Harness) {
	requireMW(t, h)
	for _, c := range []struct {
		name string
		typ  verbs.MWType
		qp   int
	}{{"Type1", verbs.MWType1, 0}, {"Type2OtherQP", verbs.MWType2, 1}} {
		t.Run(c.name, func(t *testing.T) {
			p := h.NewPair(t, PairOptions{QPs: 2})
			r := newRegion(t, p.B, 256, mwRegionAccess)
			id := allocMW(t, p.B, c.typ)
			key := bindOK(t, p, c.qp, id, r, 0, 256, verbs.AccessRemoteRead)
			rb := newRegion(t, p.B, 64, localRW)
			postRecv(t, p.B, 0, recvWR(16, rb.SGE(0, 64)))
			src := newRegion(t, p.A, 16, localRW)
			wr := sendWR(17, src.SGE(0, 16))
			wr.Opcode = verbs.OpSendWithInv
			wr.InvalidateRKey = key
			postSend(t, p.A, 0, wr)
			sc := waitOne(t, p.A, SendCQ)
			if p.A.Attr().Has(verbs.CapAckedCompletion) && sc.Status == verbs.WCSuccess {
				t.Fatalf("the Send invalidating a key the peer may not invalidate completed %s", fmtWC(sc))
			}
			wc := waitOne(t, p.B, RecvCQ)
			if wc.Status == verbs.WCSuccess || wc.Flags&verbs.WCWithInv != 0 {
				t.Fatalf("receive completion %s: want an error and no invalidation", fmtWC(wc))
			}
			if k := mwKey(t, p.B, id); k != key {
				t.Fatalf("the window's key changed from %#x to %#x", key, k)
			}
		})
	}
}

// testMWAtomic: a window granting remote atomics takes a FetchAndAdd on
// its word, and a window over the same word granting Read only refuses
// it.
func testMWAtomic(t *testing.T, h Harness) {
	requireMW(t, h)
	p := atomicPair(t, h, PairOptions{})
	dst, off := atomicTarget(t, p, mwRegionAccess, 100)
	id := allocMW(t, p.B, verbs.MWType1)
	key := bindOK(t, p, 0, id, dst, off, 8, verbs.AccessRemoteAtomic)
	res := newRegion(t, p.A, 8, localRW)
	wc := do(t, p, viaKey(atomicWR(18, verbs.OpAtomicFetchAndAdd, dst, off, res.SGE(0, 8), 5, 0), key))
	expectSendWC(t, wc, 18, verbs.WCFetchAdd, p.A.QPNum(0))
	if got := readWord(t, p.A, res, 0); got != 100 {
		t.Fatalf("FetchAndAdd through the window returned %d, want the old value 100", got)
	}
	expectWord(t, p, dst, off, 105)

	ro := bindOK(t, p, 0, id, dst, off, 8, verbs.AccessRemoteRead)
	wc = do(t, p, viaKey(atomicWR(19, verbs.OpAtomicFetchAndAdd, dst, off, res.SGE(0, 8), 5, 0), ro))
	if wc.Status != verbs.WCRemAccessErr {
		t.Fatalf("an atomic through a read-only window completed %s; want %v", fmtWC(wc), verbs.WCRemAccessErr)
	}
	expectWord(t, p, dst, off, 105)
}
