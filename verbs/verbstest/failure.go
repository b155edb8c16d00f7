package verbstest

import (
	"testing"
	"time"

	"github.com/goverbs/goverbs/verbs"
)

// peerLossBound is how soon a QP must notice that its peer is gone.
const peerLossBound = time.Second

// expectPeerLoss has A post a receive on each of two QPs and, with RNR
// retry, a Send that B never receives and so stays outstanding; then it
// runs lose, which ends B, and checks that every connection of A ends
// within peerLossBound with its QP in the error state and that every
// outstanding WR flushes.
func expectPeerLoss(t *testing.T, h Harness, lose func(p *Pair)) {
	p := h.NewPair(t, PairOptions{QPs: 2})
	dst := newRegion(t, p.A, 64, localRW)
	postRecv(t, p.A, 0, recvWR(100, dst.SGE(0, 32)))
	postRecv(t, p.A, 1, recvWR(101, dst.SGE(32, 32)))
	held := p.A.Attr().Has(verbs.CapRNRRetry)
	if held {
		src := newRegion(t, p.A, 8, localRW)
		postSend(t, p.A, 0, sendWR(1, src.SGE(0, 8)))
		expectEmpty(t, p.A, SendCQ)
	}
	lose(p)
	bound := time.NewTimer(peerLossBound)
	defer bound.Stop()
	for i, c := range p.A.Conns {
		select {
		case <-c.Done():
		case <-bound.C:
			t.Fatalf("connection %d did not end within %v of losing the peer", i, peerLossBound)
		}
		if s, err := p.A.QPState(i); err != nil || s != verbs.QPSErr {
			t.Fatalf("QP %d is in state %v (error %v) after its connection ended, want ERR", i, s, err)
		}
	}
	got := map[uint64]bool{}
	for _, wc := range wait(t, p.A, RecvCQ, 2) {
		if wc.Status != verbs.WCWRFlushErr || got[wc.WRID] || (wc.WRID != 100 && wc.WRID != 101) {
			t.Fatalf("receive completion %s: want WRIDs 100 and 101 flushed", fmtWC(wc))
		}
		got[wc.WRID] = true
	}
	if held {
		expectStatus(t, waitOne(t, p.A, SendCQ), 1, verbs.WCWRFlushErr)
	}
	expectEmpty(t, p.A, SendCQ)
	expectEmpty(t, p.A, RecvCQ)
}

// testPeerKilled: the peer dying (its process killed, or its device closed
// without a disconnect) ends A's connections within a second and flushes
// everything outstanding.
func testPeerKilled(t *testing.T, h Harness) {
	expectPeerLoss(t, h, func(p *Pair) { p.KillB() })
}

// testPeerDisconnect: the peer closing its endpoint in order does the
// same.
func testPeerDisconnect(t *testing.T, h Harness) {
	expectPeerLoss(t, h, func(p *Pair) {
		if err := p.B.Close(); err != nil {
			t.Fatalf("close B: %v", err)
		}
	})
}
