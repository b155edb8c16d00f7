package verbstest

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/driver"
)

// atomicPair makes a pair for an atomics case, skipping the case if the
// device has no atomics.
func atomicPair(t *testing.T, h Harness, opts PairOptions) *Pair {
	t.Helper()
	requireCap(t, h, verbs.CapAtomics, "CapAtomics")
	return h.NewPair(t, opts)
}

// word encodes v as an atomic operand in memory: host byte order.
func word(v uint64) []byte { return binary.NativeEndian.AppendUint64(nil, v) }

// readWord reads the 8-byte word at off of region r of e.
func readWord(t testing.TB, e Endpoint, r Region, off int) uint64 {
	t.Helper()
	return binary.NativeEndian.Uint64(contents(t, e, r, off, 8))
}

// atomicTarget makes a 32-byte remote region of B filled with a pattern
// and the word v at an aligned offset, returned with that offset.
func atomicTarget(t testing.TB, p *Pair, access verbs.AccessFlags, v uint64) (Region, int) {
	t.Helper()
	dst := newRegion(t, p.B, 32, access)
	fill(t, p.B, dst, 0, pattern(22, 32))
	off := alignedOff(dst, 8)
	fill(t, p.B, dst, off, word(v))
	return dst, off
}

// expectWord checks the target word and that every byte around it inside
// the region and its canaries are untouched.
func expectWord(t testing.TB, p *Pair, dst Region, off int, v uint64) {
	t.Helper()
	want := pattern(22, 32)
	copy(want[off:], word(v))
	expectBytes(t, p.B, dst, 0, want, fmt.Sprintf("atomic target holding %#x", v))
	expectCanaries(t, p.B, dst)
}

// testCmpAndSwp: CmpAndSwp returns the old value into the local SGE and
// swaps only when the compare value matches.
func testCmpAndSwp(t *testing.T, h Harness) {
	p := atomicPair(t, h, PairOptions{})
	dst, off := atomicTarget(t, p, remoteAll, 0x1111)
	res := newRegion(t, p.A, 16, localRW)

	wc := do(t, p, atomicWR(1, verbs.OpAtomicCmpAndSwp, dst, off, res.SGE(0, 8), 0x1111, 0x2222))
	expectSendWC(t, wc, 1, verbs.WCCompSwap, p.A.QPNum(0))
	if got := readWord(t, p.A, res, 0); got != 0x1111 {
		t.Fatalf("CmpAndSwp returned %#x, want the old value 0x1111", got)
	}
	expectWord(t, p, dst, off, 0x2222)

	wc = do(t, p, atomicWR(2, verbs.OpAtomicCmpAndSwp, dst, off, res.SGE(8, 8), 0x1111, 0x3333))
	expectSendWC(t, wc, 2, verbs.WCCompSwap, p.A.QPNum(0))
	if got := readWord(t, p.A, res, 8); got != 0x2222 {
		t.Fatalf("CmpAndSwp with a stale compare value returned %#x, want 0x2222", got)
	}
	expectWord(t, p, dst, off, 0x2222)
}

// testFetchAndAdd: FetchAndAdd returns the old value and adds, modulo 2^64.
func testFetchAndAdd(t *testing.T, h Harness) {
	p := atomicPair(t, h, PairOptions{})
	dst, off := atomicTarget(t, p, remoteAll, 100)
	res := newRegion(t, p.A, 16, localRW)

	wc := do(t, p, atomicWR(1, verbs.OpAtomicFetchAndAdd, dst, off, res.SGE(0, 8), 5, 0))
	expectSendWC(t, wc, 1, verbs.WCFetchAdd, p.A.QPNum(0))
	if got := readWord(t, p.A, res, 0); got != 100 {
		t.Fatalf("FetchAndAdd returned %d, want the old value 100", got)
	}
	expectWord(t, p, dst, off, 105)

	wc = do(t, p, atomicWR(2, verbs.OpAtomicFetchAndAdd, dst, off, res.SGE(8, 8), ^uint64(0), 0))
	expectSendWC(t, wc, 2, verbs.WCFetchAdd, p.A.QPNum(0))
	if got := readWord(t, p.A, res, 8); got != 105 {
		t.Fatalf("FetchAndAdd returned %d, want the old value 105", got)
	}
	expectWord(t, p, dst, off, 104)
}

