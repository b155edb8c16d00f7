package iwarp_test

import (
	"testing"

	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/verbs"
)

// TestDeregEmptiesMRCache: the cache of local key lookups a QP keeps
// (the sender's of its Send's source, the receiver's of its receive
// buffer) lets go of a region once it is deregistered, so that it keeps
// none of a deregistered region's memory alive.
func TestDeregEmptiesMRCache(t *testing.T) {
	p := newBenchPair(t, 4096)
	ctx := benchCtx(t)
	if _, err := p.b.qp.PostRecv(p.b.recv); err != nil {
		t.Fatal(err)
	}
	send := []verbs.SendWR{{WRID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{p.a.mr.SGE(0, latencySize)}}}
	if _, err := p.a.qp.PostSend(send); err != nil {
		t.Fatal(err)
	}
	p.a.waitOne(t, ctx, p.a.scq)
	p.b.waitOne(t, ctx, p.b.rcq)
	for _, e := range []*benchEnd{p.a, p.b} {
		if !iwarp.CachesMR(e.qp.Driver(), e.mr.LKey()) {
			t.Fatal("the region a message went through is not in its QP's cache: the test no longer tests the cache")
		}
		if err := e.mr.Dereg(); err != nil {
			t.Fatal(err)
		}
		if iwarp.CachesMR(e.qp.Driver(), e.mr.LKey()) {
			t.Fatal("a deregistered region is still in its QP's cache")
		}
	}
}
