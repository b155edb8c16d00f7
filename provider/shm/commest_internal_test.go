package shm

import (
	"testing"
	"time"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// TestCommEstFloodRaisesOnce: a peer that says over and over that its
// first request has reached the QP held in RTR (msgCommEst, with no
// request at all) gets EventCommEst raised once: a lie costs the QP's
// owner at most the one event, and fills no event queue.
func TestCommEstFloodRaisesOnce(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{HoldRTR: true})
	aq := driverQP(p.A.QPs[0])
	aq.mu.Lock()
	c := aq.conn
	aq.mu.Unlock()
	for range 1000 {
		c.sendCtrl(msgCommEst, 0, 0)
	}
	// The peer handles its control messages in order: once the
	// disconnect behind the flood has moved its QP to the error state,
	// it has handled every msgCommEst.
	c.sendCtrl(msgDisc, 0, 0)
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		s, err := p.B.QPState(0)
		if err == nil && s == verbs.QPSErr {
			break
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			t.Fatalf("B's QP is in %v (error %v) 10 s after its peer's disconnect, want ERR", s, err)
		}
	}
	if _, ok, err := p.B.QPEvent(verbs.EventCommEst, 10*time.Second); err != nil || !ok {
		t.Fatalf("no %q on B after its peer's msgCommEst (error %v)", verbs.EventCommEst, err)
	}
	if qp, ok, err := p.B.QPEvent(verbs.EventCommEst, 100*time.Millisecond); err != nil || ok {
		t.Fatalf("a second %q on B, naming QP %d (error %v), for 1000 msgCommEst", verbs.EventCommEst, qp, err)
	}
}
