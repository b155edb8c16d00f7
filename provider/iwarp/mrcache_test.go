package iwarp_test

import (
	"testing"
	"time"

	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/verbs"
)

// exchangeOne sends one message from p.a to p.b and checks that each
// QP's cache of local key lookups now holds the region the message went
// through (the sender's source, the receiver's buffer).
func exchangeOne(t *testing.T, p *benchPair) {
	t.Helper()
	ctx := benchCtx(t)
	if _, err := p.b.qp.PostRecv(p.b.recv); err != nil {
		t.Fatal(err)
	}
	send := []verbs.SendWR{{WRID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{p.a.mr.SGE(0, latencySize)}}}
	if _, err := p.a.qp.PostSend(send); err != nil {
		t.Fatal(err)
	}
	p.a.waitOne(t, ctx, p.a.cq)
	p.b.waitOne(t, ctx, p.b.rcq)
	for _, e := range []*benchEnd{p.a, p.b} {
		if !iwarp.CachesMR(e.qp.Driver(), e.mr.LKey()) {
			t.Fatal("the region a message went through is not in its QP's cache: the test no longer tests the cache")
		}
	}
}

// TestDeregEmptiesMRCache: a QP's cache of local key lookups lets go of
// a region once it is deregistered, so that it keeps none of a
// deregistered region's memory alive.
func TestDeregEmptiesMRCache(t *testing.T) {
	p := newBenchPair(t, 4096)
	exchangeOne(t, p)
	for _, e := range []*benchEnd{p.a, p.b} {
		if err := e.mr.Dereg(); err != nil {
			t.Fatal(err)
		}
		if iwarp.CachesMR(e.qp.Driver(), e.mr.LKey()) {
			t.Fatal("a deregistered region is still in its QP's cache")
		}
	}
}

// TestErrStateQPKeepsNoRegion: a QP in the error state still takes send
// WRs (they complete flushed), and an inline one looks its region up
// through the QP's lookups (LocalSpan). Its connection has ended, so
// Dereg, which empties the caches of live connections' QPs only, would
// not find the region there: the cache is not filled in that state.
func TestErrStateQPKeepsNoRegion(t *testing.T) {
	p := newBenchPair(t, 4096)
	if err := p.a.qp.Modify(&verbs.QPAttr{State: verbs.QPSErr}, verbs.QPAttrState); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.ca.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the connection did not end")
	}
	m, err := p.a.pd.AllocMR(4096, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	wr := []verbs.SendWR{{WRID: 9, Opcode: verbs.OpSend, Flags: verbs.SendInline | verbs.SendSignaled, SGList: []verbs.SGE{m.SGE(0, 16)}}}
	if _, err := p.a.qp.PostSend(wr); err != nil {
		t.Fatal(err)
	}
	if err := m.Dereg(); err != nil {
		t.Fatal(err)
	}
	if iwarp.CachesMR(p.a.qp.Driver(), m.LKey()) {
		t.Fatal("a deregistered region is still in the cache of a QP in the error state")
	}
}

// TestDestroyEmptiesMRCache: Destroy moves the QP to the error state
// without toErr, and a later Dereg no longer visits the QP (it is neither
// in the context nor live): Destroy empties the cache itself, so that a
// destroyed QP the application still holds keeps no region alive.
func TestDestroyEmptiesMRCache(t *testing.T) {
	p := newBenchPair(t, 4096)
	exchangeOne(t, p)
	if err := p.a.qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := p.a.mr.Dereg(); err != nil {
		t.Fatal(err)
	}
	if iwarp.CachesMR(p.a.qp.Driver(), p.a.mr.LKey()) {
		t.Fatal("a destroyed QP still holds a deregistered region in its cache")
	}
}
