package shm

import (
	"testing"
	"time"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// TestLastWQENotSuppressedByPeer: B's QP, on an SRQ, moves to the error
// state and stays there; its peer A writes the gen word of B's shared QP
// header (which A maps writable) before answering the fence that
// EventQPLastWQEReached waits for. The event still comes: what tells a
// Reset since is kept in B's own memory.
func TestLastWQENotSuppressedByPeer(t *testing.T) {
	h := verbstest.Harness{Device: DeviceName, Addr: func(testing.TB) string { return uniqueAddr("lastwqe-gen") }}
	p := h.NewPair(t, verbstest.PairOptions{SRQ: true})
	b := p.B.(*verbstest.Local)
	a := driverQP(p.A.QPs[0])
	bq := b.QPs[0]
	a.mu.Lock() // A's answer to B's fence waits for this
	if err := bq.Modify(&verbs.QPAttr{State: verbs.QPSErr}, verbs.QPAttrState); err != nil {
		a.mu.Unlock()
		t.Fatal(err)
	}
	a.conn.peerHdr.gen.Add(1) // the peer writes B's shared QP header
	a.mu.Unlock()
	if _, ok := b.WaitEvent(verbs.EventQPLastWQEReached, 10*time.Second); !ok {
		t.Fatal("no EventQPLastWQEReached for a QP that moved to the error state and stayed there: its peer wrote the header's gen")
	}
}
