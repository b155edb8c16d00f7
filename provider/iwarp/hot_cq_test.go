package iwarp_test

import (
	"encoding/binary"
	"runtime"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/verbs"
)

// A poller of a CQ shared by many QPs receives on the connections that
// are active only: an idle one leaves the CQ's hot list, one that posts
// or receives joins it, and a destroyed one leaves it at once. Whatever
// the list holds, every completion comes: a message that arrives on a
// connection that is not in the list is received by its receive
// goroutine.
func TestSharedCQPollsActiveConnectionsOnly(t *testing.T) {
	const nQPs = iwarp.HotMinQPs + 4
	qpCap := verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}
	a, b := openEnd(t, 256, false, qpCap, 4096), openEnd(t, 256, false, qpCap, 4096)
	l, err := cm.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	aqps, bqps := []*verbs.QP{a.qp}, []*verbs.QP{b.qp}
	for range nQPs - 1 {
		for _, e := range []struct {
			end *pairEnd
			qps *[]*verbs.QP
		}{{a, &aqps}, {b, &bqps}} {
			qp, err := e.end.pd.CreateQP(verbs.QPInitAttr{SendCQ: e.end.cq, RecvCQ: e.end.cq, Cap: qpCap})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { qp.Destroy() })
			*e.qps = append(*e.qps, qp)
		}
	}
	aconns := make([]*cm.Conn, nQPs)
	for i := range nQPs {
		aconns[i], _ = connectQPs(t, l, l.Addr(), aqps[i], bqps[i], nil, nil)
	}
	wc := make([]verbs.WorkCompletion, 4)
	deadline := time.Now().Add(30 * time.Second)
	// pollUntil polls a's CQ, which must stay empty, until cond holds.
	pollUntil := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			if n := a.cq.Poll(wc); n != 0 {
				t.Fatalf("%s: a completion from nowhere: %+v", what, wc[0])
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: still %d QPs hot", what, iwarp.HotQPs(a.qp.Driver()))
			}
			runtime.Gosched()
		}
	}
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
	hot := func() int { return iwarp.HotQPs(a.qp.Driver()) }

	pollUntil("after setup", func() bool { return hot() == 0 })

	// A Write on one QP: it joins the list, and completes.
	binary.NativeEndian.PutUint64(a.mr.Bytes(), 0x5ca1ab1e)
	if _, err := aqps[3].PostSend([]verbs.SendWR{{WRID: 3, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{a.mr.SGE(0, 8)}, RemoteAddr: b.mr.Addr() + 64, RKey: b.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if !iwarp.IsHot(aqps[3].Driver()) {
		t.Fatal("a QP that posted is not hot")
	}
	if w := waitOne("write"); w.Status != verbs.WCSuccess || w.WRID != 3 || w.QPNum != aqps[3].Num() {
		t.Fatalf("write completion %+v, want WR 3 of QP %d", w, aqps[3].Num())
	}
	if got := binary.NativeEndian.Uint64(b.mr.Bytes()[64:]); got != 0x5ca1ab1e {
		t.Fatalf("the Write placed %#x", got)
	}
	pollUntil("after the write", func() bool { return hot() == 0 })

	// A Send to an idle QP: its receive goroutine receives it.
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

	// A QP destroyed leaves the list at once, and a post to it, which
	// fails, puts it back in no list; so for one destroyed idle.
	if _, err := aqps[6].PostSend([]verbs.SendWR{{WRID: 6, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{a.mr.SGE(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}}); err != nil {
		t.Fatal(err)
	}
	if !iwarp.IsHot(aqps[6].Driver()) {
		t.Fatal("a QP that posted is not hot")
	}
	if w := waitOne("write before destroy"); w.Status != verbs.WCSuccess || w.WRID != 6 {
		t.Fatalf("write completion %+v, want WR 6", w)
	}
	for _, i := range []int{6, 7} {
		aconns[i].Close()
		if err := aqps[i].Destroy(); err != nil {
			t.Fatal(err)
		}
		if iwarp.IsHot(aqps[i].Driver()) {
			t.Fatalf("QP %d is hot after its Destroy", i)
		}
		if _, err := aqps[i].PostSend([]verbs.SendWR{{WRID: 7, Opcode: verbs.OpRDMAWrite,
			SGList: []verbs.SGE{a.mr.SGE(0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}}); err == nil {
			t.Fatalf("a post to destroyed QP %d succeeded", i)
		}
		if iwarp.IsHot(aqps[i].Driver()) {
			t.Fatalf("QP %d is hot after a post that followed its Destroy", i)
		}
	}
}
