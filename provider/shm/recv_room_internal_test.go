package shm

import (
	"testing"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// TestConsumedReceiveFreesItsRoom: a receive a Send has consumed no longer
// counts against the receive queue's MaxRecvWR, though its completion is
// not polled yet: with the queue full, a Send, then one more receive
// posts, and both completions come out in order.
func TestConsumedReceiveFreesItsRoom(t *testing.T) {
	const depth = 4
	p := localHarness().NewPair(t, verbstest.PairOptions{Cap: verbs.QPCap{MaxSendWR: depth, MaxRecvWR: depth}})
	buf := newRegion(t, p.A, 16*(depth+1), verbs.AccessLocalWrite)
	for i := range depth {
		postRecv(t, p.A, 0, recv(uint64(i), buf.SGE(16*i, 16)))
	}
	src := newRegion(t, p.B, 8, verbs.AccessLocalWrite)
	postSend(t, p.B, 0, send(100, src.SGE(0, 8)))
	waitWCs(t, p.B, verbstest.SendCQ, 1)
	postRecv(t, p.A, 0, recv(depth, buf.SGE(16*depth, 16)))
	for i := range depth {
		postSend(t, p.B, 0, send(uint64(101+i), src.SGE(0, 8)))
		waitWCs(t, p.B, verbstest.SendCQ, 1)
	}
	for i, w := range waitWCs(t, p.A, verbstest.RecvCQ, depth+1) {
		expectWC(t, w, uint64(i), verbs.WCSuccess)
	}
}

// TestPolledReceiveFreesItsRoomWhateverTheSharedHead: a receive whose
// completion Poll took frees its room from this process's own record,
// whatever the queue's shared head (which the peer writes) says: with the
// queue full, one Send polled and the shared head put back behind it,
// one more receive posts, and its Send completes it. Receives not yet
// consumed still count: the next post finds the queue full.
func TestPolledReceiveFreesItsRoomWhateverTheSharedHead(t *testing.T) {
	const depth = 4
	p := localHarness().NewPair(t, verbstest.PairOptions{Cap: verbs.QPCap{MaxSendWR: depth, MaxRecvWR: depth}})
	buf := newRegion(t, p.A, 16*(depth+1), verbs.AccessLocalWrite)
	for i := range depth {
		postRecv(t, p.A, 0, recv(uint64(i), buf.SGE(16*i, 16)))
	}
	src := newRegion(t, p.B, 8, verbs.AccessLocalWrite)
	postSend(t, p.B, 0, send(100, src.SGE(0, 8)))
	waitWCs(t, p.B, verbstest.SendCQ, 1)
	expectWC(t, waitWCs(t, p.A, verbstest.RecvCQ, 1)[0], 0, verbs.WCSuccess)

	driverQP(p.A.QPs[0]).sh.rq.h.head.Store(0) // what a hostile peer may write
	postRecv(t, p.A, 0, recv(depth, buf.SGE(16*depth, 16)))
	if _, err := p.A.QPs[0].PostRecv([]verbs.RecvWR{recv(depth+1, buf.SGE(0, 16))}); err == nil {
		t.Fatal("a receive beyond MaxRecvWR posted")
	}
	driverQP(p.A.QPs[0]).sh.rq.h.head.Store(1) // back where the Send left it
	for i := range depth {
		postSend(t, p.B, 0, send(uint64(101+i), src.SGE(0, 8)))
		waitWCs(t, p.B, verbstest.SendCQ, 1)
	}
	for i, w := range waitWCs(t, p.A, verbstest.RecvCQ, depth) {
		expectWC(t, w, uint64(i+1), verbs.WCSuccess)
	}
}
