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
// reads 8 bytes of B, A's QP with a short timeout: the Read completes
// with success once B's Write is out, and so does the Write.
func TestReadAnsweredDuringPeersLargeWrite(t *testing.T) {
	defer iwarp.SetMinUserTimeout(0)()
	const size = 256 << 20
	a, b, _, _ := connectPair(t, size, nil, nil)
	for _, step := range []struct {
		attr verbs.QPAttr
		mask verbs.QPAttrMask
	}{
		{verbs.QPAttr{State: verbs.QPSSQD}, verbs.QPAttrState},
		{verbs.QPAttr{State: verbs.QPSSQD, Timeout: 9, RetryCnt: 1}, verbs.QPAttrState | verbs.QPAttrTimeout | verbs.QPAttrRetryCnt},
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
