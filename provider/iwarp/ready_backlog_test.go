package iwarp_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/provider/iwarp/wire"
	"github.com/goverbs/goverbs/verbs"
)

// A backlog longer than a poll and a round of the receive goroutine read
// together, left in the socket of one of a CQ's many connections, is read
// whole while the application polls the CQ without pause: the CQ's ready
// set reports a socket once per arrival, not while it stays readable, so
// what a poll leaves to the receive goroutine must not wait for the polls
// to stop. (The polls never stop here: the grace after which they count
// as stopped is longer than the test.)
func TestBacklogReadWhileCQPolled(t *testing.T) {
	t.Cleanup(iwarp.SetPollGrace(time.Hour)) // runs once the connections are gone
	const nQPs = iwarp.ManyQPs + 1
	v := newVictimN(t, 4, nQPs)
	hs := make([]*hostile, nQPs)
	for i := range hs {
		hs[i] = dialHostile(t, v, false, false, false)
	}
	wc := make([]verbs.WorkCompletion, 4)
	// Polls register the connections in the ready sets and park the
	// receive goroutines.
	for range 1000 {
		if n := v.e.RecvCQ.Poll(wc); n != 0 {
			t.Fatalf("a completion from nowhere: %+v", wc[0])
		}
	}
	if n, err := v.e.PostRecv(0, []verbs.RecvWR{{WRID: 77}}); n != 1 {
		t.Fatalf("post receive: %v", err)
	}
	h := hs[0]
	backlog := bytes.Repeat(h.write(0, 0, nil), 16*(iwarp.PollBudget+1024))
	backlog = append(backlog, h.fpdu(h.untagged(wire.OpSend, wire.QNSend, 0), nil)...)
	sent := make(chan error, 1)
	go func() {
		_, err := h.nc.Write(backlog)
		sent <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for v.e.RecvCQ.Poll(wc[:1]) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the Send behind %d zero-length Writes did not complete while the CQ was polled (%d FPDUs received)",
				16*(iwarp.PollBudget+1024), iwarp.FramesReceived(v.e.QPs[0].Driver()))
		}
	}
	if err := <-sent; err != nil {
		t.Fatalf("hostile write: %v", err)
	}
	if wc[0].Status != verbs.WCSuccess || wc[0].WRID != 77 {
		t.Fatalf("receive completion %+v, want WR 77 succeeded", wc[0])
	}
}

// A connection that starts after the polls of its CQ have stopped is
// read by its receive goroutine with nobody polling: it stands aside for
// polls that come after it started only. (Polls that stopped count as
// stopped only after a grace longer than the test.)
func TestConnectionAfterPollsStopReadAlone(t *testing.T) {
	t.Cleanup(iwarp.SetPollGrace(time.Hour)) // runs once the connections are gone
	const nQPs = iwarp.ManyQPs + 1
	v := newVictimN(t, 4, nQPs)
	for range nQPs - 1 {
		dialHostile(t, v, false, false, false)
	}
	wc := make([]verbs.WorkCompletion, 4)
	for range 100 {
		if n := v.e.RecvCQ.Poll(wc); n != 0 {
			t.Fatalf("a completion from nowhere: %+v", wc[0])
		}
	}
	h := dialHostile(t, v, false, false, false)
	q := v.e.QPs[nQPs-1]
	if n, err := v.e.PostRecv(nQPs-1, []verbs.RecvWR{{WRID: 9}}); n != 1 {
		t.Fatalf("post receive: %v", err)
	}
	frames := iwarp.FramesReceived(q.Driver())
	h.send(h.fpdu(h.untagged(wire.OpSend, wire.QNSend, 0), nil))
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(20 * time.Second)
	for iwarp.FramesReceived(q.Driver()) == frames {
		if time.Now().After(deadline) {
			t.Fatal("a Send to a connection that started after the polls stopped was not received")
		}
		<-tick.C
	}
	for v.e.RecvCQ.Poll(wc[:1]) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the Send received makes no completion")
		}
	}
	if wc[0].Status != verbs.WCSuccess || wc[0].WRID != 9 {
		t.Fatalf("receive completion %+v, want WR 9 succeeded", wc[0])
	}
}
