package shm

import (
	"testing"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/driver"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// TestPollInLineTakesWhatFits: Poll of a CQ of one QP's send
// completions, which takes the first completion in line, takes none into
// an empty slice and as many as fit into a short one, in order, leaving
// the rest for the next Poll.
func TestPollInLineTakesWhatFits(t *testing.T) {
	const size = 64
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	src := newRegion(t, p.A, size, verbs.AccessLocalWrite)
	tgt := newRegion(t, p.B, size, verbs.AccessLocalWrite|verbs.RemoteAccess)
	q := driverQP(p.A.QPs[0])
	c := q.sendCQ
	c.mu.Lock()
	own := c.ownOnly
	c.mu.Unlock()
	if !own {
		t.Fatal("A's send CQ is not one of send completions only: the test tests nothing")
	}
	for round := range 2 {
		const n = 5
		for i := range n {
			postSend(t, p.A, 0, rdma(uint64(10*round+i), verbs.OpRDMAWrite, src.SGE(8*i, 8), tgt, 8*i))
		}
		if got := c.Poll(nil); got != 0 {
			t.Fatalf("Poll of an empty slice took %d completions", got)
		}
		wc := make([]driver.WorkCompletion, 2)
		next := uint64(10 * round)
		for _, fit := range []int{0, 1, 2, 2} {
			got := c.Poll(wc[:fit])
			want := min(fit, n-int(next-uint64(10*round)))
			if got != want {
				t.Fatalf("Poll of %d took %d completions, want %d", fit, got, want)
			}
			for _, w := range wc[:got] {
				if w.WRID != next || w.Status != driver.WCSuccess {
					t.Fatalf("completion of WR %d with %v, want WR %d with success", w.WRID, w.Status, next)
				}
				next++
			}
		}
		if got := c.Poll(wc); got != 0 {
			t.Fatalf("Poll took %d completions more than were posted", got)
		}
	}
}
