package verbstest

import (
	"testing"

	"github.com/goverbs/goverbs/verbs"
)

// WRIDs of expectFault.
const (
	faultBadID  = 0xbad
	faultNextID = 0xbad + 1
	faultRecvID = 0xbad + 2
)

// expectFault posts bad on A's QP qp, with a receive posted before it and
// a harmless Write into a spare region of B posted right after it, and
// checks the error semantics: bad completes with status; the Write and
// the receive flush and the Write does not land; A's QP is in the error
// state (and B's too when peerErr); WRs posted later flush as well.
//
// A device without CapAckedCompletion (siw) completes a Send or Write
// once it is sent: there bad, when the responder is the one to refuse it,
// may complete successfully and the Write after it too (the responder,
// in the error state by then, drops it), and A's QP reaches the error
// state when the responder's Terminate arrives.
func expectFault(t testing.TB, p *Pair, qp int, bad verbs.SendWR, status verbs.WCStatus, peerErr bool) {
	t.Helper()
	expectFaultSignaled(t, p, qp, bad, status, peerErr, true)
}

// expectFaultSignaled is expectFault with bad signaled or not: a WR that
// fails completes with its error whether or not it asked for a
// completion.
func expectFaultSignaled(t testing.TB, p *Pair, qp int, bad verbs.SendWR, status verbs.WCStatus, peerErr, signaled bool) {
	t.Helper()
	src := newRegion(t, p.A, 32, localRW)
	fill(t, p.A, src, 0, pattern(30, 16))
	spare := newRegion(t, p.B, 16, remoteAll)
	postRecv(t, p.A, qp, recvWR(faultRecvID, src.SGE(16, 16)))
	bad.WRID = faultBadID
	bad.Flags |= verbs.SendSignaled
	if !signaled {
		bad.Flags &^= verbs.SendSignaled
	}
	postSend(t, p.A, qp, bad, writeWR(faultNextID, spare, 0, src.SGE(0, 16)))
	sentOnly := !p.A.Attr().Has(verbs.CapAckedCompletion) && bad.Opcode.ReadsLocal() && remoteStatus(status)
	wcs := wait(t, p.A, SendCQ, 1)
	switch {
	case sentOnly && wcs[0].Status == verbs.WCSuccess && wcs[0].WRID == faultBadID:
		// Sent, and completed as such; the next Write was sent too or
		// flushed.
		wcs = append(wcs, waitOne(t, p.A, SendCQ))
		if wcs[1].Status != verbs.WCSuccess {
			expectStatus(t, wcs[1], faultNextID, verbs.WCWRFlushErr)
		}
	case sentOnly && !signaled && wcs[0].WRID == faultNextID:
		// The unsignaled bad WR was sent without a completion.
		if wcs[0].Status != verbs.WCSuccess {
			expectStatus(t, wcs[0], faultNextID, verbs.WCWRFlushErr)
		}
	default:
		expectStatus(t, wcs[0], faultBadID, status)
		wcs = append(wcs, waitOne(t, p.A, SendCQ))
		expectStatus(t, wcs[1], faultNextID, verbs.WCWRFlushErr)
	}
	for _, wc := range wcs {
		if wc.QPNum != p.A.QPNum(qp) {
			t.Fatalf("completion %s: want QP %d", fmtWC(wc), p.A.QPNum(qp))
		}
	}
	expectStatus(t, waitOne(t, p.A, RecvCQ), faultRecvID, verbs.WCWRFlushErr)
	expectState(t, p.A, qp, verbs.QPSErr)
	if peerErr {
		expectState(t, p.B, qp, verbs.QPSErr)
	}
	expectZero(t, p.B, spare, 0, 16, "target of a Write posted after the failing WR")
	expectCanaries(t, p.B, spare)
	expectFlushAfterError(t, p.A, qp)
}

// remoteStatus reports whether status is an error the responder finds.
func remoteStatus(status verbs.WCStatus) bool {
	return status == verbs.WCRemAccessErr || status == verbs.WCRemInvReqErr || status == verbs.WCRemOpErr
}

