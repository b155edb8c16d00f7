package shm_test

import (
	"fmt"
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

// BenchmarkWriteRate is the message rate of 8-byte RDMA Writes as
// write_bw measures it: one in cqMod signaled, the window of outstanding
// WRs bounded by the send queue; posted one per PostSend (List1), or in
// lists of 16 (perftest's --post_list).
func BenchmarkWriteRate(b *testing.B) {
	for _, list := range []int{1, 16} {
		b.Run(fmt.Sprintf("List%d", list), func(b *testing.B) { benchWriteRate(b, list) })
	}
}

func benchWriteRate(b *testing.B, list int) {
	const cqMod = 64
	h := verbstest.Harness{Device: "shm0", Addr: addr}
	p := h.NewPair(b, verbstest.PairOptions{Cap: verbs.QPCap{MaxSendWR: 256}})
	src, err := p.A.NewRegion(8, verbs.AccessLocalWrite)
	if err != nil {
		b.Fatal(err)
	}
	dst, err := p.B.NewRegion(8, verbs.AccessLocalWrite|verbs.RemoteAccess)
	if err != nil {
		b.Fatal(err)
	}
	wr := make([]verbs.SendWR, list)
	for i := range wr {
		wr[i] = verbs.SendWR{Opcode: verbs.OpRDMAWrite, SGList: []verbs.SGE{src.SGE(0, 8)}, RemoteAddr: dst.Addr, RKey: dst.RKey}
	}
	qp, cq := p.A.QPs[0], p.A.SendCQ
	wc := make([]verbs.WorkCompletion, 4)
	b.ReportAllocs()
	i, outstanding := 0, 0
	for b.Loop() {
		for j := range wr {
			i++
			wr[j].Flags = 0
			if i%cqMod == 0 {
				wr[j].Flags = verbs.SendSignaled
				outstanding++
			}
		}
		if _, err := qp.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		for outstanding > 1 {
			n := cq.Poll(wc)
			for _, c := range wc[:n] {
				if c.Status != verbs.WCSuccess {
					b.Fatal(c.Status)
				}
			}
			outstanding -= n
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(i), "ns/WR")
}

// BenchmarkSendRecv is the data path of a Send: post a 64-byte inline
// Send, poll its receive completion on the peer, and post the receive
// again (unsignaled Sends: one in 64 is signaled and polled).
func BenchmarkSendRecv(b *testing.B) {
	const size, cqMod = 64, 64
	h := verbstest.Harness{Device: "shm0", Addr: addr}
	p := h.NewPair(b, verbstest.PairOptions{Cap: verbs.QPCap{MaxSendWR: 128, MaxRecvWR: 16}})
	rb := p.B.(*verbstest.Local)
	src, err := p.A.NewRegion(size, verbs.AccessLocalWrite)
	if err != nil {
		b.Fatal(err)
	}
	dst, err := p.B.NewRegion(size, verbs.AccessLocalWrite)
	if err != nil {
		b.Fatal(err)
	}
	recv := []verbs.RecvWR{{SGList: []verbs.SGE{dst.SGE(0, size)}}}
	for range 8 {
		if _, err := rb.QPs[0].PostRecv(recv); err != nil {
			b.Fatal(err)
		}
	}
	send := []verbs.SendWR{{Opcode: verbs.OpSend, SGList: []verbs.SGE{src.SGE(0, size)}}}
	wc := make([]verbs.WorkCompletion, 4)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		send[0].Flags = verbs.SendInline
		if i%cqMod == 0 {
			send[0].Flags |= verbs.SendSignaled
		}
		if _, err := p.A.QPs[0].PostSend(send); err != nil {
			b.Fatal(err)
		}
		for rb.RecvCQ.Poll(wc[:1]) == 0 {
		}
		if wc[0].Status != verbs.WCSuccess {
			b.Fatal(wc[0].Status)
		}
		if _, err := rb.QPs[0].PostRecv(recv); err != nil {
			b.Fatal(err)
		}
		if i%cqMod == 0 {
			for p.A.SendCQ.Poll(wc[:1]) == 0 {
			}
		}
	}
}
