package shm

import (
	"bytes"
	"testing"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// TestConnectionsShareTheirPeersMappings: two connections to one peer
// process map its CQ's segment and the segment of a region both write
// once between them; a connection that closes leaves the mapping to the
// other, which keeps writing through it, and the mapping goes with the
// last connection.
func TestConnectionsShareTheirPeersMappings(t *testing.T) {
	var keys []mappingKey
	t.Cleanup(func() { // after the pair's own cleanup: registered first
		sharedMu.Lock()
		defer sharedMu.Unlock()
		for _, k := range keys {
			if sharedMappings[k] != nil {
				t.Errorf("a peer's segment is still mapped once every connection to it is closed")
			}
		}
	})
	p := localHarness().NewPair(t, verbstest.PairOptions{QPs: 2})
	src := newRegion(t, p.A, 64, verbs.AccessLocalWrite)
	dst := newRegion(t, p.B, 64, verbs.AccessLocalWrite|verbs.RemoteAccess)
	fill(t, p.A, src, 0, pattern(1, 16))
	write := func(i int) {
		t.Helper()
		postSend(t, p.A, i, rdma(uint64(i), verbs.OpRDMAWrite, src.SGE(0, 8), dst, 8*i))
		expectWC(t, waitWCs(t, p.A, verbstest.SendCQ, 1)[0], uint64(i), verbs.WCSuccess)
	}
	write(0)
	write(1)
	qs := p.A.QPs
	q0, q1 := driverQP(qs[0]), driverQP(qs[1])
	q0.mu.Lock()
	q1.mu.Lock()
	c0, c1 := q0.conn, q1.conn
	if &c0.cqSeg.mem[0] != &c1.cqSeg.mem[0] {
		t.Error("two connections to one peer CQ map its segment twice")
	}
	shared := 0
	for id, s := range c0.segs {
		if s1 := c1.segs[id]; s1 != nil && c0.segRW[id] == c1.segRW[id] {
			if &s.mem[0] != &s1.mem[0] {
				t.Errorf("segment %d of the peer is mapped twice", id)
			}
			keys = append(keys, s.shared.key)
			shared++
		}
	}
	keys = append(keys, c0.cqSeg.shared.key)
	q1.mu.Unlock()
	q0.mu.Unlock()
	if shared == 0 {
		t.Fatal("the connections that wrote one region map none of its segments both")
	}
	if err := p.A.Conns[0].Close(); err != nil {
		t.Fatal(err)
	}
	fill(t, p.A, src, 0, pattern(2, 16))
	write(1)
	if got, want := contents(t, p.B, dst, 8, 8), pattern(2, 16)[:8]; !bytes.Equal(got, want) {
		t.Fatalf("a Write through the mapping left when the other connection closed placed %x, want %x", got, want)
	}
}