// testWrongLKey: a local SGE with a key that names no region fails with
// WCLocProtErr.
func testWrongLKey(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	dst := newRegion(t, p.B, 64, remoteAll)
	before := snap(t, p.B, dst, "target of a Write with a bad lkey")
	src := newRegion(t, p.A, 64, localRW)
	fill(t, p.A, src, 0, pattern(33, 64))
	sge := src.SGE(0, 16)
	sge.LKey = badKey(sge.LKey)
	expectFault(t, p, 0, writeWR(0, dst, 0, sge), verbs.WCLocProtErr, false)
	before.unchanged(t)
}

// testLocalOutOfBounds: a local SGE reaching past either end of its
// region fails with WCLocProtErr, for a Write (gathering) and a Read
// (scattering), and nothing outside the region is touched.
func testLocalOutOfBounds(t *testing.T, h Harness) {
	edges := []struct {
		name string
		sge  func(r Region) verbs.SGE
	}{
		{"PastEnd", func(r Region) verbs.SGE { return r.SGE(r.Len-8, 16) }},
		{"BelowStart", func(r Region) verbs.SGE { return verbs.SGE{Addr: r.Addr - 8, Length: 16, LKey: r.LKey} }},
	}
	for _, edge := range edges {
		sge := edge.sge
		for _, op := range []verbs.Opcode{verbs.OpRDMAWrite, verbs.OpRDMARead} {
			t.Run(op.String()+"/"+edge.name, func(t *testing.T) {
				p := h.NewPair(t, PairOptions{})
				remote := newRegion(t, p.B, 64, remoteAll)
				fill(t, p.B, remote, 0, pattern(34, 64))
				local := newRegion(t, p.A, 64, localRW)
				fill(t, p.A, local, 0, pattern(35, 64))
				rb := snap(t, p.B, remote, "remote region")
				lb := snap(t, p.A, local, "local region")
				wr := writeWR(0, remote, 0, sge(local))
				if op == verbs.OpRDMARead {
					wr = readWR(0, remote, 0, sge(local))
				}
				expectFault(t, p, 0, wr, verbs.WCLocProtErr, false)
				rb.unchanged(t)
				lb.unchanged(t)
			})
		}
	}
}

// remoteOps are the operations the remote protection cases try.
var remoteOps = []verbs.Opcode{verbs.OpRDMAWrite, verbs.OpRDMARead, verbs.OpAtomicFetchAndAdd}

// remoteFault runs op against a 64-byte region of B registered with
// access, after spoil has made the WR bad, and checks that it fails with
// WCRemAccessErr, that both QPs reach the error state, and that neither
// side's memory changed.
func remoteFault(t *testing.T, h Harness, op verbs.Opcode, access verbs.AccessFlags, spoil func(wr *verbs.SendWR, target Region)) {
	if op.IsAtomic() {
		requireCap(t, h, verbs.CapAtomics, "CapAtomics")
	}
	p := h.NewPair(t, PairOptions{})
	target := newRegion(t, p.B, 64, access)
	fill(t, p.B, target, 0, pattern(36, 64))
	local := newRegion(t, p.A, 64, localRW)
	fill(t, p.A, local, 0, pattern(37, 64))
	tb := snap(t, p.B, target, "remote region of a refused "+op.String())
	lb := snap(t, p.A, local, "local buffer of a refused "+op.String())
	wr := remoteWR(op, target, local)
	if spoil != nil {
		spoil(&wr, target)
	}
	expectFault(t, p, 0, wr, verbs.WCRemAccessErr, true)
	tb.unchanged(t)
	lb.unchanged(t)
}

// eachRemoteOp runs remoteFault for every remote operation as a subtest.
func eachRemoteOp(t *testing.T, h Harness, spoil func(wr *verbs.SendWR, target Region)) {
	for _, op := range remoteOps {
		t.Run(op.String(), func(t *testing.T) { remoteFault(t, h, op, remoteAll, spoil) })
	}
}