// testAtomicMisaligned: an atomic on an address that is not 8-byte
// aligned changes nothing. Either the device refuses it at post time
// with ErrInvalidArg (rxe does), and the QP stays usable, or it fails
// with WCRemInvReqErr and moves the QP to the error state.
func testAtomicMisaligned(t *testing.T, h Harness) {
	p := atomicPair(t, h, PairOptions{})
	dst, off := atomicTarget(t, p, remoteAll, 7)
	res := newRegion(t, p.A, 16, localRW)
	before := snap(t, p.A, res, "local result buffer of a failed atomic")
	for _, op := range []verbs.Opcode{verbs.OpAtomicFetchAndAdd, verbs.OpAtomicCmpAndSwp} {
		wr := atomicWR(0, op, dst, off+4, res.SGE(0, 8), 7, 0)
		n, err := p.A.PostSend(0, []verbs.SendWR{wr})
		if n == 1 {
			wcs := wait(t, p.A, SendCQ, 1)
			expectStatus(t, wcs[0], 0, verbs.WCRemInvReqErr)
			expectState(t, p.A, 0, verbs.QPSErr)
			expectWord(t, p, dst, off, 7)
			before.unchanged(t)
			expectFlushAfterError(t, p.A, 0)
			return
		}
		expectRefused(t, fmt.Sprintf("misaligned %v", op), n, err, verbs.ErrInvalidArg)
	}
	expectEmpty(t, p.A, SendCQ)
	expectWord(t, p, dst, off, 7)
	before.unchanged(t)
	expectState(t, p.A, 0, verbs.QPSRTS)
	wc := do(t, p, atomicWR(2, verbs.OpAtomicFetchAndAdd, dst, off, res.SGE(8, 8), 1, 0))
	expectSendWC(t, wc, 2, verbs.WCFetchAdd, p.A.QPNum(0))
	expectWord(t, p, dst, off, 8)
}

// testAtomicBadLocalLength: an atomic whose local SG list does not total
// exactly 8 bytes is refused at post time with ErrInvalidArg.
func testAtomicBadLocalLength(t *testing.T, h Harness) {
	p := atomicPair(t, h, PairOptions{})
	dst, off := atomicTarget(t, p, remoteAll, 50)
	res := newRegion(t, p.A, 32, localRW)
	lists := [][]verbs.SGE{
		{res.SGE(0, 4)},
		{res.SGE(0, 16)},
		nil,
		{res.SGE(0, 8), res.SGE(8, 8)},
		{res.SGE(0, 1), res.SGE(8, 8)},
	}
	for _, op := range []verbs.Opcode{verbs.OpAtomicFetchAndAdd, verbs.OpAtomicCmpAndSwp} {
		for _, sg := range lists {
			wr := atomicWR(1, op, dst, off, verbs.SGE{}, 50, 60)
			wr.SGList = sg
			n, err := p.A.PostSend(0, []verbs.SendWR{wr})
			expectRefused(t, fmt.Sprintf("%v with a local list of %d bytes in %d SGEs", op, driver.SGListLen(sg), len(sg)),
				n, err, verbs.ErrInvalidArg)
		}
	}
	expectEmpty(t, p.A, SendCQ)
	expectWord(t, p, dst, off, 50)
	expectState(t, p.A, 0, verbs.QPSRTS)
	wc := do(t, p, atomicWR(2, verbs.OpAtomicFetchAndAdd, dst, off, res.SGE(0, 8), 1, 0))
	expectSendWC(t, wc, 2, verbs.WCFetchAdd, p.A.QPNum(0))
	expectWord(t, p, dst, off, 51)
}

