package verbstest

import (
	"fmt"
	"testing"
	"time"

	"github.com/goverbs/goverbs/verbs"
)

// rnrPair makes a pair with the RNR retry count and timer given.
func rnrPair(t *testing.T, h Harness, retry uint8, timer verbs.RNRTimer) *Pair {
	return h.NewPair(t, PairOptions{RNRRetry: retry, RNRRetrySet: true, MinRNRTimer: timer})
}

// expectNoRNRRetry checks the declared behaviour of a device without
// CapRNRRetry (iWARP): a Send that finds no posted receive fails at the
// sender with an error that is not a flush, and both QPs reach the error
// state.
func expectNoRNRRetry(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	src := newRegion(t, p.A, 16, localRW)
	wc := do(t, p, sendWR(1, src.SGE(0, 16)))
	if wc.Status == verbs.WCSuccess || wc.Status == verbs.WCWRFlushErr {
		t.Fatalf("Send with no receive posted on a device without RNR retry: completion %s, want an error other than a flush", fmtWC(wc))
	}
	expectState(t, p.A, 0, verbs.QPSErr)
	expectState(t, p.B, 0, verbs.QPSErr)
}

// testRNRRetryExceeded: with RNRRetry 0 to 6 and no receive ever posted,
// a Send completes with WCRNRRetryExcErr and the sender's QP moves to the
// error state.
func testRNRRetryExceeded(t *testing.T, h Harness) {
	if !deviceAttr(t, h).Has(verbs.CapRNRRetry) {
		expectNoRNRRetry(t, h)
		return
	}
	for retry := range uint8(verbs.RNRRetryInfinite) {
		t.Run(fmt.Sprintf("RNRRetry=%d", retry), func(t *testing.T) {
			p := rnrPair(t, h, retry, 1)
			src := newRegion(t, p.A, 16, localRW)
			expectStatus(t, do(t, p, sendWR(1, src.SGE(0, 16))), 1, verbs.WCRNRRetryExcErr)
			expectState(t, p.A, 0, verbs.QPSErr)
			expectFlushAfterError(t, p.A, 0)
		})
	}
}

// testRNRRetryTimer: a Send that meets no receive is retried no sooner
// than every MinRNRTimer, so RNRRetry retries take at least RNRRetry
// timer periods before WCRNRRetryExcErr.
func testRNRRetryTimer(t *testing.T, h Harness) {
	const retry, timer = 3, verbs.RNRTimer(16) // 2.56 ms
	p := rnrPair(t, h, retry, timer)
	if !p.A.Attr().Has(verbs.CapRNRRetry) {
		skip(t, "no CapRNRRetry (RNR/RetryExceeded checks the declared behaviour)")
	}
	src := newRegion(t, p.A, 16, localRW)
	start := time.Now()
	expectStatus(t, do(t, p, sendWR(1, src.SGE(0, 16))), 1, verbs.WCRNRRetryExcErr)
	if took, least := time.Since(start), retry*timer.Duration(); took < least {
		t.Fatalf("%d RNR retries %v apart took %v, want at least %v", retry, timer.Duration(), took, least)
	}
}

// testRNRRetryForever: with RNRRetry 7 a Send posted before any receive
// is retried until the receive is posted, then delivered.
func testRNRRetryForever(t *testing.T, h Harness) {
	p := rnrPair(t, h, verbs.RNRRetryInfinite, 1)
	if !p.A.Attr().Has(verbs.CapRNRRetry) {
		expectNoRNRRetry(t, h)
		return
	}
	src := newRegion(t, p.A, 16, localRW)
	fill(t, p.A, src, 0, pattern(8, 16))
	dst := newRegion(t, p.B, 16, localRW)
	postSend(t, p.A, 0, sendWR(1, src.SGE(0, 16)))
	// Far longer than 7 retries of MinRNRTimer: a finite count would run out.
	expectQuiet(t, p.A, SendCQ, "a Send retried forever completed before a receive was posted")
	expectEmpty(t, p.B, RecvCQ)
	postRecv(t, p.B, 0, recvWR(9, dst.SGE(0, 16)))
	expectSendWC(t, waitOne(t, p.A, SendCQ), 1, verbs.WCSend, p.A.QPNum(0))
	expectRecvWC(t, waitOne(t, p.B, RecvCQ), 9, verbs.WCRecv, 16, p.B.QPNum(0))
	expectBytes(t, p.B, dst, 0, pattern(8, 16), "message delivered after RNR retries")
}

// testRNRDrain: a Send retrying receiver-not-ready when its QP moves to
// SQD is under way: it goes on being retried, EventSQDrained waits until
// it has completed, and a Send posted in SQD waits for the move back to
// RTS.
func testRNRDrain(t *testing.T, h Harness) {
	p := rnrPair(t, h, verbs.RNRRetryInfinite, 1)
	if !p.A.Attr().Has(verbs.CapRNRRetry) {
		skip(t, "no CapRNRRetry")
	}
	if !p.A.Attr().Has(verbs.CapSQD) {
		skip(t, "no CapSQD")
	}
	src := newRegion(t, p.A, 32, localRW)
	fill(t, p.A, src, 0, pattern(8, 32))
	dst := newRegion(t, p.B, 32, localRW)
	postSend(t, p.A, 0, sendWR(1, src.SGE(0, 16)))
	qp := p.A.QPs[0]
	if err := qp.Modify(&verbs.QPAttr{State: verbs.QPSSQD}, verbs.QPAttrState); err != nil {
		t.Fatalf("move to SQD: %v", err)
	}
	postSend(t, p.A, 0, sendWR(2, src.SGE(16, 16)))
	if _, ok := p.A.WaitEvent(verbs.EventSQDrained, shortWait); ok {
		t.Fatal("EventSQDrained while a Send retried receiver-not-ready")
	}
	postRecv(t, p.B, 0, recvWR(9, dst.SGE(0, 16)), recvWR(10, dst.SGE(16, 16)))
	expectSendWC(t, waitOne(t, p.A, SendCQ), 1, verbs.WCSend, p.A.QPNum(0))
	expectRecvWC(t, waitOne(t, p.B, RecvCQ), 9, verbs.WCRecv, 16, p.B.QPNum(0))
	if _, ok := p.A.WaitEvent(verbs.EventSQDrained, timeout); !ok {
		t.Fatal("no EventSQDrained once the retried Send completed")
	}
	expectQuiet(t, p.B, RecvCQ, "a Send posted in SQD arrived before the move back to RTS")
	if err := qp.Modify(&verbs.QPAttr{State: verbs.QPSRTS}, verbs.QPAttrState); err != nil {
		t.Fatalf("move back to RTS: %v", err)
	}
	expectSendWC(t, waitOne(t, p.A, SendCQ), 2, verbs.WCSend, p.A.QPNum(0))
	expectRecvWC(t, waitOne(t, p.B, RecvCQ), 10, verbs.WCRecv, 16, p.B.QPNum(0))
	expectBytes(t, p.B, dst, 0, pattern(8, 32), "both messages")
}
