package shm_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

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
// write_bw measures it: unsignaled but one in cqMod (16), the window of
// outstanding WRs bounded by the send queue, completions polled in
// batches; posted one per PostSend (List1), or in lists of 16 (perftest's
// --post_list). ns/WR is the time per Write.
func BenchmarkWriteRate(b *testing.B) {
	for _, list := range []int{1, 16} {
		b.Run(fmt.Sprintf("List%d", list), func(b *testing.B) { benchWriteRate(b, list) })
	}
}

func benchWriteRate(b *testing.B, list int) {
	const cqMod = 16
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
	wc := make([]verbs.WorkCompletion, 16)
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
// again (unsignaled Sends: one in 64 is signaled and polled). The
// BenchmarkSendRecvN are the same with N-byte Sends. (Not sub-benchmarks:
// under callgrind (scripts/instructions.sh), a sub-benchmark's run counts
// thousands of instructions more per iteration, of the runtime's
// scheduler and timers.)
func BenchmarkSendRecv(b *testing.B)    { benchSendRecv(b, 64) }
func BenchmarkSendRecv8(b *testing.B)   { benchSendRecv(b, 8) }
func BenchmarkSendRecv32(b *testing.B)  { benchSendRecv(b, 32) }
func BenchmarkSendRecv96(b *testing.B)  { benchSendRecv(b, 96) }
func BenchmarkSendRecv97(b *testing.B)  { benchSendRecv(b, 97) }
func BenchmarkSendRecv128(b *testing.B) { benchSendRecv(b, 128) }
func BenchmarkSendRecv256(b *testing.B) { benchSendRecv(b, 256) }

func benchSendRecv(b *testing.B, size int) {
	const cqMod = 64
	h := verbstest.Harness{Device: "shm0", Addr: addr}
	p := h.NewPair(b, verbstest.PairOptions{Cap: verbs.QPCap{MaxSendWR: 128, MaxRecvWR: 16, MaxInlineData: 256}})
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
	b.SetBytes(int64(size))
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
		if wc[0].Status != verbs.WCSuccess || wc[0].ByteLen != uint32(size) {
			b.Fatal(wc[0].Status, wc[0].ByteLen)
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

// BenchmarkSendRecvWait is a ping-pong of 64-byte Sends in which both
// sides sleep in CQ.Wait for each message instead of polling: the wake-up
// path (the peer's futex wake, the CQ's waiter, the woken goroutine).
// ns/op is one round trip.
func BenchmarkSendRecvWait(b *testing.B) {
	const size = 64
	h := verbstest.Harness{Device: "shm0", Addr: addr}
	p := h.NewPair(b, verbstest.PairOptions{Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16}})
	a, rb := p.A, p.B.(*verbstest.Local)
	regions := make([]verbstest.Region, 4)
	for i, e := range []verbstest.Endpoint{a, a, rb, rb} {
		r, err := e.NewRegion(size, verbs.AccessLocalWrite)
		if err != nil {
			b.Fatal(err)
		}
		regions[i] = r
	}
	// Side i sends from regions[2i] and receives into regions[2i+1].
	// Every Send is signaled; a shm Send is done when PostSend returns,
	// so its completion is polled at once.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type side struct {
		l    *verbstest.Local
		send []verbs.SendWR
		recv []verbs.RecvWR
		wc   []verbs.WorkCompletion
	}
	sides := [2]*side{}
	for i, l := range []*verbstest.Local{a, rb} {
		s := &side{l: l,
			send: []verbs.SendWR{{Opcode: verbs.OpSend, Flags: verbs.SendInline | verbs.SendSignaled, SGList: []verbs.SGE{regions[2*i].SGE(0, size)}}},
			recv: []verbs.RecvWR{{SGList: []verbs.SGE{regions[2*i+1].SGE(0, size)}}},
			wc:   make([]verbs.WorkCompletion, 1)}
		for range 4 {
			if _, err := l.QPs[0].PostRecv(s.recv); err != nil {
				b.Fatal(err)
			}
		}
		sides[i] = s
	}
	// await takes one receive completion, sleeping for it, and posts the
	// receive again.
	await := func(s *side) error {
		if _, err := s.l.RecvCQ.Wait(ctx, s.wc); err != nil {
			return err
		}
		if s.wc[0].Status != verbs.WCSuccess {
			return fmt.Errorf("receive: %v", s.wc[0].Status)
		}
		_, err := s.l.QPs[0].PostRecv(s.recv)
		return err
	}
	// send posts the side's Send and takes its completion.
	send := func(s *side) error {
		if _, err := s.l.QPs[0].PostSend(s.send); err != nil {
			return err
		}
		if s.l.SendCQ.Poll(s.wc) != 1 || s.wc[0].Status != verbs.WCSuccess {
			return fmt.Errorf("send: no successful completion when PostSend returned")
		}
		return nil
	}
	echoDone := make(chan error, 1)
	stop := make(chan struct{})
	go func() {
		s := sides[1]
		for {
			if err := await(s); err != nil {
				echoDone <- err
				return
			}
			select {
			case <-stop:
				echoDone <- nil
				return
			default:
			}
			if err := send(s); err != nil {
				echoDone <- err
				return
			}
		}
	}()
	s := sides[0]
	b.ReportAllocs()
	for b.Loop() {
		if err := send(s); err != nil {
			b.Fatal(err)
		}
		if err := await(s); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2, "one-way-ns")
	close(stop)
	if err := send(s); err != nil {
		b.Fatal(err)
	}
	if err := <-echoDone; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkPollEmpty is a Poll that finds nothing, on a receive CQ into
// which 1, 16 or 64 connected QPs complete their receives: what a busy
// poller pays while it waits.
func BenchmarkPollEmpty(b *testing.B) {
	for _, qps := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("QPs%d", qps), func(b *testing.B) {
			h := verbstest.Harness{Device: "shm0", Addr: addr}
			p := h.NewPair(b, verbstest.PairOptions{QPs: qps})
			cq := p.B.(*verbstest.Local).RecvCQ
			wc := make([]verbs.WorkCompletion, 16)
			b.ReportAllocs()
			for b.Loop() {
				if cq.Poll(wc) != 0 {
					b.Fatal("a completion in an idle CQ")
				}
			}
		})
	}
}

