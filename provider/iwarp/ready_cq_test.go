package iwarp_test

import (
	"context"
	"encoding/binary"
	"runtime"
	"testing"
	"time"

	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/verbs"
)

// A poller of a CQ shared by many QPs reads the connections that have
// received something only: one that stays idle is never read by it,
// every completion comes whoever reads it, one that receives after the
// polls stop is read by its receive goroutine, and a connection that
// ends leaves the CQ's ready set.
func TestSharedCQReadsReadyConnectionsOnly(t *testing.T) {
	const nQPs = iwarp.ManyQPs + 4
	qpCap := verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}
	a, b := openEnd(t, 256, false, qpCap, 4096), openEnd(t, 256, false, qpCap, 4096)
	aqps, bqps, aconns := connectMany(t, a, b, nQPs, 0, qpCap)
	wc := make([]verbs.WorkCompletion, 4)
	deadline := time.Now().Add(30 * time.Second)
	// waitOne polls a's CQ until it yields one completion.
	waitOne := func(what string) verbs.WorkCompletion {
		t.Helper()
		for a.cq.Poll(wc[:1]) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: no completion", what)
			}
		}
		return wc[0]
	}
	ready := func() int { return iwarp.ReadyConns(a.qp.Driver()) }

	// The first poll of the CQ registers every live connection, and a
	// connection that goes live later registers itself.
	for ready() != nQPs {
		if n := a.cq.Poll(wc); n != 0 {
			t.Fatalf("a completion from nowhere: %+v", wc[0])
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connections in the ready set, want %d", ready(), nQPs)
		}
		runtime.Gosched()
	}
	idle := []int{0, 1, 2, 4}
	rounds := make([]uint64, len(idle))
	for i, k := range idle {
		rounds[i] = iwarp.PollerRounds(aqps[k].Driver())
	}

	// Writes on one QP complete; the idle ones are not read.
	binary.NativeEndian.PutUint64(a.mr.Bytes(), 0x5ca1ab1e)
	for i := range 50 {
		if _, err := aqps[3].PostSend([]verbs.SendWR{{WRID: uint64(i), Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
			SGList: []verbs.SGE{a.mr.SGE(0, 8)}, RemoteAddr: b.mr.Addr() + 64, RKey: b.mr.RKey()}}); err != nil {
			t.Fatal(err)
		}
		if w := waitOne("write"); w.Status != verbs.WCSuccess || w.WRID != uint64(i) || w.QPNum != aqps[3].Num() {
			t.Fatalf("write completion %+v, want WR %d of QP %d", w, i, aqps[3].Num())
		}
	}
	if got := binary.NativeEndian.Uint64(b.mr.Bytes()[64:]); got != 0x5ca1ab1e {
		t.Fatalf("the Write placed %#x", got)
	}
	for i, k := range idle {
		if got := iwarp.PollerRounds(aqps[k].Driver()); got != rounds[i] {
			t.Fatalf("idle QP %d was read by pollers %d times", k, got-rounds[i])
		}
	}

	// A Send to an idle QP completes.
	if _, err := aqps[5].PostRecv([]verbs.RecvWR{{WRID: 55, SGList: []verbs.SGE{a.mr.SGE(128, 64)}}}); err != nil {
		t.Fatal(err)
	}
	copy(b.mr.Bytes()[256:], "to an idle connection")
	if _, err := bqps[5].PostSend([]verbs.SendWR{{WRID: 5, Opcode: verbs.OpSend, SGList: []verbs.SGE{b.mr.SGE(256, 21)}}}); err != nil {
		t.Fatal(err)
	}
	if w := waitOne("send"); w.Status != verbs.WCSuccess || w.WRID != 55 || w.QPNum != aqps[5].Num() || w.ByteLen != 21 {
		t.Fatalf("receive completion %+v, want WR 55 of QP %d, 21 bytes", w, aqps[5].Num())
	}
	if got := string(a.mr.Bytes()[128 : 128+21]); got != "to an idle connection" {
		t.Fatalf("received %q", got)
	}

	// A Send to a QP whose receive goroutine may be parked, taken by a
	// CQ.Wait (which arms the CQ, handing receiving back).
	if _, err := aqps[3].PostRecv([]verbs.RecvWR{{WRID: 34, SGList: []verbs.SGE{a.mr.SGE(512, 64)}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := bqps[3].PostSend([]verbs.SendWR{{WRID: 3, Opcode: verbs.OpSend, SGList: []verbs.SGE{b.mr.SGE(256, 21)}}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if n, err := a.cq.Wait(ctx, wc[:1]); err != nil || n != 1 || wc[0].Status != verbs.WCSuccess || wc[0].WRID != 34 {
		t.Fatalf("CQ.Wait for a Send: %d completions, %v, %+v; want WR 34", n, err, wc[0])
	}

	// Once the polls stop, a Send to the QP that was busy (its receive
	// goroutine parked while the CQ was polled) is received all the
	// same, with nobody polling.
	if _, err := aqps[3].PostRecv([]verbs.RecvWR{{WRID: 33, SGList: []verbs.SGE{a.mr.SGE(512, 64)}}}); err != nil {
		t.Fatal(err)
	}
	frames := iwarp.FramesReceived(aqps[3].Driver())
	if _, err := bqps[3].PostSend([]verbs.SendWR{{WRID: 3, Opcode: verbs.OpSend, SGList: []verbs.SGE{b.mr.SGE(256, 21)}}}); err != nil {
		t.Fatal(err)
	}
	tick := time.NewTicker(time.Millisecond)
	for iwarp.FramesReceived(aqps[3].Driver()) == frames {
		if time.Now().After(deadline) {
			t.Fatal("a Send to a QP whose CQ is no longer polled was not received")
		}
		<-tick.C
	}
	tick.Stop()
	if w := waitOne("send after the polls stopped"); w.Status != verbs.WCSuccess || w.WRID != 33 {
		t.Fatalf("receive completion %+v, want WR 33", w)
	}

	// A connection that ends leaves the ready set; its QP destroyed,
	// a post to it fails.
	for _, i := range []int{6, 7} {
		aconns[i].Close()
		if err := aqps[i].Destroy(); err != nil {
			t.Fatal(err)
		}
		if _, err := aqps[i].PostSend([]verbs.SendWR{{WRID: 7, Opcode: verbs.OpRDMAWrite,
			SGList: []verbs.SGE{a.mr.SGE(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}}); err == nil {
			t.Fatalf("a post to destroyed QP %d succeeded", i)
		}
	}
	if got := ready(); got != nQPs-2 {
		t.Fatalf("%d connections in the ready set after two ended, want %d", got, nQPs-2)
	}
}

// TestReadySetsCloseWithTheirCQs: the send CQ and the receive CQ of QPs
// many enough for each to keep a ready set register every connection,
// and once the connections end and the CQs are destroyed, no descriptor
// of theirs (the epoll instances) stays open.
func TestReadySetsCloseWithTheirCQs(t *testing.T) {
	const nQPs = iwarp.ManyQPs + 1
	round := func() {
		t.Run("CQs", func(t *testing.T) {
			v := newVictimN(t, 4, nQPs)
			for range nQPs {
				dialHostile(t, v, false, false, false)
			}
			wc := make([]verbs.WorkCompletion, 4)
			for _, cq := range []*verbs.CQ{v.e.SendCQ, v.e.RecvCQ} {
				if n := cq.Poll(wc); n != 0 {
					t.Fatalf("a completion from nowhere: %+v", wc[0])
				}
			}
			for i, qp := range v.e.QPs {
				if s, r := iwarp.ReadyConns(qp.Driver()), iwarp.ReadyConnsRecv(qp.Driver()); s != nQPs || r != nQPs {
					t.Fatalf("QP %d: %d connections in the send CQ's ready set and %d in the receive CQ's, want %d", i, s, r, nQPs)
				}
			}
		})
	}
	leavesNoDescriptor(t, "ready sets", 5, round)
}

// sharedPair is two ends of many connections, every QP of an end on its
// one CQ.
type sharedPair struct {
	a, b       *pairEnd
	aqps, bqps []*verbs.QP
}

// newSharedPair connects n QPs of a to n of b, b's region 8 bytes for
// each. Destroyed lists the QPs made on each end, beyond the n, and
// destroyed before connecting (their CQs have had more QPs than they
// keep).
func newSharedPair(t *testing.T, n, destroyed int) *sharedPair {
	t.Helper()
	qpCap := verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}
	a, b := openEnd(t, 256, false, qpCap, 4096), openEnd(t, 256, false, qpCap, 8*n)
	p := &sharedPair{a: a, b: b}
	p.aqps, p.bqps, _ = connectMany(t, a, b, n, destroyed, qpCap)
	return p
}

// write RDMA-Writes value from QP i of a into QP i's 8 bytes of b's
// region.
func (p *sharedPair) write(t *testing.T, i int, value uint64) {
	t.Helper()
	binary.NativeEndian.PutUint64(p.a.mr.Bytes(), value)
	if _, err := p.aqps[i].PostSend([]verbs.SendWR{{WRID: value, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{p.a.mr.SGE(0, 8)}, RemoteAddr: p.b.mr.Addr() + uint64(8*i), RKey: p.b.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
}

// complete polls a's CQ for the completion of the Write of value on QP i.
func (p *sharedPair) complete(t *testing.T, i int, value uint64) {
	t.Helper()
	wc := make([]verbs.WorkCompletion, 1)
	for deadline := time.Now().Add(20 * time.Second); p.a.cq.Poll(wc) == 0; {
		if time.Now().After(deadline) {
			t.Fatalf("no completion for the Write of %d on QP %d", value, i)
		}
	}
	if wc[0].Status != verbs.WCSuccess || wc[0].WRID != value || wc[0].QPNum != p.aqps[i].Num() {
		t.Fatalf("completion %+v, want a Write of %d on QP %d", wc[0], value, p.aqps[i].Num())
	}
}

// pass writes value through every QP in turn, each Write completed
// before the next.
func (p *sharedPair) pass(t *testing.T, value uint64) {
	t.Helper()
	for i := range p.aqps {
		p.write(t, i, value)
		p.complete(t, i, value)
	}
}

// goroutineRounds is the rounds b's receive goroutines have run.
func (p *sharedPair) goroutineRounds() (n uint64) {
	for _, qp := range p.bqps {
		n += iwarp.ReceiverRounds(qp.Driver())
	}
	return n
}

// A CQ shared by many QPs that no application polls receives through a
// receiver of its own: RDMA Writes spread over its connections in turn
// are placed and completed while the connections' receive goroutines,
// after their first round, stay parked instead of waking for each,
// whether the Writes come back to back or with gaps many times the time
// after which a CQ's polls are taken to have stopped.
func TestSharedCQReceiverServesConnectionsWithoutWakingEach(t *testing.T) {
	for _, c := range []struct {
		name string
		gap  time.Duration
	}{{"back to back", 0}, {"sparse", 5 * time.Millisecond}} {
		t.Run(c.name, func(t *testing.T) {
			t.Cleanup(iwarp.SetPollGrace(time.Millisecond))
			p := newSharedPair(t, iwarp.ManyQPs+4, 0)
			p.pass(t, 1)
			p.pass(t, 2) // every receive goroutine has run its round and parked
			before := p.goroutineRounds()
			passes := 40
			if c.gap > 0 {
				passes = 4
			}
			for v := range uint64(passes) {
				for i := range p.aqps {
					if c.gap > 0 {
						time.Sleep(c.gap) // the CQ's receiver goes back to waiting
					}
					p.write(t, i, 100+v)
					p.complete(t, i, 100+v)
				}
			}
			for i := range p.aqps {
				if got := binary.NativeEndian.Uint64(p.b.mr.Bytes()[8*i:]); got != uint64(100+passes-1) {
					t.Fatalf("QP %d's Writes left %d in place, want %d", i, got, 100+passes-1)
				}
			}
			if woke, writes := p.goroutineRounds()-before, uint64(passes*len(p.aqps)); woke > writes/8 {
				t.Fatalf("the receive goroutines ran %d rounds for %d Writes: want them parked while the CQ's receiver reads", woke, writes)
			}
		})
	}
}

// An application that polls a CQ of many QPs in bursts, with pauses
// longer than a pollGrace between them, keeps the connections' receive
// goroutines parked: while it polls, the CQ's receiver stands aside, and
// when the polls pause it reads for them. Handing every parked goroutine
// its socket back at each pause would wake each at its connection's next
// FPDU, a thousand goroutines for a thousand QPs.
func TestPollPausesLeaveReceiveGoroutinesParked(t *testing.T) {
	const grace = 2 * time.Millisecond
	t.Cleanup(iwarp.SetPollGrace(grace))
	p := newSharedPair(t, iwarp.ManyQPs+4, 0)
	p.pass(t, 1)
	p.pass(t, 2) // every receive goroutine has run its round and parked
	bq := p.bqps[0].Driver()
	wc := make([]verbs.WorkCompletion, 4)
	before := p.goroutineRounds()
	const bursts = 12
	for burst := range uint64(bursts) {
		// b's application polls while a writes through its QPs in turn,
		// until the CQ's receiver stands aside ...
		aside := false
		for i, deadline := 0, time.Now().Add(20*time.Second); !aside; i = (i + 1) % len(p.aqps) {
			if time.Now().After(deadline) {
				t.Fatal("the CQ's receiver never stood aside for the application polling its CQ")
			}
			p.write(t, i, 100+burst)
			for range 64 {
				p.b.cq.Poll(wc) // RDMA Writes complete nothing at b
				aside = aside || iwarp.CQReceiverAside(bq)
			}
			p.complete(t, i, 100+burst)
		}
		// ... then pauses while the receiver still stands aside, and a
		// writes through every QP once more, which the receiver reads.
		time.Sleep(4 * grace)
		p.pass(t, 200+burst)
	}
	if woke := p.goroutineRounds() - before; woke > uint64(len(p.aqps)) {
		t.Fatalf("the receive goroutines ran %d rounds over %d pauses of the polls of a CQ of %d QPs: want them parked while the CQ's receiver reads", woke, bursts, len(p.aqps))
	}
}

// What arrives while someone holds a connection's receiving without
// reading (a Dereg cutting a Read Response, revokeRead), and the CQ's
// receiver finds it held, is read once the holder lets go, though the
// connection's receive goroutine is parked and nothing more arrives.
func TestReceiveLeftToANonReadingHolderIsRead(t *testing.T) {
	t.Cleanup(iwarp.SetPollGrace(time.Second))
	p := newSharedPair(t, iwarp.ManyQPs+4, 0)
	p.pass(t, 1)
	p.pass(t, 2)
	const k = 3
	qp := p.bqps[k].Driver()
	release := iwarp.HoldReceiving(qp)
	p.write(t, k, 3)
	for deadline := time.Now().Add(20 * time.Second); !iwarp.ReceiveMissed(qp); {
		if time.Now().After(deadline) {
			release()
			t.Fatal("the CQ's receiver did not try the held connection")
		}
		runtime.Gosched()
	}
	release()
	p.complete(t, k, 3)
}

// A CQ that has had more than manyQPs QPs and keeps fewer is still read
// through its ready set by an application that polls it, and its
// receiver stands aside meanwhile.
func TestSharedCQReceiverStandsAsideWhenFewerQPsArePolled(t *testing.T) {
	t.Cleanup(iwarp.SetPollGrace(time.Second))
	p := newSharedPair(t, iwarp.ManyQPs, 1)
	stop, done := make(chan struct{}), make(chan struct{})
	go func() { // b's application busy-polls its CQ
		defer close(done)
		wc := make([]verbs.WorkCompletion, 4)
		for {
			select {
			case <-stop:
				return
			default:
				p.b.cq.Poll(wc)
			}
		}
	}()
	defer func() {
		close(stop)
		<-done
	}()
	p.pass(t, 1)
	// Once the receiver, woken by a Write, has seen the application
	// polling and stood aside, it stays aside while the polls go on.
	for v, deadline := uint64(2), time.Now().Add(20*time.Second); !iwarp.CQReceiverAside(p.bqps[0].Driver()); v++ {
		if time.Now().After(deadline) {
			t.Fatal("the CQ's receiver never stood aside for the application polling its CQ")
		}
		p.pass(t, v)
	}
	before := iwarp.CQReceiverRounds(p.bqps[0].Driver())
	const passes = 20
	for v := range uint64(passes) {
		p.pass(t, 100+v)
	}
	if rounds, writes := iwarp.CQReceiverRounds(p.bqps[0].Driver())-before, uint64(passes*len(p.aqps)); rounds > writes/8 {
		t.Fatalf("the CQ's receiver ran %d rounds for %d Writes while the application polled the CQ", rounds, writes)
	}
}

// An application's poll that finds the CQ's ready set held by another
// poller (its receiver, reading) counts as a poll all the same: a
// receiver that kept reading could otherwise keep the application's
// polls from ever counting, and never stand aside for them.
func TestPollThatFindsTheReadySetHeldCounts(t *testing.T) {
	t.Cleanup(iwarp.SetPollGrace(time.Second))
	p := newSharedPair(t, iwarp.ManyQPs+1, 0)
	p.pass(t, 1)
	bq := p.bqps[0].Driver()
	wc := make([]verbs.WorkCompletion, 4)
	release := iwarp.HoldReadySet(bq)
	before := iwarp.CQAppPollsSeen(bq)
	n := p.b.cq.Poll(wc)
	after := iwarp.CQAppPollsSeen(bq)
	release()
	if n != 0 {
		t.Fatalf("a completion from nowhere: %+v", wc[0])
	}
	if after == before {
		t.Fatal("an application's poll of a ready set another poller held was not counted")
	}
}

// An application that polled its CQ, then arms it and polls once more
// before it sleeps (as CQ.Wait does), is woken by a Send that arrives
// then: the CQ's receiver, which stood aside while the application
// polled, reads it rather than stand aside again for the last poll.
func TestArmedCQsReceiverReadsForTheSleepingApplication(t *testing.T) {
	const grace = 20 * time.Second // a receiver standing aside would read after this
	t.Cleanup(iwarp.SetPollGrace(grace))
	p := newSharedPair(t, 1, iwarp.ManyQPs)
	p.pass(t, 1)
	bq := p.bqps[0].Driver()
	wc := make([]verbs.WorkCompletion, 4)
	// pollOnce polls b's empty CQ until a poll has read its ready set.
	pollOnce := func() {
		t.Helper()
		for polls := iwarp.CQAppPolls(bq); iwarp.CQAppPolls(bq) == polls; {
			if n := p.b.cq.Poll(wc); n != 0 {
				t.Fatalf("a completion from nowhere: %+v", wc[0])
			}
		}
	}
	// b's application polls while Writes come: the receiver, woken by
	// one, finds the application polling and stands aside.
	for v, deadline := uint64(2), time.Now().Add(grace/4); !iwarp.CQReceiverAside(bq); v++ {
		if time.Now().After(deadline) {
			t.Fatal("the CQ's receiver did not stand aside for the application's polls")
		}
		pollOnce()
		p.write(t, 0, v)
		pollOnce()
		p.complete(t, 0, v)
	}
	// The application arms the CQ, which sends the receiver back to
	// reading; once it has read, the application polls once more and
	// sleeps.
	rounds := iwarp.CQReceiverRounds(bq)
	if err := p.b.cq.ReqNotify(false); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(grace / 4); iwarp.CQReceiverAside(bq) || iwarp.CQReceiverRounds(bq) == rounds; {
		if time.Now().After(deadline) {
			t.Fatal("ReqNotify did not send the CQ's receiver back to reading")
		}
		runtime.Gosched()
	}
	pollOnce()
	if _, err := p.bqps[0].PostRecv([]verbs.RecvWR{{WRID: 77, SGList: []verbs.SGE{p.b.mr.SGE(0, 8)}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.aqps[0].PostSend([]verbs.SendWR{{WRID: 78, Opcode: verbs.OpSend, SGList: []verbs.SGE{p.a.mr.SGE(0, 8)}}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.b.cq.Notify():
	case <-time.After(grace / 2):
		t.Fatalf("a Send to an application asleep on its armed CQ was not received within %v (the receiver aside: %v)", grace/2, iwarp.CQReceiverAside(bq))
	}
	if n := p.b.cq.Poll(wc); n != 1 || wc[0].WRID != 77 || wc[0].Status != verbs.WCSuccess {
		t.Fatalf("after the notification: %d completions, %+v; want the receive of WR 77", n, wc[0])
	}
}

// An application that arms its CQ once and then goes on polling it has
// the CQ's receiver stand aside all the same, a pollGrace after the arm.
func TestArmedCQsReceiverStandsAsideForAnApplicationThatPolls(t *testing.T) {
	t.Cleanup(iwarp.SetPollGrace(2 * time.Millisecond))
	p := newSharedPair(t, 1, iwarp.ManyQPs)
	p.pass(t, 1)
	bq := p.bqps[0].Driver()
	if err := p.b.cq.ReqNotify(false); err != nil {
		t.Fatal(err)
	}
	wc := make([]verbs.WorkCompletion, 4)
	for v, deadline := uint64(2), time.Now().Add(20*time.Second); !iwarp.CQReceiverAside(bq); v++ {
		if time.Now().After(deadline) {
			t.Fatal("the CQ's receiver never stood aside for the application polling its CQ")
		}
		p.write(t, 0, v)
		for range 64 {
			p.b.cq.Poll(wc) // RDMA Writes complete nothing at b: the arm stays
		}
		p.complete(t, 0, v)
	}
}
