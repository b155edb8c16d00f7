package iwarp_test

import (
	"fmt"
	"testing"

	"github.com/goverbs/goverbs/verbs"
)

// BenchmarkWriteRoundRobin is the message rate of 8 B RDMA Writes, a
// window of 8 outstanding, every one signaled, posted over n QPs in turn
// that share one CQ per side (both sides in this process, the target
// side left to its receive goroutine with qps=1, and to its CQ's
// receiver with more); ns/op is one Write. With qps=1000 it shows what a
// poll of the shared CQ costs when every QP is active.
//
//	go test -run '^$' -bench WriteRoundRobin -benchtime 20000x ./provider/iwarp/
func BenchmarkWriteRoundRobin(b *testing.B) {
	for _, n := range []int{1, 30, 1000} {
		b.Run(fmt.Sprintf("qps=%d", n), func(b *testing.B) { writeRoundRobin(b, n) })
	}
}

func writeRoundRobin(b *testing.B, nQPs int) {
	const window = 8
	qpCap := verbs.QPCap{MaxSendWR: window, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}
	a, t := openEnd(b, 256, false, qpCap, 4096), openEnd(b, 256, false, qpCap, 4096)
	qps, _, _ := connectMany(b, a, t, nQPs, 0, qpCap)
	wr := []verbs.SendWR{{Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{a.mr.SGE(0, 8)}, RemoteAddr: t.mr.Addr(), RKey: t.mr.RKey()}}
	wc := make([]verbs.WorkCompletion, 16)
	next := 0
	post := func() {
		if _, err := qps[next].PostSend(wr); err != nil {
			b.Fatal(err)
		}
		if next++; next == len(qps) {
			next = 0
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	posted, outstanding := 0, 0
	for ; outstanding < window && posted < b.N; posted++ {
		post()
		outstanding++
	}
	for outstanding > 0 {
		n := a.cq.Poll(wc)
		if n == 0 {
			if err := a.cq.Err(); err != nil {
				b.Fatal(err)
			}
			continue
		}
		for _, w := range wc[:n] {
			if w.Status != verbs.WCSuccess {
				b.Fatalf("a Write completed with %v", w.Status)
			}
		}
		outstanding -= n
		for ; n > 0 && posted < b.N; n-- {
			post()
			posted++
			outstanding++
		}
	}
}