// BenchmarkSendPingPong is a ping-pong of Sends of 8 to 256 bytes between
// two goroutines that busy-poll their receive CQs, as tag_lat measures
// it: each side posts its receive again and answers. ns/op is one round
// trip; one-way-ns half of it. The two sides run on two processors at
// once, so this shows what instruction counts do not: the cache lines
// each message moves between them.
func BenchmarkSendPingPong(b *testing.B) {
	for _, size := range []int{8, 64, 96, 97, 256} {
		b.Run(fmt.Sprint(size), func(b *testing.B) { benchSendPingPong(b, size) })
	}
}

func benchSendPingPong(b *testing.B, size int) {
	const cqMod = 64
	h := verbstest.Harness{Device: "shm0", Addr: addr}
	p := h.NewPair(b, verbstest.PairOptions{Cap: verbs.QPCap{MaxSendWR: 128, MaxRecvWR: 16, MaxInlineData: 256}})
	type side struct {
		l    *verbstest.Local
		send []verbs.SendWR
		recv []verbs.RecvWR
		wc   []verbs.WorkCompletion
		sent int
	}
	var sides [2]*side
	for i, l := range []*verbstest.Local{p.A, p.B.(*verbstest.Local)} {
		src, err := l.NewRegion(size, verbs.AccessLocalWrite)
		if err != nil {
			b.Fatal(err)
		}
		dst, err := l.NewRegion(size, verbs.AccessLocalWrite)
		if err != nil {
			b.Fatal(err)
		}
		s := &side{l: l,
			send: []verbs.SendWR{{Opcode: verbs.OpSend, SGList: []verbs.SGE{src.SGE(0, size)}}},
			recv: []verbs.RecvWR{{SGList: []verbs.SGE{dst.SGE(0, size)}}},
			wc:   make([]verbs.WorkCompletion, 1)}
		for range 8 {
			if _, err := l.QPs[0].PostRecv(s.recv); err != nil {
				b.Fatal(err)
			}
		}
		sides[i] = s
	}
	// await busy-polls for one message and posts the receive again; it
	// reports whether the message was the last (an immediate).
	await := func(s *side) (bool, error) {
		for s.l.RecvCQ.Poll(s.wc) == 0 {
		}
		if s.wc[0].Status != verbs.WCSuccess || s.wc[0].ByteLen != uint32(size) {
			return false, fmt.Errorf("receive: %v, %d bytes", s.wc[0].Status, s.wc[0].ByteLen)
		}
		_, err := s.l.QPs[0].PostRecv(s.recv)
		return s.wc[0].Flags&verbs.WCWithImm != 0, err
	}
	// send posts the side's Send, the last with an immediate; one in
	// cqMod is signaled and its completion polled.
	send := func(s *side, last bool) error {
		s.sent++
		wr := &s.send[0]
		wr.Opcode, wr.Flags = verbs.OpSend, verbs.SendInline
		if last {
			wr.Opcode = verbs.OpSendWithImm
		}
		signaled := s.sent%cqMod == 0
		if signaled {
			wr.Flags |= verbs.SendSignaled
		}
		if _, err := s.l.QPs[0].PostSend(s.send); err != nil {
			return err
		}
		if signaled {
			for s.l.SendCQ.Poll(s.wc) == 0 {
			}
			if s.wc[0].Status != verbs.WCSuccess {
				return fmt.Errorf("send: %v", s.wc[0].Status)
			}
		}
		return nil
	}
	echoDone := make(chan error, 1)
	go func() {
		s := sides[1]
		for {
			last, err := await(s)
			if err == nil {
				err = send(s, false)
			}
			if err != nil || last {
				echoDone <- err
				return
			}
		}
	}()
	s := sides[0]
	b.SetBytes(int64(size))
	b.ReportAllocs()
	for b.Loop() {
		if err := send(s, false); err != nil {
			b.Fatal(err)
		}
		if _, err := await(s); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2, "one-way-ns")
	if err := send(s, true); err != nil {
		b.Fatal(err)
	}
	if err := <-echoDone; err != nil {
		b.Fatal(err)
	}
	if _, err := await(s); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkWriteOneOfMany and BenchmarkWriteRoundRobin are goverbs
// scale's Writes in one process: 1,000 connected QPs (or
// GOVERBS_BENCH_QPS: under callgrind, whose slowness runs some of a
// thousand handshakes past their timeout, fewer) whose send completions
// share one CQ, 8-byte signaled RDMA Writes to one region
// of the peer, 8 outstanding, completions polled in batches. OneOfMany
// posts every Write on the first QP, RoundRobin on each QP in turn: the
// difference is what spreading the Writes over many QPs costs. (Not
// sub-benchmarks, for scripts/instructions.sh.)
func BenchmarkWriteOneOfMany(b *testing.B)  { benchWriteSpread(b, benchQPs(b), 1) }
func BenchmarkWriteRoundRobin(b *testing.B) { qps := benchQPs(b); benchWriteSpread(b, qps, qps) }

// benchQPs is GOVERBS_BENCH_QPS, 1,000 if unset.
func benchQPs(b *testing.B) int {
	s := os.Getenv("GOVERBS_BENCH_QPS")
	if s == "" {
		return 1000
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		b.Fatalf("GOVERBS_BENCH_QPS=%q: give a count of QPs", s)
	}
	return n
}

func benchWriteSpread(b *testing.B, qps, spread int) {
	const window = 8
	h := verbstest.Harness{Device: "shm0", Addr: addr}
	p := h.NewPair(b, verbstest.PairOptions{QPs: qps, Cap: verbs.QPCap{MaxSendWR: window, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	src, err := p.A.NewRegion(8, verbs.AccessLocalWrite)
	if err != nil {
		b.Fatal(err)
	}
	dst, err := p.B.NewRegion(8, verbs.AccessLocalWrite|verbs.RemoteAccess)
	if err != nil {
		b.Fatal(err)
	}
	wr := []verbs.SendWR{{Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled, SGList: []verbs.SGE{src.SGE(0, 8)},
		RemoteAddr: dst.Addr, RKey: dst.RKey}}
	cq, qs := p.A.SendCQ, p.A.QPs[:spread]
	wc := make([]verbs.WorkCompletion, 16)
	// Every QP has resolved the key and mapped the region before the
	// measurement.
	for _, qp := range qs {
		if _, err := qp.PostSend(wr); err != nil {
			b.Fatal(err)
		}
		for cq.Poll(wc[:1]) == 0 {
		}
	}
	b.ReportAllocs()
	spreadWrites(b, qs, cq, wr, wc)
}

// spreadWrites is benchWriteSpread's loop, a function of its own so that
// callgrind can count it alone (--toggle-collect).
//
//go:noinline
func spreadWrites(b *testing.B, qs []*verbs.QP, cq *verbs.CQ, wr []verbs.SendWR, wc []verbs.WorkCompletion) {
	const window = 8
	next, outstanding := 0, 0
	for b.Loop() {
		if _, err := qs[next].PostSend(wr); err != nil {
			b.Fatal(err)
		}
		if next++; next == len(qs) {
			next = 0
		}
		if outstanding++; outstanding == window {
			for outstanding > 0 {
				n := cq.Poll(wc)
				for _, c := range wc[:n] {
					if c.Status != verbs.WCSuccess {
						b.Fatal(c.Status)
					}
				}
				outstanding -= n
			}
		}
	}
}
