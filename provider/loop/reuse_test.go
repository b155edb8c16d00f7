package loop_test

import (
	"testing"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// A QP reset and connected again belongs to its new connection alone:
// the old connection and the old peer no longer reach it.

// newSide is a fresh end: a loop0 QP with its PD and CQ.
func newSide(t *testing.T) *verbstest.Side { return verbstest.NewSide(t, "loop0", 16) }

// resetQP moves q to the error state and then to Reset, and polls what
// that flushed.
func resetQP(t *testing.T, s *verbstest.Side) {
	t.Helper()
	for _, st := range []verbs.QPState{verbs.QPSErr, verbs.QPSReset} {
		if err := s.QP.Modify(&verbs.QPAttr{State: st}, verbs.QPAttrState); err != nil {
			t.Fatal(err)
		}
	}
	for s.CQ.Poll(make([]verbs.WorkCompletion, 64)) > 0 {
	}
}

// TestResetQPLeavesItsOldConnection: a server QP that failed with one
// client is reset and accepts another; the first client closing its old
// connection leaves the server's QP, and its new connection, alone.
func TestResetQPLeavesItsOldConnection(t *testing.T) {
	srv, c1, c2 := newSide(t), newSide(t), newSide(t)
	_, old := verbstest.Connect(t, "loop://reuse-link-1", srv.QP, c1.QP)
	resetQP(t, srv)
	now, _ := verbstest.Connect(t, "loop://reuse-link-2", srv.QP, c2.QP)
	old.Close()
	if s := srv.QP.State(); s != verbs.QPSRTS {
		t.Fatalf("the first client's disconnect moved the server QP, now the second's, to %v", s)
	}
	select {
	case <-now.Done():
		t.Fatal("the first client's disconnect ended the second's connection")
	default:
	}
}

// TestStalePeerCannotReachReusedQP: a QP reset and connected to another
// peer takes nothing from its old peer: the old peer's Send fails (its
// QP was moved to the error state when Y's reset ended their cm
// connection), and nothing is placed.
func TestStalePeerCannotReachReusedQP(t *testing.T) {
	y, x, z := newSide(t), newSide(t), newSide(t)
	verbstest.Connect(t, "loop://reuse-peer-1", y.QP, x.QP)
	resetQP(t, y)
	verbstest.Connect(t, "loop://reuse-peer-2", y.QP, z.QP)
	expectStaleSendRefused(t, x, y)
}

// connectByHand moves q to RTS connected to peer, with Modify alone, as
// an application that exchanged QP numbers out of band does.
func connectByHand(t *testing.T, q, peer *verbs.QP) {
	t.Helper()
	steps := []struct {
		attr verbs.QPAttr
		mask verbs.QPAttrMask
	}{
		{verbs.QPAttr{State: verbs.QPSInit, Port: 1, AccessFlags: verbs.AccessLocalWrite | verbs.RemoteAccess},
			verbs.QPAttrState | verbs.QPAttrPort | verbs.QPAttrAccessFlags},
		{verbs.QPAttr{State: verbs.QPSRTR, PathMTU: verbs.MTU4096, DestQPNum: peer.Num()},
			verbs.QPAttrState | verbs.QPAttrPathMTU | verbs.QPAttrDestQPN | verbs.QPAttrRQPSN | verbs.QPAttrMaxDestRdAtomic | verbs.QPAttrMinRNRTimer},
		{verbs.QPAttr{State: verbs.QPSRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7},
			verbs.QPAttrState | verbs.QPAttrSQPSN | verbs.QPAttrTimeout | verbs.QPAttrRetryCnt | verbs.QPAttrRNRRetry | verbs.QPAttrMaxQPRdAtomic},
	}
	for _, s := range steps {
		if err := q.Modify(&s.attr, s.mask); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStaleRequesterByHand: QPs connected with Modify alone, no cm link
// to break: Y, reset and connected to Z, takes nothing from X, which
// still names it.
func TestStaleRequesterByHand(t *testing.T) {
	y, x, z := newSide(t), newSide(t), newSide(t)
	connectByHand(t, x.QP, y.QP)
	connectByHand(t, y.QP, x.QP)
	resetQP(t, y)
	connectByHand(t, y.QP, z.QP)
	connectByHand(t, z.QP, y.QP)
	expectStaleSendRefused(t, x, y)
}

// expectStaleSendRefused posts a receive on y, now connected elsewhere,
// and a Send from x, its old peer: y takes nothing, and x's Send fails
// with retries exceeded, as RC's checks of QP number and PSN would have
// it.
func expectStaleSendRefused(t *testing.T, x, y *verbstest.Side) {
	t.Helper()
	rbuf, err := y.PD.AllocMR(64, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := y.QP.PostRecv([]verbs.RecvWR{{WRID: 7, SGList: []verbs.SGE{rbuf.SGE(0, 64)}}}); err != nil {
		t.Fatal(err)
	}
	sbuf, err := x.PD.AllocMR(8, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	copy(sbuf.Bytes(), "STALE!!!")
	x.QP.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{sbuf.SGE(0, 8)}}})
	wc := make([]verbs.WorkCompletion, 1)
	if y.CQ.Poll(wc) == 1 {
		t.Fatalf("the QP, now connected elsewhere, took its old peer's Send: %+v, %q", wc[0], rbuf.Bytes()[:8])
	}
	if x.CQ.Poll(wc) == 1 && wc[0].Status == verbs.WCSuccess {
		t.Fatal("the old peer's Send to a QP now connected elsewhere succeeded")
	}
}
