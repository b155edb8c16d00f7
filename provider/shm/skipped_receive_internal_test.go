package shm

import (
	"bytes"
	"testing"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/driver"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// TestForgedCompletionAheadStaysOnItsQP: the peer of A's QP 0 completes
// the last of four receives A posted there, one it never took, out of
// order. A's PostRecv then counts the receives before it as gone and
// posts into their places in the queue; that harms only QP 0's own
// receives (docs/limitations.md): QP 1 on the same CQ, whose peer is honest, gets its Send in
// its own buffer under its own WRID.
func TestForgedCompletionAheadStaysOnItsQP(t *testing.T) {
	const depth = 4
	p := localHarness().NewPair(t, verbstest.PairOptions{QPs: 2, Cap: verbs.QPCap{MaxSendWR: depth, MaxRecvWR: depth}})
	buf := newRegion(t, p.A, 16*(depth+2), verbs.AccessLocalWrite)
	for i := range depth {
		postRecv(t, p.A, 0, recv(uint64(i), buf.SGE(16*i, 16)))
	}
	postRecv(t, p.A, 1, recv(50, buf.SGE(16*(depth+1), 16)))
	forge(t, p, 0, driver.WorkCompletion{WRID: depth - 1, Opcode: driver.WCRecv})
	got := pollAll(p)
	if len(got) != 1 || got[0].WRID != depth-1 || got[0].QPNum != p.A.QPNum(0) {
		t.Fatalf("the forged completion of receive %d came out %+v", depth-1, got)
	}
	// Room from Poll's record: the receives the peer skipped count as taken.
	postRecv(t, p.A, 0, recv(depth, buf.SGE(16*depth, 16)))

	src := newRegion(t, p.B, 8, verbs.AccessLocalWrite)
	fill(t, p.B, src, 0, pattern(9, 8))
	postSend(t, p.B, 1, send(20, src.SGE(0, 8)))
	wcs := waitWCs(t, p.A, verbstest.RecvCQ, 1)
	if wcs[0].WRID != 50 || wcs[0].QPNum != p.A.QPNum(1) || wcs[0].Status != verbs.WCSuccess || wcs[0].ByteLen != 8 {
		t.Fatalf("QP 1's receive completed as %+v; want receive 50, 8 bytes, on QP %#x", wcs[0], p.A.QPNum(1))
	}
	if got := contents(t, p.A, buf, 16*(depth+1), 8); !bytes.Equal(got, pattern(9, 8)) {
		t.Fatalf("QP 1's receive holds %x, want %x", got, pattern(9, 8))
	}
}
