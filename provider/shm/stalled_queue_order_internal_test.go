package shm

import (
	"bytes"
	"testing"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// A WR posted while an earlier WR of its QP waits at the head of the send
// queue waits behind it: neither postPath nor postNow performs it at once,
// though it checks out for them, and it completes after the WR it was
// posted behind.

// TestWriteBehindRNRSendWaitsForIt: a Write whose keys postFast keeps,
// posted behind a Send that retries receiver-not-ready, is not performed
// until the Send has landed, and completes after it. (PostSend tries
// postPath for it; postNow it does not try, since the QP waits to retry:
// this pins postPath's test that the queue is idle.)
func TestWriteBehindRNRSendWaitsForIt(t *testing.T) {
	const size = 64
	p := localHarness().NewPair(t, verbstest.PairOptions{RNRRetry: verbs.RNRRetryInfinite, MinRNRTimer: 1})
	src := newRegion(t, p.A, size, verbs.AccessLocalWrite)
	tgt := newRegion(t, p.B, size, verbs.AccessLocalWrite|verbs.RemoteAccess)
	dst := newRegion(t, p.B, size, verbs.AccessLocalWrite)
	fill(t, p.A, src, 0, pattern(1, size))
	fill(t, p.B, tgt, 0, pattern(2, size))
	warmFastPath(t, p, verbs.OpRDMAWrite, src, tgt, 0)
	// No receive posted at B: the Send waits at the head of the queue.
	postSend(t, p.A, 0, send(10, src.SGE(0, 16)))
	before := contents(t, p.B, tgt, 0, size)
	postSend(t, p.A, 0, rdma(11, verbs.OpRDMAWrite, src.SGE(32, 8), tgt, 32))
	expectWriteWaited(t, p, tgt, before, 10, 11)
	postRecv(t, p.B, 0, recv(20, dst.SGE(0, size)))
	expectInOrder(t, p, tgt, src, 10, 11)
}

// TestWriteBehindStalledInvalidationWaitsForIt: a Write posted behind a
// local invalidation that waits for the peer to confirm the key revoked
// (the send queue stalls, with no RNR wait) is not performed until the
// invalidation has completed, and completes after it. (With no RNR wait,
// PostSend tries postNow: this pins postNow's test that the queue is
// idle.)
func TestWriteBehindStalledInvalidationWaitsForIt(t *testing.T) {
	const size = 64
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	src := newRegion(t, p.A, size, verbs.AccessLocalWrite)
	tgt := newRegion(t, p.B, size, verbs.AccessLocalWrite|verbs.RemoteAccess)
	fill(t, p.A, src, 0, pattern(1, size))
	fill(t, p.B, tgt, 0, pattern(2, size))
	win, err := p.A.NewRegion(4096, verbs.AccessLocalWrite|verbs.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	mw := bindType2(t, p.A, win, 64, verbs.AccessRemoteRead)
	// B answers A's request to confirm the key revoked when its QP's
	// lock is free (awaitRevokeAnswer): while the test holds it, the
	// invalidation stalls A's send queue.
	bq := driverQP(p.B.(*verbstest.Local).QPs[0])
	bq.mu.Lock()
	held := true
	defer func() {
		if held {
			bq.mu.Unlock()
		}
	}()
	postSend(t, p.A, 0, verbs.SendWR{WRID: 10, Opcode: verbs.OpLocalInv, Flags: verbs.SendSignaled, InvalidateRKey: mw.RKey()})
	q := driverQP(p.A.QPs[0])
	q.mu.Lock()
	stalled := q.mwWait.waiting && !q.rnr.Waiting()
	q.mu.Unlock()
	if !stalled {
		t.Fatal("the invalidation does not stall A's send queue: the test tests nothing")
	}
	before := contents(t, p.B, tgt, 0, size)
	postSend(t, p.A, 0, rdma(11, verbs.OpRDMAWrite, src.SGE(32, 8), tgt, 32))
	expectWriteWaited(t, p, tgt, before, 10, 11)
	held = false
	bq.mu.Unlock()
	expectInOrder(t, p, tgt, src, 10, 11)
}

// expectWriteWaited checks that the Write write, posted behind the WR
// head that cannot complete yet, has neither changed tgt (as before) nor
// completed.
func expectWriteWaited(t *testing.T, p *verbstest.Pair, tgt verbstest.Region, before []byte, head, write uint64) {
	t.Helper()
	if after := contents(t, p.B, tgt, 0, len(before)); !bytes.Equal(after, before) {
		t.Fatalf("the Write (WR %d) posted behind WR %d, which waits, was performed before it: the target is %x, was %x", write, head, after, before)
	}
	var wc [2]verbs.WorkCompletion
	if n := p.A.SendCQ.Poll(wc[:]); n != 0 {
		t.Fatalf("with WR %d waiting, A's send CQ holds %d completions: %+v", head, n, wc[:n])
	}
}

// expectInOrder waits for the completions of head and then write, in
// that order, and checks the Write's data at offset 32 of tgt.
func expectInOrder(t *testing.T, p *verbstest.Pair, tgt, src verbstest.Region, head, write uint64) {
	t.Helper()
	wcs := waitWCs(t, p.A, verbstest.SendCQ, 2)
	expectWC(t, wcs[0], head, verbs.WCSuccess)
	expectWC(t, wcs[1], write, verbs.WCSuccess)
	if got, want := contents(t, p.B, tgt, 32, 8), contents(t, p.A, src, 32, 8); !bytes.Equal(got, want) {
		t.Fatalf("the Write wrote %x, want %x", got, want)
	}
}
