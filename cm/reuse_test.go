package cm_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/goverbs/goverbs/provider/iwarp"
	_ "github.com/goverbs/goverbs/provider/shm"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// A QP reset and connected again through cm, on every provider.

const reuseDepth = 4

type reuseSide struct {
	cq *verbs.CQ
	qp *verbs.QP
	mr *verbs.MR
}

func newReuseSide(t *testing.T, dev string) *reuseSide {
	t.Helper()
	s := &reuseSide{}
	var pd *verbs.PD
	pd, s.cq, s.qp = verbstest.QPOn(t, dev, reuseDepth)
	var err error
	if s.mr, err = pd.AllocMR(4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	return s
}

var reuseAddrs atomic.Int32

func reuseAddr(dev string) string {
	switch dev {
	case "loop0":
		return fmt.Sprintf("loop://reuse-%d", reuseAddrs.Add(1))
	case "shm0":
		return fmt.Sprintf("shm://@goverbs-reuse-%d-%d", os.Getpid(), reuseAddrs.Add(1))
	}
	return "tcp://127.0.0.1:0"
}

func (a *reuseSide) write(to *reuseSide, wrid uint64) []verbs.SendWR {
	return []verbs.SendWR{{WRID: wrid, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{a.mr.SGE(int(wrid%64)*8, 8)}, RemoteAddr: to.mr.Addr() + (wrid%64)*8, RKey: to.mr.RKey()}}
}

// TestStaleCompletionsAfterReset: completions a QP made before it was
// reset, polled once it has posted on its next connection, free none of
// that connection's send queue slots: the queue stays full, and every WR
// of the new connection completes once (tcp0 lost some and doubled
// others when old slot numbers freed new slots).
func TestStaleCompletionsAfterReset(t *testing.T) {
	for _, dev := range []string{"loop0", "shm0", "tcp0"} {
		t.Run(dev, func(t *testing.T) {
			a, b, c := newReuseSide(t, dev), newReuseSide(t, dev), newReuseSide(t, dev)
			verbstest.Connect(t, reuseAddr(dev), b.qp, a.qp)
			for i := range uint64(reuseDepth) {
				if _, err := a.qp.PostSend(a.write(b, 10+i)); err != nil {
					t.Fatal(err)
				}
			}
			for _, st := range []verbs.QPState{verbs.QPSErr, verbs.QPSReset} {
				if err := a.qp.Modify(&verbs.QPAttr{State: st}, verbs.QPAttrState); err != nil {
					t.Fatal(err)
				}
			}
			verbstest.Connect(t, reuseAddr(dev), c.qp, a.qp)
			for i := range uint64(reuseDepth) {
				if _, err := a.qp.PostSend(a.write(c, 20+i)); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			wc := make([]verbs.WorkCompletion, 1)
			seen := map[uint64]int{}
			for range reuseDepth {
				if _, err := a.cq.Wait(ctx, wc); err != nil {
					t.Fatal(err)
				}
				seen[wc[0].WRID]++
			}
			for i := range uint64(reuseDepth) {
				if seen[10+i] != 1 {
					t.Fatalf("the first %d completions polled are %v, want the old connection's 10 to %d once each", reuseDepth, seen, 10+reuseDepth-1)
				}
			}
			if _, err := a.qp.PostSend(a.write(c, 30)); err == nil {
				t.Fatalf("a WR was posted to a send queue of %d holding %d WRs whose completions are unpolled", reuseDepth, reuseDepth)
			}
			clear(seen)
			for range reuseDepth {
				if _, err := a.cq.Wait(ctx, wc); err != nil {
					t.Fatalf("after %v: %v", seen, err)
				}
				if wc[0].Status != verbs.WCSuccess {
					t.Fatalf("completion %+v", wc[0])
				}
				seen[wc[0].WRID]++
			}
			for i := range uint64(reuseDepth) {
				if seen[20+i] != 1 {
					t.Fatalf("the new connection's completions are %v, want 20 to %d once each", seen, 20+reuseDepth-1)
				}
			}
		})
	}
}

// TestNoCompletionsAfterDestroy: the WRs a QP still held when it was
// destroyed (Sends waiting for the peer to post receives, RNR retries on
// loop0 and shm0) are gone with it: a PostSend after Destroy fails, and
// flushes none of them into the CQ.
func TestNoCompletionsAfterDestroy(t *testing.T) {
	for _, dev := range []string{"loop0", "shm0", "tcp0"} {
		t.Run(dev, func(t *testing.T) {
			a, b := newReuseSide(t, dev), newReuseSide(t, dev)
			verbstest.Connect(t, reuseAddr(dev), b.qp, a.qp)
			for i := range uint64(3) {
				wr := []verbs.SendWR{{WRID: 40 + i, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{a.mr.SGE(0, 8)}}}
				if _, err := a.qp.PostSend(wr); err != nil {
					t.Fatal(err)
				}
			}
			if err := a.qp.Destroy(); err != nil {
				t.Fatal(err)
			}
			wc := make([]verbs.WorkCompletion, 16)
			before := a.cq.Poll(wc)
			if _, err := a.qp.PostSend([]verbs.SendWR{{WRID: 99, Opcode: verbs.OpSend, SGList: []verbs.SGE{a.mr.SGE(0, 8)}}}); err == nil {
				t.Fatal("PostSend on a destroyed QP succeeded")
			}
			if after := a.cq.Poll(wc); after > 0 {
				t.Fatalf("%d completions after Destroy (%d before it): %+v", after, before, wc[:after])
			}
		})
	}
}
