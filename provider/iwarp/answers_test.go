package iwarp_test

import (
	"testing"
	"time"

	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/verbs"
)

// Since a stream's messages go out each whole, a peer answers a Read
// only once the message it is sending is out: these tests check that the
// side waiting for the answer does not take that for a dead peer, and
// that a peer in SQD still answers.

// TestReadAnsweredDuringPeersLargeWrite: B writes to A while A reads 8
// bytes of B: the Read completes with success once B's Write is out, and
// so does the Write, though the Write lasts several of A's liveness
// periods (its QP's timeout times RetryCnt+1, 537 ms here), each of which
// would end the connection had nothing come from B during it. The test
// sends B's Write itself, a batch every 70 ms, so that the Write lasts
// six periods however fast the path is, and A hears from B many times a
// period however loaded the machine is. A Write sent at full speed lasts
// only a fraction of any period long enough to outlast a transmitter
// descheduled on two busy cores under -race, which is silence to A, as it
// would be to an InfiniBand QP.
func TestReadAnsweredDuringPeersLargeWrite(t *testing.T) {
	defer iwarp.SetMinUserTimeout(0)()
	const (
		timeout = 16                                                // 4.096 µs × 2^16: 268 ms
		retries = 1                                                 // RetryCnt
		period  = 4096 * time.Nanosecond << timeout * (retries + 1) // A's liveness period
		// Between two batches: a period over 7.618, so that A's checks,
		// a period apart, fall at ever other points between two
		// batches (a period of 8 batches had them fall at the same
		// point, and all of them could find a batch still in A's
		// socket, as if it were B's answer on its way).
		interval = period * 1000 / 7618
		rounds   = 46                 // batches of the Write: six periods
		size     = rounds * (2 << 20) // a batch: 2 MiB at most
		least    = 4 * period         // the Read's least wait for its answer
	)
	a, b, _, _ := connectPair(t, size, nil, nil)
	for _, step := range []struct {
		attr verbs.QPAttr
		mask verbs.QPAttrMask
	}{
		{verbs.QPAttr{State: verbs.QPSSQD}, verbs.QPAttrState},
		{verbs.QPAttr{State: verbs.QPSSQD, Timeout: timeout, RetryCnt: retries}, verbs.QPAttrState | verbs.QPAttrTimeout | verbs.QPAttrRetryCnt},
		{verbs.QPAttr{State: verbs.QPSRTS}, verbs.QPAttrState},
	} {
		if err := a.qp.Modify(&step.attr, step.mask); err != nil {
			t.Fatal(err)
		}
	}
	// B's transmitter is the test's until the Read is answered: B's
	// Write goes out a batch a round, and the Read Response after it.
	round, release := iwarp.HoldTx(b.qp.Driver())
	held := true
	defer func() {
		if held {
			release()
		}
	}()
	if _, err := b.qp.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{b.mr.SGE(0, size)}, RemoteAddr: a.mr.Addr(), RKey: a.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	// The pace is what the test is about: B talks, and answers
	// nothing, for several of A's liveness periods.
	tick := time.NewTicker(interval)
	defer tick.Stop()
	// The Write is under way once its first byte is placed at A (B's
	// transmitter sends nothing before A's RTR has come): the Read
	// Response will wait for its end.
	b.mr.Bytes()[0] = 0xab
	for n := 0; a.mr.Bytes()[0] != 0xab; a.cq.Poll(nil) {
		if n++; n > rounds {
			t.Fatalf("B's Write did not begin in %d rounds of its transmitter", rounds)
		}
		<-tick.C
		if _, stop := round(); stop {
			t.Fatal("B's transmitter stopped before its Write began: the connection ended")
		}
	}
	start := time.Now()
	if _, err := a.qp.PostSend([]verbs.SendWR{{WRID: 2, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{a.mr.SGE(0, 8)}, RemoteAddr: b.mr.Addr() + size - 8, RKey: b.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	wa := make([]verbs.WorkCompletion, 1)
	for n := 0; a.cq.Poll(wa) == 0; n++ {
		if n > 4*rounds {
			t.Fatalf("A's Read not answered after %d rounds of B's transmitter (%v)", n, time.Since(start))
		}
		<-tick.C
		if _, stop := round(); stop {
			t.Fatalf("B's transmitter stopped after %d rounds (%v): the connection ended", n, time.Since(start))
		}
	}
	took := time.Since(start)
	release()
	held = false
	wb := b.wait(t, 1)
	if wa[0].Status != verbs.WCSuccess || wb[0].Status != verbs.WCSuccess {
		t.Fatalf("A's Read completed %v after %v, B's Write %v; want both successes", wa[0].Status, took, wb[0].Status)
	}
	if took < least {
		t.Fatalf("A's Read was answered after %v, less than four liveness periods (%v each): the test proved nothing", took, period)
	}
}

// TestReadAnsweredWhilePeerInSQD: B moves to SQD while its large Write is
// partly sent, and still answers A's Read.
func TestReadAnsweredWhilePeerInSQD(t *testing.T) {
	const size = 256 << 20
	a, b, _, _ := connectPair(t, size, nil, nil)
	b.mr.Bytes()[0] = 0xab
	if _, err := b.qp.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{b.mr.SGE(0, size)}, RemoteAddr: a.mr.Addr(), RKey: a.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	// The Write has begun once its first byte is placed at A.
	for deadline := time.Now().Add(10 * time.Second); a.mr.Bytes()[0] != 0xab; a.cq.Poll(nil) {
		if time.Now().After(deadline) {
			t.Fatal("B's Write did not begin")
		}
	}
	if _, err := a.qp.PostSend([]verbs.SendWR{{WRID: 2, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{a.mr.SGE(8, 8)}, RemoteAddr: b.mr.Addr() + size - 8, RKey: b.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Modify(&verbs.QPAttr{State: verbs.QPSSQD}, verbs.QPAttrState); err != nil {
		t.Fatal(err)
	}
	if wa := a.wait(t, 1); wa[0].WRID != 2 || wa[0].Status != verbs.WCSuccess {
		t.Fatalf("A's Read while B is in SQD: %+v", wa[0])
	}
}

// TestSQDFinishesMessage: B moves to SQD while its large Write is partly
// sent. The Write goes out whole (DDP sends each message whole, and siw
// ends a stream that stops one to send another), EventSQDrained follows,
// and a Write posted in SQD waits for the move back to RTS.
func TestSQDFinishesMessage(t *testing.T) {
	const size = 64 << 20
	const big = size - 4096 // Write 1: [0, big); Write 2: 8 bytes at size-8
	a, b, _, _ := connectPair(t, size, nil, nil)
	mem := b.mr.Bytes()
	for i := range big {
		mem[i] = 0xab
	}
	copy(mem[size-8:], []byte{0xcd, 0xcd, 0xcd, 0xcd, 0xcd, 0xcd, 0xcd, 0xcd})
	if _, err := b.qp.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{b.mr.SGE(0, big)}, RemoteAddr: a.mr.Addr(), RKey: a.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	got := a.mr.Bytes()
	for deadline := time.Now().Add(10 * time.Second); got[0] != 0xab; a.cq.Poll(nil) {
		if time.Now().After(deadline) {
			t.Fatal("B's Write did not begin")
		}
	}
	if err := b.qp.Modify(&verbs.QPAttr{State: verbs.QPSSQD}, verbs.QPAttrState); err != nil {
		t.Fatal(err)
	}
	if _, err := b.qp.PostSend([]verbs.SendWR{{WRID: 2, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{b.mr.SGE(size-8, 8)}, RemoteAddr: a.mr.Addr() + size - 8, RKey: a.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	// The Write under way completes, all of it placed, while B stays in
	// SQD; the drain is reported.
	if wb := b.wait(t, 1); wb[0].WRID != 1 || wb[0].Status != verbs.WCSuccess {
		t.Fatalf("B's Write in SQD: %+v", wb[0])
	}
	if got[big-1] != 0xab {
		t.Fatal("B's Write completed and its last byte is not at A")
	}
	expectEvent(t, b.ctx, verbs.EventSQDrained)
	// Write 2, posted in SQD, has not gone: Write 1's confirmation came
	// back behind where it would have been in the stream.
	if got[size-8] != 0 {
		t.Fatal("a Write posted in SQD went out before the move back to RTS")
	}
	if err := b.qp.Modify(&verbs.QPAttr{State: verbs.QPSRTS}, verbs.QPAttrState); err != nil {
		t.Fatal(err)
	}
	if wb := b.wait(t, 1); wb[0].WRID != 2 || wb[0].Status != verbs.WCSuccess {
		t.Fatalf("B's Write after the move back to RTS: %+v", wb[0])
	}
	if got[size-8] != 0xcd {
		t.Fatal("B's second Write completed and its bytes are not at A")
	}
}
