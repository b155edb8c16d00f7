package verbstest

import (
	"fmt"
	"testing"

	"github.com/goverbs/goverbs/verbs"
)

// testWrite: an RDMA Write places the bytes at the remote address and
// nowhere else, and consumes no receive.
func testWrite(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	src := newRegion(t, p.A, 256, localRW)
	fill(t, p.A, src, 0, pattern(10, 256))
	dst := newRegion(t, p.B, 256, remoteAll)
	postRecv(t, p.B, 0, recvWR(9, dst.SGE(0, 8)))
	expectSendWC(t, do(t, p, writeWR(1, dst, 20, src.SGE(10, 100))), 1, verbs.WCRDMAWrite, p.A.QPNum(0))
	expectZero(t, p.B, dst, 0, 20, "bytes before the Write's range")
	expectBytes(t, p.B, dst, 20, pattern(10, 256)[10:110], "written bytes")
	expectZero(t, p.B, dst, 120, 136, "bytes after the Write's range")
	expectCanaries(t, p.B, dst)
	expectEmpty(t, p.B, RecvCQ)
}

// testWriteZeroLength: a Write without SGEs completes successfully and
// changes nothing.
func testWriteZeroLength(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	dst := newRegion(t, p.B, 64, remoteAll)
	fill(t, p.B, dst, 0, pattern(11, 64))
	before := snap(t, p.B, dst, "target of a zero-length Write")
	expectSendWC(t, do(t, p, writeWR(1, dst, 0)), 1, verbs.WCRDMAWrite, p.A.QPNum(0))
	before.unchanged(t)
}

// testWriteMultiSGE: a Write gathers its SGEs, from two regions, in order.
func testWriteMultiSGE(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	a1 := newRegion(t, p.A, 64, localRW)
	a2 := newRegion(t, p.A, 64, localRW)
	fill(t, p.A, a1, 0, pattern(12, 64))
	fill(t, p.A, a2, 0, pattern(13, 64))
	dst := newRegion(t, p.B, 128, remoteAll)
	var want []byte
	want = append(want, pattern(13, 64)[3:19]...)
	want = append(want, pattern(12, 64)[0:30]...)
	want = append(want, pattern(13, 64)[50:64]...)
	wc := do(t, p, writeWR(1, dst, 8, a2.SGE(3, 16), a1.SGE(0, 30), a2.SGE(50, 14)))
	expectSendWC(t, wc, 1, verbs.WCRDMAWrite, p.A.QPNum(0))
	expectZero(t, p.B, dst, 0, 8, "bytes before the Write's range")
	expectBytes(t, p.B, dst, 8, want, "gathered bytes")
	expectZero(t, p.B, dst, 8+len(want), 128-8-len(want), "bytes after the Write's range")
	expectCanaries(t, p.B, dst)
}

// testWriteWithImm: a Write with immediate consumes a receive at the
// responder, whose completion reports the immediate and the length, and
// the data is in place when that completion is seen. With RNR retry the
// receive is posted only after the Write: the Write waits for it.
func testWriteWithImm(t *testing.T, h Harness) {
	requireCap(t, h, verbs.CapImmData, "CapImmData")
	p := h.NewPair(t, PairOptions{})
	src := newRegion(t, p.A, 40, localRW)
	fill(t, p.A, src, 0, pattern(14, 40))
	dst := newRegion(t, p.B, 64, remoteAll)
	late := p.A.Attr().Has(verbs.CapRNRRetry)
	recv := recvWR(9)
	if !p.B.Attr().Has(verbs.CapRecvNoSGE) {
		recv = recvWR(9, newRegion(t, p.B, 8, localRW).SGE(0, 8))
	}
	if !late {
		postRecv(t, p.B, 0, recv)
	}
	wr := writeWR(1, dst, 12, src.SGE(0, 40))
	wr.Opcode, wr.Imm = verbs.OpRDMAWriteWithImm, 0x12345678
	postSend(t, p.A, 0, wr)
	if late {
		expectEmpty(t, p.A, SendCQ)
		postRecv(t, p.B, 0, recv)
	}
	wc := waitOne(t, p.B, RecvCQ)
	expectBytes(t, p.B, dst, 12, pattern(14, 40), "data of a Write with immediate when its receive completion is seen")
	expectRecvWC(t, wc, 9, verbs.WCRecvRDMAWithImm, 40, p.B.QPNum(0))
	if wc.Flags&verbs.WCWithImm == 0 || wc.Imm != 0x12345678 {
		t.Fatalf("receive completion %s: want WCWithImm and immediate 0x12345678", fmtWC(wc))
	}
	expectSendWC(t, waitOne(t, p.A, SendCQ), 1, verbs.WCRDMAWrite, p.A.QPNum(0))
	expectCanaries(t, p.B, dst)
}

