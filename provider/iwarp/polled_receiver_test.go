package iwarp_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/verbs"
)

// While an application polls a QP's CQ, the connection's receive
// goroutine runs no rounds of its own: each would contend with the
// poller for the socket, and its wake-ups take a processor from busy
// pollers. Once the polls stop, it takes receiving back.
func TestReceiverStaysOffWhilePolled(t *testing.T) {
	const grace = 20 * time.Millisecond
	t.Cleanup(iwarp.SetPollGrace(grace)) // first: it runs after the pair's cleanups
	p := newBenchPair(t, 1<<16)
	a, b := p.a, p.b
	send := func() {
		t.Helper()
		if _, err := a.qp.PostRecv(a.recv); err != nil {
			t.Fatal(err)
		}
		if _, err := b.qp.PostSend([]verbs.SendWR{{Opcode: verbs.OpSend, SGList: []verbs.SGE{b.mr.SGE(0, 64)}}}); err != nil {
			t.Fatal(err)
		}
	}
	// A message received by polling; then the receive goroutine is
	// kicked into a round, as a poller that leaves it the rest of a
	// long train does, and finds the application polling.
	send()
	for a.rcq.Poll(a.wc[:1]) == 0 {
	}
	if a.wc[0].Status != verbs.WCSuccess {
		t.Fatalf("receive: %+v", a.wc[0])
	}
	a.rcq.Poll(nil)
	dq := a.qp.Driver()
	before := iwarp.ReceiverRounds(dq)
	iwarp.KickReceiver(dq)
	// Ten grace periods of polls.
	for end := time.Now().Add(10 * grace); time.Now().Before(end); {
		if a.rcq.Poll(a.wc[:1]) != 0 {
			t.Fatalf("a completion from nowhere: %+v", a.wc[0])
		}
	}
	// The kicked round; a poller descheduled for a whole grace period
	// lets the goroutine run another, as it should; ten would be one a
	// period.
	if n := iwarp.ReceiverRounds(dq) - before; n >= 5 {
		t.Fatalf("the receive goroutine ran %d rounds in 10 grace periods of polls", n)
	}
	// The polls stop: the next message is received all the same.
	frames := iwarp.FramesReceived(dq)
	send()
	for start := time.Now(); iwarp.FramesReceived(dq) == frames; runtime.Gosched() {
		if time.Since(start) > 10*time.Second {
			t.Fatal("nobody received the message sent after the polls stopped")
		}
	}
	for a.rcq.Poll(a.wc[:1]) == 0 {
	}
	if a.wc[0].Status != verbs.WCSuccess || a.wc[0].ByteLen != 64 {
		t.Fatalf("receive: %+v", a.wc[0])
	}
}
