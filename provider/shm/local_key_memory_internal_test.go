package shm

import (
	"bytes"
	"testing"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// TestRememberedLocalKeyDeregistered: a QP remembers the region its last
// WR's local key named; once that region is deregistered, an RDMA Write
// from it, a Read into it and a FetchAndAdd into it, each on a QP whose
// last WR used it, complete with WCLocProtErr and move no byte.
func TestRememberedLocalKeyDeregistered(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{QPs: 3})
	tgt := newRegion(t, p.B, 64, verbs.AccessLocalWrite|verbs.RemoteAccess)
	src := newRegion(t, p.A, 64, verbs.AccessLocalWrite)
	fill(t, p.A, src, 0, pattern(1, 64))
	for i := range 3 {
		postSend(t, p.A, i, rdma(uint64(i), verbs.OpRDMAWrite, src.SGE(0, 8), tgt, 8*i))
		expectWC(t, waitWCs(t, p.A, verbstest.SendCQ, 1)[0], uint64(i), verbs.WCSuccess)
	}
	fill(t, p.B, tgt, 0, pattern(2, 64))
	if err := p.A.DeregRegion(src.ID); err != nil {
		t.Fatal(err)
	}
	postSend(t, p.A, 0, rdma(10, verbs.OpRDMAWrite, src.SGE(0, 8), tgt, 0))
	postSend(t, p.A, 1, rdma(11, verbs.OpRDMARead, src.SGE(8, 8), tgt, 8))
	postSend(t, p.A, 2, atomicWR(12, verbs.OpAtomicFetchAndAdd, src.SGE(16, 8), tgt, 16, 1, 0))
	got := map[uint64]verbs.WCStatus{}
	for _, wc := range waitWCs(t, p.A, verbstest.SendCQ, 3) {
		got[wc.WRID] = wc.Status
	}
	for wrid := uint64(10); wrid <= 12; wrid++ {
		if got[wrid] != verbs.WCLocProtErr {
			t.Errorf("WR %d from the deregistered region: %v, want %v", wrid, got[wrid], verbs.WCLocProtErr)
		}
	}
	if b := contents(t, p.B, tgt, 0, 64); !bytes.Equal(b, pattern(2, 64)) {
		t.Error("a WR from a deregistered region changed the target")
	}
}

// TestRememberedLocalKeyRights: the region a QP remembers is checked for
// the rights each WR needs: after a Write from a region without local
// write access, a Read and a FetchAndAdd into it complete with
// WCLocProtErr and leave it as it was.
func TestRememberedLocalKeyRights(t *testing.T) {
	for _, op := range []verbs.Opcode{verbs.OpRDMARead, verbs.OpAtomicFetchAndAdd} {
		t.Run(op.String(), func(t *testing.T) {
			p := localHarness().NewPair(t, verbstest.PairOptions{})
			tgt := newRegion(t, p.B, 64, verbs.AccessLocalWrite|verbs.RemoteAccess)
			ro := newRegion(t, p.A, 64, 0)
			postSend(t, p.A, 0, rdma(1, verbs.OpRDMAWrite, ro.SGE(0, 8), tgt, 0))
			expectWC(t, waitWCs(t, p.A, verbstest.SendCQ, 1)[0], 1, verbs.WCSuccess)
			before := contents(t, p.A, ro, 0, 64)
			postSend(t, p.A, 0, atomicWR(2, op, ro.SGE(8, 8), tgt, 8, 1, 0))
			expectWC(t, waitWCs(t, p.A, verbstest.SendCQ, 1)[0], 2, verbs.WCLocProtErr)
			if b := contents(t, p.A, ro, 0, 64); !bytes.Equal(b, before) {
				t.Errorf("%v wrote into a region without local write access", op)
			}
		})
	}
}