// testRead: an RDMA Read copies the remote bytes into the local buffer
// and nowhere else.
func testRead(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	src := newRegion(t, p.B, 256, remoteAll)
	fill(t, p.B, src, 0, pattern(15, 256))
	dst := newRegion(t, p.A, 128, localRW)
	wc := do(t, p, readWR(1, src, 30, dst.SGE(5, 100)))
	expectSendWC(t, wc, 1, verbs.WCRDMARead, p.A.QPNum(0))
	if wc.ByteLen != 100 {
		t.Fatalf("Read completion %s: want ByteLen 100", fmtWC(wc))
	}
	expectZero(t, p.A, dst, 0, 5, "bytes before the Read's local range")
	expectBytes(t, p.A, dst, 5, pattern(15, 256)[30:130], "read bytes")
	expectZero(t, p.A, dst, 105, 23, "bytes after the Read's local range")
	expectCanaries(t, p.A, dst)
}

// testReadZeroLength: a Read without SGEs completes successfully.
func testReadZeroLength(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	src := newRegion(t, p.B, 64, remoteAll)
	expectSendWC(t, do(t, p, readWR(1, src, 0)), 1, verbs.WCRDMARead, p.A.QPNum(0))
}

// testReadMultiSGE: a Read scatters the remote bytes over its SGEs, in
// two regions, in order.
func testReadMultiSGE(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	src := newRegion(t, p.B, 128, remoteAll)
	fill(t, p.B, src, 0, pattern(16, 128))
	a1 := newRegion(t, p.A, 64, localRW)
	a2 := newRegion(t, p.A, 64, localRW)
	wc := do(t, p, readWR(1, src, 4, a1.SGE(0, 10), a2.SGE(20, 30), a1.SGE(32, 20)))
	expectSendWC(t, wc, 1, verbs.WCRDMARead, p.A.QPNum(0))
	want := pattern(16, 128)[4:64]
	expectBytes(t, p.A, a1, 0, want[:10], "first read SGE")
	expectBytes(t, p.A, a2, 20, want[10:40], "second read SGE")
	expectBytes(t, p.A, a1, 32, want[40:60], "third read SGE")
	expectZero(t, p.A, a1, 10, 22, "bytes between the first and third SGE")
	expectZero(t, p.A, a2, 0, 20, "bytes before the second SGE")
	expectCanaries(t, p.A, a1)
	expectCanaries(t, p.A, a2)
}

// testReadLarge: a 1 MiB Read, larger than any MTU or segment, arrives
// byte-exact.
func testReadLarge(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	size := 1 << 20
	if m := p.A.Attr().MaxMsgSize; uint64(size) > m {
		size = int(m)
	}
	src := newRegion(t, p.B, size, remoteAll)
	data := pattern(17, size)
	fill(t, p.B, src, 0, data)
	dst := newRegion(t, p.A, size, localRW)
	wc := do(t, p, readWR(1, src, 0, dst.SGE(0, size)))
	expectSendWC(t, wc, 1, verbs.WCRDMARead, p.A.QPNum(0))
	expectBytes(t, p.A, dst, 0, data, "1 MiB read")
	expectCanaries(t, p.A, dst)
}

// testReadNoLocalWrite: a Read into a local region registered without
// AccessLocalWrite fails with WCLocProtErr and leaves the region alone.
func testReadNoLocalWrite(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	src := newRegion(t, p.B, 64, remoteAll)
	fill(t, p.B, src, 0, pattern(18, 64))
	dst := newRegion(t, p.A, 64, 0)
	before := snap(t, p.A, dst, "read-only local region")
	expectStatus(t, do(t, p, readWR(1, src, 0, dst.SGE(0, 64))), 1, verbs.WCLocProtErr)
	before.unchanged(t)
	expectState(t, p.A, 0, verbs.QPSErr)
}

// testSendAfterWrites: a Send posted after Writes on the same QP is
// delivered only once the Writes' data is visible at the responder.
func testSendAfterWrites(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	const chunk, writes = 1024, 4
	src := newRegion(t, p.A, chunk*writes, localRW)
	data := pattern(19, chunk*writes)
	fill(t, p.A, src, 0, data)
	dst := newRegion(t, p.B, chunk*writes, remoteAll)
	msg := newRegion(t, p.B, 8, localRW)
	postRecv(t, p.B, 0, recvWR(9, msg.SGE(0, 8)))
	var wrs []verbs.SendWR
	for i := range writes {
		wr := writeWR(uint64(1+i), dst, i*chunk, src.SGE(i*chunk, chunk))
		wr.Flags &^= verbs.SendSignaled
		wrs = append(wrs, wr)
	}
	wrs = append(wrs, sendWR(100, src.SGE(0, 8)))
	postSend(t, p.A, 0, wrs...)
	expectRecvWC(t, waitOne(t, p.B, RecvCQ), 9, verbs.WCRecv, 8, p.B.QPNum(0))
	expectBytes(t, p.B, dst, 0, data, "data of the Writes when the Send after them is received")
	expectSendWC(t, waitOne(t, p.A, SendCQ), 100, verbs.WCSend, p.A.QPNum(0))
}

