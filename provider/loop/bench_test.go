package loop_test

import (
	"context"
	"testing"

	_ "github.com/goverbs/goverbs/provider/loop"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// pair is two connected loop QPs for benchmarks.
type pair struct {
	qpA, qpB *verbs.QP
	cqA, cqB *verbs.CQ
	mrA, mrB *verbs.MR
}

func newPair(tb testing.TB, name string) *pair {
	tb.Helper()
	p := &pair{}
	mk := func() (*verbs.QP, *verbs.CQ, *verbs.MR) {
		pd, cq, qp := verbstest.QPOn(tb, "loop0", 32)
		mr, err := pd.AllocMR(1<<20, verbs.AccessLocalWrite|verbs.RemoteAccess)
		if err != nil {
			tb.Fatal(err)
		}
		return qp, cq, mr
	}
	p.qpA, p.cqA, p.mrA = mk()
	p.qpB, p.cqB, p.mrB = mk()
	verbstest.Connect(tb, "loop://"+name, p.qpB, p.qpA)
	return p
}

// BenchmarkPostSendPoll is the data path: post one signaled 8-byte RDMA
// Write and poll its completion.
func BenchmarkPostSendPoll(b *testing.B) {
	p := newPair(b, b.Name())
	wr := []verbs.SendWR{{Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{p.mrA.SGE(0, 8)}, RemoteAddr: p.mrB.Addr(), RKey: p.mrB.RKey()}}
	wc := make([]verbs.WorkCompletion, 16)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.qpA.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		for p.cqA.Poll(wc) == 0 {
		}
		if wc[0].Status != verbs.WCSuccess {
			b.Fatal(wc[0].Status)
		}
	}
}

// BenchmarkSendRecv posts a receive and a 64-byte Send and polls both
// completions.
func BenchmarkSendRecv(b *testing.B) {
	p := newPair(b, b.Name())
	swr := []verbs.SendWR{{Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{p.mrA.SGE(0, 64)}}}
	rwr := []verbs.RecvWR{{SGList: []verbs.SGE{p.mrB.SGE(0, 64)}}}
	wc := make([]verbs.WorkCompletion, 16)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := p.qpB.PostRecv(rwr); err != nil {
			b.Fatal(err)
		}
		if _, err := p.qpA.PostSend(swr); err != nil {
			b.Fatal(err)
		}
		for p.cqA.Poll(wc) == 0 {
		}
		for p.cqB.Poll(wc) == 0 {
		}
	}
}

func TestSmoke(t *testing.T) {
	p := newPair(t, t.Name())
	copy(p.mrB.Bytes(), "hello, rdma")
	wr := []verbs.SendWR{{Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{p.mrA.SGE(0, 11)}, RemoteAddr: p.mrB.Addr(), RKey: p.mrB.RKey()}}
	if _, err := p.qpA.PostSend(wr); err != nil {
		t.Fatal(err)
	}
	wc := make([]verbs.WorkCompletion, 1)
	n, err := p.cqA.Wait(context.Background(), wc)
	if err != nil || n != 1 || wc[0].Status != verbs.WCSuccess {
		t.Fatal(n, err, wc[0].Status)
	}
	if got := string(p.mrA.Bytes()[:11]); got != "hello, rdma" {
		t.Fatal(got)
	}
}
