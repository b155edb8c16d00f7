package verbstest

import (
	"testing"

	"github.com/goverbs/goverbs/verbs"
)

// testZeroAlloc: the data path allocates nothing. A posts a Write, a Read,
// a FetchAndAdd and a Send and polls their completions; B's receives are
// posted beforehand, so that only A's process is measured.
func testZeroAlloc(t *testing.T, h Harness) {
	const runs = 100
	p := h.NewPair(t, PairOptions{Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: runs + 8}, CQDepth: 4 * runs})
	src := newRegion(t, p.A, 64, localRW)
	dst := newRegion(t, p.B, 64, remoteAll)
	recv := newRegion(t, p.B, 64, localRW)
	for i := range runs + 1 {
		postRecv(t, p.B, 0, recvWR(uint64(i), recv.SGE(0, 64)))
	}
	wrs := []verbs.SendWR{
		writeWR(1, dst, 0, src.SGE(0, 64)),
		readWR(2, dst, 0, src.SGE(0, 64)),
		atomicWR(3, verbs.OpAtomicFetchAndAdd, dst, 0, src.SGE(0, 8), 1, 0),
		sendWR(4, src.SGE(0, 64)),
	}
	if !p.A.Attr().Has(verbs.CapAtomics) {
		wrs = append(wrs[:2], wrs[3:]...)
	}
	for i := range wrs {
		wrs[i].Flags = verbs.SendSignaled
	}
	qp, cq := p.A.QPs[0], p.A.SendCQ
	wc := make([]verbs.WorkCompletion, 8)
	var failure string
	allocs := testing.AllocsPerRun(runs, func() {
		if _, err := qp.PostSend(wrs); err != nil {
			failure = err.Error()
			return
		}
		for got := 0; got < len(wrs); {
			n := cq.Poll(wc)
			for _, c := range wc[:n] {
				if c.Status != verbs.WCSuccess {
					failure = fmtWC(c)
				}
			}
			got += n
		}
	})
	if failure != "" {
		t.Fatalf("data path: %s", failure)
	}
	if allocs != 0 {
		t.Fatalf("PostSend and Poll of a Write, a Read, an atomic and a Send allocate %v times per round, want 0", allocs)
	}
}