// testFence: a fenced Write waits for the Read before it, so the Read
// returns the value from before the Write.
// testFenceLocal: a fenced WR that sends what a Read before it brought
// into local memory sends the bytes the Read returned: the fence holds it
// back until the Read has completed, which a provider whose Read
// Responses arrive later (tcp0) must do itself.
func testFenceLocal(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	x := newRegion(t, p.B, 8, remoteAll)
	y := newRegion(t, p.B, 8, remoteAll)
	read, stale := pattern(22, 8), pattern(23, 8)
	fill(t, p.B, x, 0, read)
	fill(t, p.B, y, 0, stale)
	local := newRegion(t, p.A, 8, localRW)
	fill(t, p.A, local, 0, stale)
	readThenFencedWrite(t, p, readWR(1, x, 0, local.SGE(0, 8)), writeWR(2, y, 0, local.SGE(0, 8)))
	expectBytes(t, p.B, y, 0, read, "what the fenced Write sent from the Read's buffer")
}

func testFence(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	x := newRegion(t, p.B, 8, remoteAll)
	was, now := pattern(20, 8), pattern(21, 8)
	fill(t, p.B, x, 0, was)
	local := newRegion(t, p.A, 16, localRW)
	fill(t, p.A, local, 8, now)
	readThenFencedWrite(t, p, readWR(1, x, 0, local.SGE(0, 8)), writeWR(2, x, 0, local.SGE(8, 8)))
	expectBytes(t, p.A, local, 0, was, "value read before the fenced Write")
	expectBytes(t, p.B, x, 0, now, "value after the fenced Write")
}

// readThenFencedWrite posts read (WRID 1) and then write (WRID 2) with
// the fence on A's QP 0, and checks that both complete, in order.
func readThenFencedWrite(t *testing.T, p *Pair, read, write verbs.SendWR) {
	t.Helper()
	write.Flags |= verbs.SendFence
	postSend(t, p.A, 0, read, write)
	wcs := wait(t, p.A, SendCQ, 2)
	expectSendWC(t, wcs[0], 1, verbs.WCRDMARead, p.A.QPNum(0))
	expectSendWC(t, wcs[1], 2, verbs.WCRDMAWrite, p.A.QPNum(0))
}

// testWriteInline: an inline RDMA Write of MaxInlineData bytes from two
// SGEs places its payload, copied at post time, at the remote address.
func testWriteInline(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	n := int(queriedCap(t, p.A.QPs[0]).MaxInlineData)
	if n == 0 {
		skip(t, "no inline data on the QP")
	}
	src := newRegion(t, p.A, n, localRW)
	orig := pattern(24, n)
	fill(t, p.A, src, 0, orig)
	dst := newRegion(t, p.B, n+16, remoteAll)
	wr := writeWR(1, dst, 8, src.SGE(0, n/2), src.SGE(n/2, n-n/2))
	wr.Flags |= verbs.SendInline
	postSend(t, p.A, 0, wr)
	fill(t, p.A, src, 0, pattern(25, n))
	expectSendWC(t, waitOne(t, p.A, SendCQ), 1, verbs.WCRDMAWrite, p.A.QPNum(0))
	expectZero(t, p.B, dst, 0, 8, "bytes before the inline Write")
	expectBytes(t, p.B, dst, 8, orig, "inline payload as it was at post time")
	expectZero(t, p.B, dst, 8+n, 8, "bytes after the inline Write")
	expectCanaries(t, p.B, dst)
}

// testWriteWithImmZeroLength: a Write with immediate and no SGEs
// consumes a receive, whose completion reports 0 bytes and the
// immediate, and changes no memory.
func testWriteWithImmZeroLength(t *testing.T, h Harness) {
	requireCap(t, h, verbs.CapImmData, "CapImmData")
	p := h.NewPair(t, PairOptions{})
	dst := newRegion(t, p.B, 32, remoteAll)
	fill(t, p.B, dst, 0, pattern(26, 32))
	before := snap(t, p.B, dst, "target of a zero-length Write with immediate")
	recv := recvWR(9)
	if !p.B.Attr().Has(verbs.CapRecvNoSGE) {
		recv = recvWR(9, newRegion(t, p.B, 8, localRW).SGE(0, 8))
	}
	postRecv(t, p.B, 0, recv)
	wr := writeWR(1, dst, 0)
	wr.Opcode, wr.Imm = verbs.OpRDMAWriteWithImm, 0xcafe
	expectSendWC(t, do(t, p, wr), 1, verbs.WCRDMAWrite, p.A.QPNum(0))
	wc := waitOne(t, p.B, RecvCQ)
	expectRecvWC(t, wc, 9, verbs.WCRecvRDMAWithImm, 0, p.B.QPNum(0))
	if wc.Flags&verbs.WCWithImm == 0 || wc.Imm != 0xcafe {
		t.Fatalf("receive completion %s: want WCWithImm and immediate 0xcafe", fmtWC(wc))
	}
	before.unchanged(t)
}