// testWrongRKey: a remote key that names no region fails with
// WCRemAccessErr.
func testWrongRKey(t *testing.T, h Harness) {
	eachRemoteOp(t, h, func(wr *verbs.SendWR, _ Region) { wr.RKey = badKey(wr.RKey) })
}

// testRemotePastEnd: a remote range reaching past the region's end fails
// with WCRemAccessErr. Writes and Reads straddle the end; the atomic
// (which must stay aligned) lies just past it.
func testRemotePastEnd(t *testing.T, h Harness) {
	eachRemoteOp(t, h, func(wr *verbs.SendWR, r Region) {
		end := r.Addr + uint64(r.Len)
		if wr.Opcode.IsAtomic() {
			wr.RemoteAddr = end + (8-end%8)%8
		} else {
			wr.RemoteAddr = end - 8
		}
	})
}

// testRemoteBelowStart: a remote range starting below the region's start
// fails with WCRemAccessErr.
func testRemoteBelowStart(t *testing.T, h Harness) {
	eachRemoteOp(t, h, func(wr *verbs.SendWR, r Region) {
		if wr.Opcode.IsAtomic() {
			wr.RemoteAddr = (r.Addr - 8) &^ 7
		} else {
			wr.RemoteAddr = r.Addr - 8
		}
	})
}

// testNoRemoteWrite: a Write into a region without AccessRemoteWrite
// fails with WCRemAccessErr.
func testNoRemoteWrite(t *testing.T, h Harness) {
	remoteFault(t, h, verbs.OpRDMAWrite, remoteAll&^verbs.AccessRemoteWrite, nil)
}

// testNoRemoteRead: a Read from a region without AccessRemoteRead fails
// with WCRemAccessErr.
func testNoRemoteRead(t *testing.T, h Harness) {
	remoteFault(t, h, verbs.OpRDMARead, remoteAll&^verbs.AccessRemoteRead, nil)
}

// testNoRemoteAtomic: an atomic on a region without AccessRemoteAtomic
// fails with WCRemAccessErr.
func testNoRemoteAtomic(t *testing.T, h Harness) {
	remoteFault(t, h, verbs.OpAtomicFetchAndAdd, remoteAll&^verbs.AccessRemoteAtomic, nil)
}

// testUnsignaledFault: a WR that fails completes with its error even
// when it was posted unsignaled, and the WRs after it flush: a Write
// with a bad lkey, and every remote operation with a bad rkey.
func testUnsignaledFault(t *testing.T, h Harness) {
	t.Run("LKey", func(t *testing.T) {
		p := h.NewPair(t, PairOptions{})
		dst := newRegion(t, p.B, 64, remoteAll)
		before := snap(t, p.B, dst, "target of an unsignaled Write with a bad lkey")
		src := newRegion(t, p.A, 64, localRW)
		sge := src.SGE(0, 16)
		sge.LKey = badKey(sge.LKey)
		expectFaultSignaled(t, p, 0, writeWR(0, dst, 0, sge), verbs.WCLocProtErr, false, false)
		before.unchanged(t)
	})
	for _, op := range remoteOps {
		t.Run("RKey/"+op.String(), func(t *testing.T) {
			if op.IsAtomic() {
				requireCap(t, h, verbs.CapAtomics, "CapAtomics")
			}
			p := h.NewPair(t, PairOptions{})
			target := newRegion(t, p.B, 64, remoteAll)
			fill(t, p.B, target, 0, pattern(36, 64))
			local := newRegion(t, p.A, 64, localRW)
			fill(t, p.A, local, 0, pattern(37, 64))
			tb := snap(t, p.B, target, "target of an unsignaled "+op.String()+" with a bad rkey")
			lb := snap(t, p.A, local, "local buffer of an unsignaled "+op.String()+" with a bad rkey")
			wr := remoteWR(op, target, local)
			wr.RKey = badKey(wr.RKey)
			expectFaultSignaled(t, p, 0, wr, verbs.WCRemAccessErr, true, false)
			tb.unchanged(t)
			lb.unchanged(t)
		})
	}
}

