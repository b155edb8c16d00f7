package iwarp_test

import (
	"testing"

	"github.com/goverbs/goverbs/verbs"
)

// TestWriteWithImmReceivedAllocatesNothing: once a connection runs, an
// RDMA Write with immediate, the receive it consumes and both
// completions allocate nothing. The count is the process's, the
// receiving goroutines of both sides included.
func TestWriteWithImmReceivedAllocatesNothing(t *testing.T) {
	p := newBenchPair(t, 1<<16)
	ctx := benchCtx(t)
	write := []verbs.SendWR{{Opcode: verbs.OpRDMAWriteWithImm, Flags: verbs.SendSignaled, Imm: 7,
		SGList: []verbs.SGE{p.a.mr.SGE(0, latencySize)}, RemoteAddr: p.b.mr.Addr() + 4096, RKey: p.b.mr.RKey()}}
	round := func() {
		if _, err := p.b.qp.PostRecv(p.b.recv); err != nil {
			t.Fatal(err)
		}
		if _, err := p.a.qp.PostSend(write); err != nil {
			t.Fatal(err)
		}
		wc := p.b.waitOne(t, ctx, p.b.rcq)
		if wc.Opcode != verbs.WCRecvRDMAWithImm || wc.Imm != 7 || wc.ByteLen != latencySize {
			t.Fatalf("receive completion %+v, want a Write with immediate 7 of %d bytes", wc, latencySize)
		}
		p.a.waitOne(t, ctx, p.a.cq)
	}
	for range 100 {
		round()
	}
	if n := testing.AllocsPerRun(200, round); n != 0 {
		t.Errorf("a Write with immediate and its receive allocate %v times", n)
	}
}
