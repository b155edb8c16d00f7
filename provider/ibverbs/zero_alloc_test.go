package ibverbs_test

import (
	"testing"
	"time"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// TestZeroAllocSendRecv: on a real device, a round of PostRecv, PostSend
// and Poll of both completions allocates nothing. Both endpoints are in
// this process, so that the receiver's PostRecv and Poll are counted as
// well as the sender's (the suite's DataPath/ZeroAlloc counts the
// sender's).
func TestZeroAllocSendRecv(t *testing.T) {
	device, addr := harnessEnv(t)
	const runs = 200
	h := verbstest.Harness{Device: device, Addr: addr}
	p := h.NewPair(t, verbstest.PairOptions{Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}, CQDepth: 64})
	b, ok := p.B.(*verbstest.Local)
	if !ok {
		t.Fatalf("endpoint B is a %T, not in this process", p.B)
	}
	src, err := p.A.NewRegion(64, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := b.NewRegion(64, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	send := []verbs.SendWR{{WRID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{src.SGE(0, 64)}}}
	recv := []verbs.RecvWR{{WRID: 2, SGList: []verbs.SGE{dst.SGE(0, 64)}}}
	wc := make([]verbs.WorkCompletion, 4)
	var failure string
	deadline := time.Now().Add(30 * time.Second)
	// poll waits for one completion on cq, or records why none came.
	poll := func(cq *verbs.CQ, what string) {
		for spins := 0; ; spins++ {
			n := cq.Poll(wc)
			if n > 0 {
				if wc[0].Status != verbs.WCSuccess {
					failure = what + ": " + wc[0].Status.String()
				}
				return
			}
			if spins%4096 == 0 && time.Now().After(deadline) {
				failure = what + ": no completion within 30s"
				return
			}
		}
	}
	allocs := testing.AllocsPerRun(runs, func() {
		if failure != "" {
			return
		}
		if n, err := b.QPs[0].PostRecv(recv); n != 1 || err != nil {
			failure = "PostRecv: " + errString(err)
			return
		}
		if n, err := p.A.QPs[0].PostSend(send); n != 1 || err != nil {
			failure = "PostSend: " + errString(err)
			return
		}
		poll(p.A.SendCQ, "the Send's completion")
		poll(b.RecvCQ, "the receive's completion")
	})
	if failure != "" {
		t.Fatal(failure)
	}
	if allocs != 0 {
		t.Fatalf("PostRecv, PostSend and Poll of a Send and its receive allocate %v times per round on %s, want 0", allocs, device)
	}
}

func errString(err error) string {
	if err == nil {
		return "posted nothing, and no error"
	}
	return err.Error()
}
