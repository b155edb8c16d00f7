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
//
// With silent set, B's end makes no sound (its device closed in this
// process, with no disconnect): an RC QP has no keepalive, so A learns of
// it only from traffic. A then posts a Write on each QP; each QP must
// reach the error state within the suite's timeout, its Write and the
// held Send completing with WCRetryExcErr (the transport's retries ran
// out) or flushed (the provider saw the peer go), and the receives flush.
func expectPeerLoss(t *testing.T, h Harness, lose func(p *Pair), silent bool) {
	p := h.NewPair(t, PairOptions{QPs: 2})
	dst := newRegion(t, p.A, 64, localRW)
	target := newRegion(t, p.B, 16, remoteAll)
	postRecv(t, p.A, 0, recvWR(100, dst.SGE(0, 32)))
	postRecv(t, p.A, 1, recvWR(101, dst.SGE(32, 32)))
	held := p.A.Attr().Has(verbs.CapRNRRetry)
	src := newRegion(t, p.A, 8, localRW)
	if held {
		postSend(t, p.A, 0, sendWR(1, src.SGE(0, 8)))
		expectEmpty(t, p.A, SendCQ)
	}
	lose(p)
	if silent {
		expectSilentPeerLoss(t, p, target, src, held)
		return
	}
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
	expectFlushedRecvs(t, p)
	if held {
		expectStatus(t, waitOne(t, p.A, SendCQ), 1, verbs.WCWRFlushErr)
	}
	expectEmpty(t, p.A, SendCQ)
	expectEmpty(t, p.A, RecvCQ)
}

// expectFlushedRecvs checks that A's receives 100 and 101 were flushed.
func expectFlushedRecvs(t *testing.T, p *Pair) {
	t.Helper()
	got := map[uint64]bool{}
	for _, wc := range wait(t, p.A, RecvCQ, 2) {
		if wc.Status != verbs.WCWRFlushErr || got[wc.WRID] || (wc.WRID != 100 && wc.WRID != 101) {
			t.Fatalf("receive completion %s: want WRIDs 100 and 101 flushed", fmtWC(wc))
		}
		got[wc.WRID] = true
	}
}

// expectSilentPeerLoss is the end of expectPeerLoss for a silent peer.
func expectSilentPeerLoss(t *testing.T, p *Pair, target, src Region, held bool) {
	t.Helper()
	want := 2
	for i := range 2 {
		postSend(t, p.A, i, writeWR(uint64(10+i), target, 8*i, src.SGE(0, 8)))
	}
	if held {
		want++
	}
	for i := range 2 {
		expectState(t, p.A, i, verbs.QPSErr)
	}
	for _, wc := range wait(t, p.A, SendCQ, want) {
		switch {
		case wc.WRID != 1 && wc.WRID != 10 && wc.WRID != 11:
			t.Fatalf("send completion %s of no WR posted", fmtWC(wc))
		case wc.Status == verbs.WCRetryExcErr || wc.Status == verbs.WCWRFlushErr:
		case wc.Status == verbs.WCSuccess && wc.WRID != 1 && !p.A.Attr().Has(verbs.CapAckedCompletion):
		default:
			t.Fatalf("send completion %s after the peer went silent: want WCRetryExcErr or a flush", fmtWC(wc))
		}
	}
	expectFlushedRecvs(t, p)
	expectEmpty(t, p.A, SendCQ)
	expectEmpty(t, p.A, RecvCQ)
}

// testPeerKilled: the peer dying ends A's connections within a second
// and flushes everything outstanding when it is a process that dies (its
// kernel closes what it held); when it is a device closed in this
// process without a disconnect, A learns of it from its next WRs.
func testPeerKilled(t *testing.T, h Harness) {
	expectPeerLoss(t, h, func(p *Pair) { p.KillB() }, h.Remote == nil)
}

// testPeerDisconnect: the peer closing its endpoint in order does the
// same.
func testPeerDisconnect(t *testing.T, h Harness) {
	expectPeerLoss(t, h, func(p *Pair) {
		if err := p.B.Close(); err != nil {
			t.Fatalf("close B: %v", err)
		}
	}, false)
}

// silentWait bounds the wait for a transport timeout: tcp0 gives a
// request at least 4 s, and up to twice its timeout, before it fails.
const silentWait = 60 * time.Second

