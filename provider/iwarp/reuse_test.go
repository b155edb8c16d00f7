package iwarp_test

import (
	"context"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/verbs"
)

// TestResetLetsEndedConnectionsGo: a QP reset and connected again many
// times keeps no more than the connection it had last for Destroy to
// wait for; the ones that ended before are let go (a QP kept every one,
// with its buffers, until Destroy).
func TestResetLetsEndedConnectionsGo(t *testing.T) {
	a, b := newBenchEnd(t, 4096), newBenchEnd(t, 4096)
	reset := func(q *verbs.QP) {
		for _, st := range []verbs.QPState{verbs.QPSErr, verbs.QPSReset} {
			if err := q.Modify(&verbs.QPAttr{State: st}, verbs.QPAttrState); err != nil {
				t.Fatal(err)
			}
		}
	}
	for range 20 {
		l, err := cm.Listen("tcp://127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		accepted := make(chan *cm.Conn, 1)
		go func() {
			var c *cm.Conn
			if req, err := l.Accept(context.Background()); err == nil {
				c, _ = req.Accept(b.qp, nil)
			}
			accepted <- c
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ca, err := cm.Dial(ctx, l.Addr(), a.qp, nil)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		cb := <-accepted
		l.Close()
		if cb == nil {
			t.Fatal("no accepted connection")
		}
		ca.Close()
		cb.Close()
		reset(a.qp)
		reset(b.qp)
	}
	for _, q := range []*verbs.QP{a.qp, b.qp} {
		if n := iwarp.RetainedConns(q.Driver()); n > 1 {
			t.Errorf("QP %d keeps %d ended connections after 20 resets", q.Num(), n)
		}
	}
}

// TestAcceptKnowsPeerQP: a goverbs initiator tells its QP number in its
// RTR, which comes at once: by the time Accept returns, the accepting
// QP's DestQPNum names it.
func TestAcceptKnowsPeerQP(t *testing.T) {
	p := newBenchPair(t, 4096)
	a, err := p.b.qp.Query()
	if err != nil {
		t.Fatal(err)
	}
	if a.DestQPNum != p.a.qp.Num() {
		t.Errorf("the accepting QP's DestQPNum is %d, want the initiator's %d", a.DestQPNum, p.a.qp.Num())
	}
}
