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

// TestReadAnsweredDuringPeersLargeWrite: B writes 256 MiB to A while A
// reads 8 bytes of B, A's QP with a short timeout (17 ms, a tenth of the
// Write's time on loopback; the 2 ms it was failed a run of the whole
// suite with -race, B's transmitter descheduled that long on two busy
// cores, which is silence to A as it would be to an InfiniBand QP): the
// Read completes with success once B's Write is out, and so does the
// Write.
func TestReadAnsweredDuringPeersLargeWrite(t *testing.T) {
	defer iwarp.SetMinUserTimeout(0)()
	const size = 256 << 20
	a, b, _, _ := connectPair(t, size, nil, nil)
	for _, step := range []struct {
		attr verbs.QPAttr
		mask verbs.QPAttrMask
	}{
		{verbs.QPAttr{State: verbs.QPSSQD}, verbs.QPAttrState},
		{verbs.QPAttr{State: verbs.QPSSQD, Timeout: 12, RetryCnt: 1}, verbs.QPAttrState | verbs.QPAttrTimeout | verbs.QPAttrRetryCnt},
		{verbs.QPAttr{State: verbs.QPSRTS}, verbs.QPAttrState},
	} {
		if err := a.qp.Modify(&step.attr, step.mask); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.qp.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{b.mr.SGE(0, size)}, RemoteAddr: a.mr.Addr(), RKey: a.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.qp.PostSend([]verbs.SendWR{{WRID: 2, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{a.mr.SGE(0, 8)}, RemoteAddr: b.mr.Addr() + size - 8, RKey: b.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	wa, wb := a.wait(t, 1), b.wait(t, 1)
	if wa[0].Status != verbs.WCSuccess || wb[0].Status != verbs.WCSuccess {
		t.Fatalf("A's Read completed %v, B's Write %v; want both successes", wa[0].Status, wb[0].Status)
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