// testSilentPeer: a peer that stops answering — its process stopped
// with SIGSTOP when it is another process, its endpoint no longer polled
// when it is in this one. On a device with CapTransportRetry a Read
// outstanding to it completes with WCRetryExcErr once the transport's
// retries have run out — no sooner than the QP's Timeout × (RetryCnt+1) —
// and the QP moves to the error state, flushing the WR after it. A device
// without it moves the data itself, so the peer's silence stops nothing:
// see testSilentPeerServed.
func testSilentPeer(t *testing.T, h Harness) {
	if !deviceAttr(t, h).Has(verbs.CapTransportRetry) {
		testSilentPeerServed(t, h)
		return
	}
	if h.Remote == nil {
		skip(t, "B in this process: a device with CapTransportRetry answers for it whether or not it polls; the case stops B's process")
	}
	p := h.NewPair(t, PairOptions{})
	src := newRegion(t, p.B, 64, remoteAll)
	dst := newRegion(t, p.A, 64, localRW)
	expectStatus(t, do(t, p, readWR(1, src, 0, dst.SGE(0, 32))), 1, verbs.WCSuccess)
	a, err := p.A.QPs[0].Query()
	if err != nil {
		t.Fatalf("query QP: %v", err)
	}
	if a.Timeout == 0 {
		t.Fatalf("the QP's Timeout is 0 (never): cm should have set one")
	}
	least := 4096 * time.Nanosecond << a.Timeout * time.Duration(int(a.RetryCnt)+1)
	cont, err := stopProcess(PeerPID(p.B))
	if err != nil {
		t.Fatalf("stop B's process: %v", err)
	}
	defer cont()
	start := time.Now()
	postSend(t, p.A, 0, readWR(2, src, 0, dst.SGE(32, 32)), readWR(3, src, 32, dst.SGE(0, 32)))
	wcs, err := p.A.Completions(SendCQ, 2, silentWait)
	took := time.Since(start)
	if err != nil || len(wcs) != 2 {
		t.Fatalf("Reads to a stopped peer: %d completions %s (error %v) within %v, want 2", len(wcs), fmtWCs(wcs), err, silentWait)
	}
	expectStatus(t, wcs[0], 2, verbs.WCRetryExcErr)
	expectStatus(t, wcs[1], 3, verbs.WCWRFlushErr)
	if took < least {
		t.Fatalf("a Read to a silent peer failed after %v, before Timeout %d × (RetryCnt %d + 1) = %v", took, a.Timeout, a.RetryCnt, least)
	}
	expectState(t, p.A, 0, verbs.QPSErr)
	t.Logf("a Read to a stopped peer failed with WCRetryExcErr after %v (Timeout %d, RetryCnt %d)", took, a.Timeout, a.RetryCnt)
}

// testSilentPeerServed is the silent-peer case of a device without
// CapTransportRetry (loop0, shm0): the requester moves the data itself,
// so a Read, a Write, a Send into a receive posted before the silence
// and, with CapAtomics, a fetch-and-add all complete successfully while
// the peer is silent, within the suite's timeout, the QP staying in RTS.
// When the peer answers again it finds the Write's bytes, the Send's
// receive completion and the sum in its memory.
func testSilentPeerServed(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	atomics := p.A.Attr().Has(verbs.CapAtomics)
	target := newRegion(t, p.B, 72, remoteAll)
	inbox := newRegion(t, p.B, 16, localRW)
	src := newRegion(t, p.A, 64, localRW)
	const readBytes = "bytes B wrote before it stopped!"
	fill(t, p.B, target, 0, []byte(readBytes))
	sum := alignedOff(target, 48)
	fill(t, p.B, target, sum, []byte{5, 0, 0, 0, 0, 0, 0, 0})
	fill(t, p.A, src, 32, []byte("A's Write"))
	fill(t, p.A, src, 48, []byte("A's Send"))
	postRecv(t, p.B, 0, recvWR(50, inbox.SGE(0, 16)))
	resume := func() {}
	if pid := PeerPID(p.B); pid != 0 {
		cont, err := stopProcess(pid)
		if err != nil {
			t.Fatalf("stop B's process: %v", err)
		}
		defer cont()
		resume = cont
	}
	wrs := []verbs.SendWR{
		readWR(1, target, 0, src.SGE(0, len(readBytes))),
		writeWR(2, target, 32, src.SGE(32, 9)),
		sendWR(3, src.SGE(48, 8)),
	}
	if atomics {
		wrs = append(wrs, atomicWR(4, verbs.OpAtomicFetchAndAdd, target, sum, src.SGE(56, 8), 3, 0))
	}
	postSend(t, p.A, 0, wrs...)
	for i, wc := range wait(t, p.A, SendCQ, len(wrs)) {
		expectStatus(t, wc, uint64(i+1), verbs.WCSuccess)
	}
	expectState(t, p.A, 0, verbs.QPSRTS)
	expectBytes(t, p.A, src, 0, []byte(readBytes), "the Read from the silent peer")
	if atomics {
		expectBytes(t, p.A, src, 56, []byte{5, 0, 0, 0, 0, 0, 0, 0}, "the fetch-and-add's original value")
	}
	resume()
	expectRecvWC(t, waitOne(t, p.B, RecvCQ), 50, verbs.WCRecv, 8, p.B.QPNum(0))
	expectBytes(t, p.B, inbox, 0, []byte("A's Send"), "the Send to the silent peer")
	expectBytes(t, p.B, target, 32, []byte("A's Write"), "the Write to the silent peer")
	if atomics {
		expectBytes(t, p.B, target, sum, []byte{8, 0, 0, 0, 0, 0, 0, 0}, "the fetch-and-add's sum")
	}
}