// testAtomicSplitResult: on a device with CapAtomicResultSGList an
// atomic's local list may be any SGEs that total 8 bytes; the previous
// value lands across them in order, in host byte order, and the bytes
// around them are untouched.
func testAtomicSplitResult(t *testing.T, h Harness) {
	requireCap(t, h, verbs.CapAtomicResultSGList, "CapAtomicResultSGList")
	p := atomicPair(t, h, PairOptions{})
	old := uint64(0x1122334455667788)
	dst, off := atomicTarget(t, p, remoteAll, old)
	res := newRegion(t, p.A, 32, localRW)
	fill(t, p.A, res, 0, pattern(9, 32))
	for i, op := range []verbs.Opcode{verbs.OpAtomicFetchAndAdd, verbs.OpAtomicCmpAndSwp} {
		wr := atomicWR(uint64(1+i), op, dst, off, verbs.SGE{}, 0, 0)
		// 3 bytes at 1, then 5 at 20; FetchAndAdd adds 0, CmpAndSwp
		// compares with 0 and does not swap: the word stays old.
		wr.SGList = []verbs.SGE{res.SGE(1, 3), res.SGE(20, 5)}
		expectSendWC(t, do(t, p, wr), uint64(1+i), op.CompletionOpcode(), p.A.QPNum(0))
		want := pattern(9, 32)
		w := word(old)
		copy(want[1:4], w[:3])
		copy(want[20:25], w[3:])
		expectBytes(t, p.A, res, 0, want, fmt.Sprintf("%v's previous value in two SGEs", op))
		expectWord(t, p, dst, off, old)
	}
}

// testAtomicConcurrent: FetchAndAdds from four QPs, posted by four
// goroutines, on one remote word give the exact total, and every one of
// them returns a different old value.
func testAtomicConcurrent(t *testing.T, h Harness) {
	const qps, perQP = 4, 2000
	const total = qps * perQP
	p := atomicPair(t, h, PairOptions{QPs: qps})
	depth := int(p.Opts.Cap.MaxSendWR)
	dst := newRegion(t, p.B, 16, verbs.AccessRemoteAtomic|verbs.AccessLocalWrite)
	off := alignedOff(dst, 0)
	// Each QP has depth result slots; WR i uses slot i%depth, free again
	// once WR i-depth has completed (an RC send queue completes in order).
	res := newRegion(t, p.A, 8*qps*depth, localRW)
	mem := p.A.Region(res.ID).Bytes()
	slot := func(qp, i int) int { return 8 * (qp*depth + i%depth) }

	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	qpIndex := map[uint32]int{}
	credits := make([]chan struct{}, qps)
	for q := range qps {
		qpIndex[p.A.QPNum(q)] = q
		credits[q] = make(chan struct{}, depth)
		for range depth {
			credits[q] <- struct{}{}
		}
	}
	errs := make(chan error, qps+1)
	fail := func(err error) {
		select {
		case errs <- err:
		default:
		}
		cancel()
	}
	var wg sync.WaitGroup
	for q := range qps {
		wg.Go(func() {
			for i := range perQP {
				select {
				case <-credits[q]:
				case <-ctx.Done():
					return
				}
				wr := atomicWR(uint64(q)<<32|uint64(i), verbs.OpAtomicFetchAndAdd, dst, off,
					res.SGE(slot(q, i), 8), 1, 0)
				if n, err := p.A.PostSend(q, []verbs.SendWR{wr}); n != 1 {
					fail(fmt.Errorf("PostSend on QP %d, WR %d: %v", q, i, err))
					return
				}
			}
		})
	}

	// Poll the shared send CQ here, returning each QP's credits.
	seen := make([]bool, total)
	wcs := make([]verbs.WorkCompletion, 64)
	done := 0
	for done < total && ctx.Err() == nil {
		n, err := p.A.SendCQ.Wait(ctx, wcs)
		if err != nil {
			if ctx.Err() == nil {
				fail(fmt.Errorf("wait on the send CQ: %v", err))
			}
			break
		}
		for _, wc := range wcs[:n] {
			q, ok := qpIndex[wc.QPNum]
			if !ok || wc.Status != verbs.WCSuccess || wc.Opcode != verbs.WCFetchAdd || wc.WRID>>32 != uint64(q) {
				fail(fmt.Errorf("unexpected completion %s", fmtWC(wc)))
				break
			}
			old := binary.NativeEndian.Uint64(mem[slot(q, int(uint32(wc.WRID))):])
			if old >= total || seen[old] {
				fail(fmt.Errorf("FetchAndAdd %s returned %d: out of range or returned twice", fmtWC(wc), old))
				break
			}
			seen[old] = true
			done++
			credits[q] <- struct{}{}
		}
	}
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
	if done != total {
		t.Fatalf("%d of %d FetchAndAdds completed within %v", done, total, timeout)
	}
	if got := readWord(t, p.B, dst, off); got != total {
		t.Fatalf("counter after %d concurrent FetchAndAdds of 1 is %d", total, got)
	}
	expectCanaries(t, p.B, dst)
}