// testReadsBeyondORD: more RDMA Reads (and, with CapAtomics, every
// third one a FetchAndAdd instead) posted at once than the QP may have
// outstanding (its MaxRdAtomic) wait their turn: every one completes
// successfully, in order, with the right bytes.
func testReadsBeyondORD(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{Cap: verbs.QPCap{MaxSendWR: 64}})
	a, err := p.A.QPs[0].Query()
	if err != nil {
		t.Fatalf("query QP: %v", err)
	}
	n := min(4*max(int(a.MaxRdAtomic), 1)+3, int(a.Cap.MaxSendWR))
	if n <= int(a.MaxRdAtomic) {
		t.Fatalf("a send queue of %d cannot hold more Reads than MaxRdAtomic %d", a.Cap.MaxSendWR, a.MaxRdAtomic)
	}
	const chunk = 64
	src := newRegion(t, p.B, chunk*n, remoteAll)
	data := pattern(27, chunk*n)
	fill(t, p.B, src, 0, data)
	dst := newRegion(t, p.A, chunk*n, localRW)
	atomics := p.A.Attr().Has(verbs.CapAtomics)
	counter := newRegion(t, p.B, 16, remoteAll)
	results := newRegion(t, p.A, 8*n, localRW)
	var wrs []verbs.SendWR
	var wrids []uint64
	adds := 0
	for i := range n {
		if atomics && i%3 == 2 {
			wrs = append(wrs, atomicWR(uint64(1+i), verbs.OpAtomicFetchAndAdd, counter, alignedOff(counter, 0),
				results.SGE(8*i, 8), 1, 0))
			adds++
		} else {
			wrs = append(wrs, readWR(uint64(1+i), src, chunk*i, dst.SGE(chunk*i, chunk)))
		}
		wrids = append(wrids, uint64(1+i))
	}
	postSend(t, p.A, 0, wrs...)
	expectStatuses(t, wait(t, p.A, SendCQ, n), verbs.WCSuccess, wrids...)
	for i := range n {
		if atomics && i%3 == 2 {
			if got := readWord(t, p.A, results, 8*i); got != uint64(i/3) {
				t.Fatalf("FetchAndAdd %d of the batch returned %d, want %d", i/3, got, i/3)
			}
			continue
		}
		expectBytes(t, p.A, dst, chunk*i, data[chunk*i:chunk*(i+1)], fmt.Sprintf("Read %d of %d with MaxRdAtomic %d", i, n, a.MaxRdAtomic))
	}
	if got := readWord(t, p.B, counter, alignedOff(counter, 0)); got != uint64(adds) {
		t.Fatalf("counter after %d FetchAndAdds is %d", adds, got)
	}
}

// testFenceAtomic: a fenced Write that sends what an atomic before it
// returned into local memory sends that value: the fence waits for the
// atomic's response as for a Read's.
func testFenceAtomic(t *testing.T, h Harness) {
	requireCap(t, h, verbs.CapAtomics, "CapAtomics")
	p := h.NewPair(t, PairOptions{})
	counter := newRegion(t, p.B, 16, remoteAll)
	off := alignedOff(counter, 0)
	fill(t, p.B, counter, off, word(41))
	y := newRegion(t, p.B, 8, remoteAll)
	local := newRegion(t, p.A, 8, localRW)
	fill(t, p.A, local, 0, word(7))
	add := atomicWR(1, verbs.OpAtomicFetchAndAdd, counter, off, local.SGE(0, 8), 1, 0)
	write := writeWR(2, y, 0, local.SGE(0, 8))
	write.Flags |= verbs.SendFence
	postSend(t, p.A, 0, add, write)
	wcs := wait(t, p.A, SendCQ, 2)
	expectSendWC(t, wcs[0], 1, verbs.WCFetchAdd, p.A.QPNum(0))
	expectSendWC(t, wcs[1], 2, verbs.WCRDMAWrite, p.A.QPNum(0))
	if got := readWord(t, p.B, y, 0); got != 41 {
		t.Fatalf("the fenced Write sent %d, want 41, the FetchAndAdd's result", got)
	}
	if got := readWord(t, p.B, counter, off); got != 42 {
		t.Fatalf("counter is %d after a FetchAndAdd of 1 on 41", got)
	}
}
