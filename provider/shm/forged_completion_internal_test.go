package shm

import (
	"testing"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/driver"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// TestForgedReceiveCompletionsSanitized: a peer writes receive
// completions into this process's CQ ring, and may write anything. What
// Poll hands the application says only what a receive completion of
// shm0 can: a known status, a receive's opcode, the immediate and
// solicited flags alone, and for a success no more bytes than a message
// may have; anything else comes out failed, with no byte count.
func TestForgedReceiveCompletionsSanitized(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	bq := driverQP(p.B.(*verbstest.Local).QPs[0])
	aq := driverQP(p.A.QPs[0])
	ring := viewCQRing(connOf(bq).cqSeg.mem, aq.recvCQ.n) // the peer's view of A's receive CQ
	forged := []driver.WorkCompletion{
		{WRID: 1, Opcode: 77, ByteLen: 8, QPNum: aq.num},
		{WRID: 2, Opcode: driver.WCRecv, ByteLen: 0xffffffff, QPNum: aq.num},
		{WRID: 3, Opcode: driver.WCRecv, ByteLen: 8, QPNum: aq.num, Flags: driver.WCWithInv | 0x80, InvalidatedRKey: 5},
		{WRID: 4, Opcode: driver.WCRecv, Status: 200, QPNum: aq.num},
	}
	for i := range forged {
		if !ring.produce(&forged[i]) {
			t.Fatal("the ring is full")
		}
	}
	wc := make([]verbs.WorkCompletion, 8)
	if n := p.A.RecvCQ.Poll(wc); n != len(forged) {
		t.Fatalf("Poll returned %d completions, want %d", n, len(forged))
	}
	for i, w := range wc[:len(forged)] {
		if w.Opcode != verbs.WCRecv && w.Opcode != verbs.WCRecvRDMAWithImm {
			t.Errorf("completion %d: opcode %v", i, w.Opcode)
		}
		if w.Flags&^(verbs.WCWithImm|verbs.WCSolicited) != 0 || w.InvalidatedRKey != 0 {
			t.Errorf("completion %d: flags %v, invalidated key %#x", i, w.Flags, w.InvalidatedRKey)
		}
		if w.Status > verbs.WCGeneralErr {
			t.Errorf("completion %d: status %d", i, w.Status)
		}
	}
	for _, i := range []int{0, 1} {
		if wc[i].Status == verbs.WCSuccess || wc[i].ByteLen != 0 {
			t.Errorf("forged completion %d came out %+v; want a failure with no byte count", i, wc[i])
		}
	}
	if wc[2].Status != verbs.WCSuccess || wc[2].ByteLen != 8 || wc[2].Flags != 0 {
		t.Errorf("a plausible completion came out %+v; want a success of 8 bytes with no flags", wc[2])
	}
}
