package iwarp_test

import (
	"testing"
	"time"

	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/verbs"
)

// TestConnectionsBetweenTransmitsHoldNoBatch: a connection holds a
// transmit batch only while its transmitter builds and writes one, so
// that many connections cost one batch per transmitter at work rather
// than one each. Every QP of both sides sends a Write and a Read at once
// (the target side answers each Read with a Read Response of its own
// batch); once every WR has completed, no connection of either side
// holds a batch.
func TestConnectionsBetweenTransmitsHoldNoBatch(t *testing.T) {
	const nQPs = 16
	qpCap := verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}
	a, b := openEnd(t, 4*nQPs, false, qpCap, 4096), openEnd(t, 4*nQPs, false, qpCap, 4096)
	aqs, bqs, _ := connectMany(t, a, b, nQPs, 0, qpCap)
	copy(b.mr.Bytes()[64:], "read me")
	for i, q := range aqs {
		wrs := []verbs.SendWR{
			{WRID: uint64(2 * i), Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
				SGList: []verbs.SGE{a.mr.SGE(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()},
			{WRID: uint64(2*i + 1), Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
				SGList: []verbs.SGE{a.mr.SGE(64+8*i, 7)}, RemoteAddr: b.mr.Addr() + 64, RKey: b.mr.RKey()},
		}
		if _, err := q.PostSend(wrs); err != nil {
			t.Fatal(err)
		}
	}
	wc := make([]verbs.WorkCompletion, 2*nQPs)
	deadline := time.Now().Add(10 * time.Second)
	for done := 0; done < 2*nQPs; {
		n := a.cq.Poll(wc)
		for _, w := range wc[:n] {
			if w.Status != verbs.WCSuccess {
				t.Fatalf("WR %d completed with %v", w.WRID, w.Status)
			}
		}
		done += n
		if n == 0 && time.Now().After(deadline) {
			t.Fatalf("%d of %d WRs completed in 10 s", done, 2*nQPs)
		}
	}
	for i := range nQPs {
		if got := string(a.mr.Bytes()[64+8*i : 64+8*i+7]); got != "read me" {
			t.Fatalf("Read %d placed %q", i, got)
		}
	}
	for side, qps := range map[string][]*verbs.QP{"requesting": aqs, "responding": bqs} {
		for i, q := range qps {
			holds, ok := iwarp.HoldsBatch(q.Driver())
			if !ok {
				t.Fatalf("the %s side's QP %d has no connection", side, i)
			}
			if holds {
				t.Errorf("the %s side's QP %d holds a transmit batch with nothing to send", side, i)
			}
		}
	}
}