// testOtherPDLKey: an lkey of a region of another PD than the QP's is
// refused on the data path with WCLocProtErr, as a Write's source and as
// a Read's destination, though the key is valid on the device.
func testOtherPDLKey(t *testing.T, h Harness) {
	for _, op := range []verbs.Opcode{verbs.OpRDMAWrite, verbs.OpRDMARead} {
		t.Run(op.String(), func(t *testing.T) {
			p := h.NewPair(t, PairOptions{})
			remote := newRegion(t, p.B, 64, remoteAll)
			fill(t, p.B, remote, 0, pattern(38, 64))
			local, err := p.A.NewOtherPDRegion(64, localRW)
			if err != nil {
				t.Fatalf("region on a second PD: %v", err)
			}
			fill(t, p.A, local, 0, pattern(39, 64))
			rb := snap(t, p.B, remote, "remote region")
			lb := snap(t, p.A, local, "region of the other PD")
			wr := writeWR(0, remote, 0, local.SGE(0, 16))
			if op == verbs.OpRDMARead {
				wr = readWR(0, remote, 0, local.SGE(0, 16))
			}
			expectFault(t, p, 0, wr, verbs.WCLocProtErr, false)
			rb.unchanged(t)
			lb.unchanged(t)
		})
	}
}

// testOtherPDRKey: an rkey of a region of B that belongs to another PD
// than B's QP is refused with WCRemAccessErr for every remote operation,
// and the region is not touched.
func testOtherPDRKey(t *testing.T, h Harness) {
	for _, op := range remoteOps {
		t.Run(op.String(), func(t *testing.T) {
			if op.IsAtomic() {
				requireCap(t, h, verbs.CapAtomics, "CapAtomics")
			}
			p := h.NewPair(t, PairOptions{})
			target, err := p.B.NewOtherPDRegion(64, remoteAll)
			if err != nil {
				t.Fatalf("region on a second PD: %v", err)
			}
			fill(t, p.B, target, 0, pattern(36, 64))
			local := newRegion(t, p.A, 64, localRW)
			fill(t, p.A, local, 0, pattern(37, 64))
			tb := snap(t, p.B, target, "region of another PD")
			lb := snap(t, p.A, local, "local buffer")
			wr := remoteWR(op, target, local)
			expectFault(t, p, 0, wr, verbs.WCRemAccessErr, true)
			tb.unchanged(t)
			lb.unchanged(t)
		})
	}
}

// remoteWR is a WR of op on 16 bytes (8 for an atomic) at offset 16 of
// target, with local as its local buffer.
func remoteWR(op verbs.Opcode, target, local Region) verbs.SendWR {
	switch op {
	case verbs.OpRDMAWrite:
		return writeWR(0, target, 16, local.SGE(0, 16))
	case verbs.OpRDMARead:
		return readWR(0, target, 16, local.SGE(0, 16))
	}
	return atomicWR(0, op, target, alignedOff(target, 16), local.SGE(0, 8), 1, 2)
}

