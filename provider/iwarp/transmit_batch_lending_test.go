package iwarp_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/verbs"
)

// TestConnectionsBetweenTransmitsHoldNoBatch: a connection holds a
// transmit batch only while its transmitter builds and writes one, so
// that many connections cost one batch per transmitter at work rather
// than one each, and batches that pass from one connection to another
// carry nothing of the last. Every QP of the requesting side posts, all
// at once, a list of a Write and a Read (through its send queue), and
// once those have completed a Write alone (the short road of a single
// WR to an idle queue); the responding side
// answers each Read with a Read Response from a batch of its own. Each
// QP moves bytes of its own, which land where that QP sent them; once
// every WR has completed, no connection of either side holds a batch.
func TestConnectionsBetweenTransmitsHoldNoBatch(t *testing.T) {
	const nQPs = 16
	qpCap := verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}
	a, b := openEnd(t, 4*nQPs, false, qpCap, 4096), openEnd(t, 4*nQPs, false, qpCap, 4096)
	aqs, bqs, _ := connectMany(t, a, b, nQPs, 0, qpCap)
	// QP i's bytes: the first Write's at 8i, the second's at 512+8i, the
	// Read's at 1024+8i, each of the three a different 8 bytes per QP.
	pattern := func(i, which int) []byte { return bytes.Repeat([]byte{byte(16*which + i + 1)}, 8) }
	for i := range nQPs {
		copy(a.mr.Bytes()[8*i:], pattern(i, 0))
		copy(a.mr.Bytes()[512+8*i:], pattern(i, 1))
		copy(b.mr.Bytes()[1024+8*i:], pattern(i, 2))
	}
	write := func(i, off int) verbs.SendWR {
		return verbs.SendWR{WRID: uint64(off + i), Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
			SGList: []verbs.SGE{a.mr.SGE(off+8*i, 8)}, RemoteAddr: b.mr.Addr() + uint64(off+8*i), RKey: b.mr.RKey()}
	}
	for i, q := range aqs {
		read := verbs.SendWR{WRID: uint64(2048 + i), Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
			SGList: []verbs.SGE{a.mr.SGE(1024+8*i, 8)}, RemoteAddr: b.mr.Addr() + uint64(1024+8*i), RKey: b.mr.RKey()}
		if _, err := q.PostSend([]verbs.SendWR{write(i, 0), read}); err != nil {
			t.Fatal(err)
		}
	}
	wc := make([]verbs.WorkCompletion, 2*nQPs)
	await := func(n int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for done := 0; done < n; {
			k := a.cq.Poll(wc)
			for _, w := range wc[:k] {
				if w.Status != verbs.WCSuccess {
					t.Fatalf("WR %d completed with %v", w.WRID, w.Status)
				}
			}
			done += k
			if k == 0 && time.Now().After(deadline) {
				t.Fatalf("%d of %d WRs completed in 10 s", done, n)
			}
		}
	}
	await(2 * nQPs)
	// The send queues are idle: each Write alone takes the short road.
	for i, q := range aqs {
		if _, err := q.PostSend([]verbs.SendWR{write(i, 512)}); err != nil {
			t.Fatal(err)
		}
	}
	await(nQPs)
	for i := range nQPs {
		for _, c := range []struct {
			what string
			got  []byte
			want []byte
		}{
			{"the first Write", b.mr.Bytes()[8*i : 8*i+8], pattern(i, 0)},
			{"the second Write", b.mr.Bytes()[512+8*i : 512+8*i+8], pattern(i, 1)},
			{"the Read", a.mr.Bytes()[1024+8*i : 1024+8*i+8], pattern(i, 2)},
		} {
			if !bytes.Equal(c.got, c.want) {
				t.Errorf("QP %d: %s placed %x, not %x", i, c.what, c.got, c.want)
			}
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
