package verbstest

import (
	"testing"

	"github.com/goverbs/goverbs/verbs"
)

// manyRegions is how many regions testManyRegions registers on one
// context, unless the device admits fewer.
const manyRegions = 5000

// testManyRegions: one context holds thousands of regions (manyRegions,
// or as many as the device's MaxMR leaves room for: each test region
// takes two MRs), each with its own key; Writes and Reads reach a few of
// them by their keys, and once every region is deregistered a Write with
// one of the old keys fails with WCRemAccessErr.
func testManyRegions(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	n := min(manyRegions, (p.B.Attr().MaxMR-64)/2)
	if n < 2 {
		t.Skipf("the device admits %d MRs per context", p.B.Attr().MaxMR)
	}
	regs := make([]Region, n)
	keys := make(map[uint32]int, n)
	for i := range regs {
		regs[i] = newRegion(t, p.B, 16, remoteAll)
		if j, dup := keys[regs[i].RKey]; dup {
			t.Fatalf("regions %d and %d have the same rkey %#x", j, i, regs[i].RKey)
		}
		keys[regs[i].RKey] = i
	}
	src := newRegion(t, p.A, 64, localRW)
	data := pattern(41, 64)
	fill(t, p.A, src, 0, data)
	picks := []int{0, n / 3, n / 2, n - 1}
	for j, i := range picks {
		wc := do(t, p, writeWR(uint64(j+1), regs[i], 4, src.SGE(8*j, 8)))
		expectSendWC(t, wc, uint64(j+1), verbs.WCRDMAWrite, p.A.QPNum(0))
		expectBytes(t, p.B, regs[i], 4, data[8*j:8*j+8], "bytes written through one of many keys")
		expectZero(t, p.B, regs[i], 0, 4, "bytes before the Write")
		expectCanaries(t, p.B, regs[i])
	}
	for j, i := range picks {
		wc := do(t, p, readWR(uint64(10+j), regs[i], 4, src.SGE(32+8*j, 8)))
		expectSendWC(t, wc, uint64(10+j), verbs.WCRDMARead, p.A.QPNum(0))
		expectBytes(t, p.A, src, 32+8*j, data[8*j:8*j+8], "bytes read through one of many keys")
	}
	for i := range regs {
		if err := p.B.DeregRegion(regs[i].ID); err != nil {
			t.Fatalf("dereg region %d of %d: %v", i, n, err)
		}
	}
	stale := regs[picks[2]]
	tb := snap(t, p.B, stale, "deregistered region")
	expectFault(t, p, 0, writeWR(0, stale, 0, src.SGE(0, 8)), verbs.WCRemAccessErr, true)
	tb.unchanged(t)
}