// testAtomicResultByteLen: a successful atomic's completion reports
// ByteLen 8, for both operations.
func testAtomicResultByteLen(t *testing.T, h Harness) {
	p := atomicPair(t, h, PairOptions{})
	dst, off := atomicTarget(t, p, remoteAll, 40)
	res := newRegion(t, p.A, 16, localRW)
	for i, op := range []verbs.Opcode{verbs.OpAtomicFetchAndAdd, verbs.OpAtomicCmpAndSwp} {
		wc := do(t, p, atomicWR(uint64(1+i), op, dst, off, res.SGE(8*i, 8), 40, 41))
		expectSendWC(t, wc, uint64(1+i), op.CompletionOpcode(), p.A.QPNum(0))
		if wc.ByteLen != 8 {
			t.Fatalf("%v completion %s: want ByteLen 8", op, fmtWC(wc))
		}
	}
	// FetchAndAdd of 40 made it 80; CmpAndSwp compared with 40 and failed.
	expectWord(t, p, dst, off, 80)
}

// testAtomicResultNoLocalWrite: an atomic whose result buffer is in a
// region without AccessLocalWrite fails with WCLocProtErr; the result
// buffer is untouched. (The remote word may or may not have changed: the
// device may find the fault when the response returns.)
func testAtomicResultNoLocalWrite(t *testing.T, h Harness) {
	p := atomicPair(t, h, PairOptions{})
	dst, off := atomicTarget(t, p, remoteAll, 7)
	res := newRegion(t, p.A, 8, 0)
	before := snap(t, p.A, res, "read-only result buffer")
	expectFault(t, p, 0, atomicWR(0, verbs.OpAtomicFetchAndAdd, dst, off, res.SGE(0, 8), 1, 0), verbs.WCLocProtErr, false)
	before.unchanged(t)
	if w := readWord(t, p.B, dst, off); w != 7 && w != 8 {
		t.Fatalf("target word after a FetchAndAdd of 1 on 7 is %d", w)
	}
}

// testAtomicResultBadLKey: an atomic whose result SGE names no region
// fails with WCLocProtErr.
func testAtomicResultBadLKey(t *testing.T, h Harness) {
	p := atomicPair(t, h, PairOptions{})
	dst, off := atomicTarget(t, p, remoteAll, 7)
	res := newRegion(t, p.A, 8, localRW)
	before := snap(t, p.A, res, "result buffer named with a bad key")
	sge := res.SGE(0, 8)
	sge.LKey = badKey(sge.LKey)
	expectFault(t, p, 0, atomicWR(0, verbs.OpAtomicCmpAndSwp, dst, off, sge, 7, 9), verbs.WCLocProtErr, false)
	before.unchanged(t)
	if w := readWord(t, p.B, dst, off); w != 7 && w != 9 {
		t.Fatalf("target word after a CmpAndSwp of 7 for 9 is %d", w)
	}
}
