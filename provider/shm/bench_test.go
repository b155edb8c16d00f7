package shm_test

import (
	"testing"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// BenchmarkPostSendPoll is the data path between two endpoints in this
// process: post one signaled WR and poll its completion.
func BenchmarkPostSendPoll(b *testing.B) {
	h := verbstest.Harness{Device: "shm0", Addr: addr}
	for _, op := range []struct {
		name string
		op   verbs.Opcode
		size int
	}{{"Write8", verbs.OpRDMAWrite, 8}, {"Read8", verbs.OpRDMARead, 8}, {"FetchAdd", verbs.OpAtomicFetchAndAdd, 8}, {"Write64K", verbs.OpRDMAWrite, 64 << 10}} {
		b.Run(op.name, func(b *testing.B) {
			p := h.NewPair(b, verbstest.PairOptions{})
			src, err := p.A.NewRegion(op.size, verbs.AccessLocalWrite)
			if err != nil {
				b.Fatal(err)
			}
			dst, err := p.B.NewRegion(op.size, verbs.AccessLocalWrite|verbs.RemoteAccess)
			if err != nil {
				b.Fatal(err)
			}
			wr := []verbs.SendWR{{Opcode: op.op, Flags: verbs.SendSignaled, SGList: []verbs.SGE{src.SGE(0, op.size)},
				RemoteAddr: dst.Addr, RKey: dst.RKey, CompareAdd: 1}}
			qp, cq := p.A.QPs[0], p.A.SendCQ
			wc := make([]verbs.WorkCompletion, 4)
			b.SetBytes(int64(op.size))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := qp.PostSend(wr); err != nil {
					b.Fatal(err)
				}
				for cq.Poll(wc) == 0 {
				}
				if wc[0].Status != verbs.WCSuccess {
					b.Fatal(wc[0].Status)
				}
			}
		})
	}
}