// testQPNoRemoteRights: a responder QP whose access flags lack a remote
// right refuses the operation that needs it, though the region grants
// it: the requester's WR fails with WCRemAccessErr (or WCRemInvReqErr,
// as rxe answers), and the region is not touched.
func testQPNoRemoteRights(t *testing.T, h Harness) {
	rights := map[verbs.Opcode]verbs.AccessFlags{
		verbs.OpRDMAWrite: verbs.AccessRemoteWrite, verbs.OpRDMARead: verbs.AccessRemoteRead,
		verbs.OpAtomicFetchAndAdd: verbs.AccessRemoteAtomic,
	}
	for _, op := range remoteOps {
		t.Run(op.String(), func(t *testing.T) {
			if op.IsAtomic() {
				requireCap(t, h, verbs.CapAtomics, "CapAtomics")
			}
			p := h.NewPair(t, PairOptions{})
			if err := p.B.SetQPAccess(0, verbs.RemoteAccess&^rights[op]); err != nil {
				t.Fatalf("take %v from B's QP: %v", rights[op], err)
			}
			target := newRegion(t, p.B, 64, remoteAll)
			fill(t, p.B, target, 0, pattern(36, 64))
			local := newRegion(t, p.A, 64, localRW)
			fill(t, p.A, local, 0, pattern(37, 64))
			tb := snap(t, p.B, target, "region behind a QP without the right")
			lb := snap(t, p.A, local, "local buffer")
			wr := remoteWR(op, target, local)
			wr.Flags |= verbs.SendSignaled
			postSend(t, p.A, 0, wr)
			wc := waitOne(t, p.A, SendCQ)
			if wc.Status != verbs.WCRemInvReqErr && !(op == verbs.OpRDMAWrite && wc.Status == verbs.WCSuccess && !p.A.Attr().Has(verbs.CapAckedCompletion)) {
				expectStatus(t, wc, 0, verbs.WCRemAccessErr)
			}
			expectState(t, p.A, 0, verbs.QPSErr)
			expectState(t, p.B, 0, verbs.QPSErr)
			tb.unchanged(t)
			lb.unchanged(t)
			expectFlushAfterError(t, p.A, 0)
		})
	}
}

// testRemoteWrap: a remote range whose end wraps past 2^64 fails with
// WCRemAccessErr: a provider's bounds check must not overflow.
func testRemoteWrap(t *testing.T, h Harness) {
	eachRemoteOp(t, h, func(wr *verbs.SendWR, _ Region) { wr.RemoteAddr = ^uint64(0) - 7 })
}

// testLocalWrap: a local SGE whose end wraps past 2^64, or that is longer
// than any region, with the key of a real region, fails with
// WCLocProtErr (or WCLocLenErr for the long one), or is refused at post
// time with ErrInvalidArg; nothing is touched.
func testLocalWrap(t *testing.T, h Harness) {
	edges := []struct {
		name string
		sge  func(r Region) verbs.SGE
	}{
		{"Wrap", func(r Region) verbs.SGE { return verbs.SGE{Addr: ^uint64(0) - 7, Length: 16, LKey: r.LKey} }},
		{"Huge", func(r Region) verbs.SGE { return verbs.SGE{Addr: r.Addr, Length: ^uint32(0), LKey: r.LKey} }},
	}
	for _, edge := range edges {
		for _, op := range []verbs.Opcode{verbs.OpRDMAWrite, verbs.OpRDMARead, verbs.OpSend} {
			t.Run(op.String()+"/"+edge.name, func(t *testing.T) {
				p := h.NewPair(t, PairOptions{})
				remote := newRegion(t, p.B, 64, remoteAll)
				fill(t, p.B, remote, 0, pattern(34, 64))
				local := newRegion(t, p.A, 64, localRW)
				fill(t, p.A, local, 0, pattern(35, 64))
				rb := snap(t, p.B, remote, "remote region")
				lb := snap(t, p.A, local, "local region")
				var wr verbs.SendWR
				switch op {
				case verbs.OpRDMAWrite:
					wr = writeWR(1, remote, 0, edge.sge(local))
				case verbs.OpRDMARead:
					wr = readWR(1, remote, 0, edge.sge(local))
				default:
					postRecv(t, p.B, 0, recvWR(9, remote.SGE(0, 64)))
					wr = sendWR(1, edge.sge(local))
				}
				n, err := p.A.PostSend(0, []verbs.SendWR{wr})
				if n == 0 {
					expectRefused(t, op.String()+" with a "+edge.name+" local SGE", n, err, verbs.ErrInvalidArg)
					expectState(t, p.A, 0, verbs.QPSRTS)
				} else {
					wc := waitOne(t, p.A, SendCQ)
					if wc.Status != verbs.WCLocLenErr || edge.name != "Huge" {
						expectStatus(t, wc, 1, verbs.WCLocProtErr)
					}
					expectState(t, p.A, 0, verbs.QPSErr)
				}
				rb.unchanged(t)
				lb.unchanged(t)
			})
		}
	}
}
