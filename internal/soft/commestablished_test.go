package soft

import (
	"sync"
	"testing"

	"github.com/goverbs/goverbs/verbs/driver"
)

// commEsts drains events and counts the EventCommEst about ctx in it.
func commEsts(t *testing.T, events EventQueue, ctx any) int {
	t.Helper()
	n := 0
	for {
		select {
		case ev := <-events.Events():
			if ev.Type != driver.EventCommEst || ev.Element != ctx {
				t.Fatalf("unexpected event %v about %v", ev.Type, ev.Element)
			}
			n++
		default:
			return n
		}
	}
}

// TestRequestArrivedRaisesCommEstOncePerRTR: the first request that
// reaches a QP in RTR raises EventCommEst, later ones do not; none is
// raised before RTR or in RTS; a reset QP brought to RTR again raises
// it anew. RequestArrived reports the QP settled once nothing more can
// raise it.
func TestRequestArrivedRaisesCommEstOncePerRTR(t *testing.T) {
	var (
		mu        sync.Mutex
		attr      driver.QPAttr
		destroyed bool
		pending   bool
		q         QP
	)
	r := &recorder{state: &attr}
	q.Init(5, &mu, r, r, &attr, &destroyed, &pending, nil)
	events := NewEventQueue()
	const ctx = "qp 5"
	move := func(step func() (driver.QPAttr, driver.QPAttrMask)) {
		t.Helper()
		a, m := step()
		if err := q.Modify(&a, m); err != nil {
			t.Fatalf("modify to %v: %v", a.State, err)
		}
	}
	arrive := func(wantSettled bool, wantEvents int) {
		t.Helper()
		if settled := q.RequestArrived(events, ctx); settled != wantSettled {
			t.Fatalf("in %v: RequestArrived reported settled %v, want %v", attr.State, settled, wantSettled)
		}
		if n := commEsts(t, events, ctx); n != wantEvents {
			t.Fatalf("in %v: %d EventCommEst, want %d", attr.State, n, wantEvents)
		}
	}
	reset := func() (driver.QPAttr, driver.QPAttrMask) {
		return driver.QPAttr{State: driver.QPSReset}, driver.QPAttrState
	}
	for range 2 {
		arrive(false, 0) // Reset
		move(toInit)
		arrive(false, 0)
		move(toRTR)
		arrive(true, 1)
		arrive(true, 0)
		move(toRTS)
		arrive(true, 0)
		move(reset)
	}
	// A QP connected straight through to RTS raises none.
	move(toInit)
	move(toRTR)
	move(toRTS)
	arrive(true, 0)
}
