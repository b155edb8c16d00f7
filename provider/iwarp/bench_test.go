package iwarp_test

import (
	"context"
	"io"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// Speed, measured against what a Go program would otherwise use: plain Go
// TCP over the same loopback, in the same run. Every benchmark keeps both
// ends in this process.
//
//	go test -run '^$' -bench . -benchtime 2s ./provider/iwarp/
//	GOVERBS_SPEED=1 go test -run TestSpeedRatios -v ./provider/iwarp/

const (
	latencySize = 64
	bwSize      = 1 << 20
	bwWindow    = 8 // outstanding 1 MiB WRs
)

// benchPair is two connected tcp0 QPs with a region each.
type benchPair struct {
	a, b   *benchEnd
	ca, cb *cm.Conn
}

// benchEnd is one side of a benchPair: a send CQ (cq) and a receive CQ.
type benchEnd struct {
	*pairEnd
	wc     []verbs.WorkCompletion
	recv   []verbs.RecvWR
	posted int
}

func newBenchEnd(tb testing.TB, size int) *benchEnd {
	e := &benchEnd{wc: make([]verbs.WorkCompletion, 64)}
	e.pairEnd = openEnd(tb, 1024, true, verbs.QPCap{MaxSendWR: 256, MaxRecvWR: 256, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64}, size)
	e.recv = []verbs.RecvWR{{SGList: []verbs.SGE{e.mr.SGE(0, latencySize)}}}
	return e
}

func newBenchPair(tb testing.TB, size int) *benchPair {
	p := &benchPair{a: newBenchEnd(tb, size), b: newBenchEnd(tb, size)}
	l, err := cm.Listen("tcp://127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	p.ca, p.cb = connectQPs(tb, l, l.Addr(), p.a.qp, p.b.qp, nil, nil)
	return p
}

// waitOne blocks until the CQ yields a completion and returns it; ctx
// bounds the wait (one context for the whole benchmark, so that waiting
// allocates nothing).
func (e *benchEnd) waitOne(tb testing.TB, ctx context.Context, cq *verbs.CQ) verbs.WorkCompletion {
	n, err := cq.Wait(ctx, e.wc[:1])
	if err != nil || n != 1 {
		tb.Fatalf("wait: %d completions, %v", n, err)
	}
	if e.wc[0].Status != verbs.WCSuccess {
		tb.Fatalf("completion %+v", e.wc[0])
	}
	return e.wc[0]
}

// benchCtx bounds every wait of a benchmark.
func benchCtx(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	tb.Cleanup(cancel)
	return ctx
}

// drain polls the send CQ without waiting, so that send queue slots are
// retired.
func (e *benchEnd) drain(tb testing.TB) {
	for n := e.cq.Poll(e.wc); n > 0; n = e.cq.Poll(e.wc) {
		for _, wc := range e.wc[:n] {
			if wc.Status != verbs.WCSuccess {
				tb.Fatalf("send completion %+v", wc)
			}
		}
	}
}

// BenchmarkSendRecvLatency64 is the ping-pong of 64-byte Sends between
// two QPs, each side blocking in CQ.Wait; ns/op is one round trip,
// one-way-ns half of it.
func BenchmarkSendRecvLatency64(b *testing.B) { sendRecvLatency(b, false) }

// BenchmarkSendRecvLatency64Poll is the same ping-pong with both sides
// busy-polling their CQs, which then drive their connections.
func BenchmarkSendRecvLatency64Poll(b *testing.B) { sendRecvLatency(b, true) }

// waitRecv waits for one receive completion of e: polling, or blocking
// in CQ.Wait; false when the echo is to stop.
func (e *benchEnd) waitRecv(ctx context.Context, poll bool, stop *atomic.Bool) bool {
	if !poll {
		n, err := e.rcq.Wait(ctx, e.wc[:1])
		return err == nil && n == 1 && e.wc[0].Status == verbs.WCSuccess
	}
	for e.rcq.Poll(e.wc[:1]) == 0 {
		if stop.Load() {
			return false
		}
	}
	return e.wc[0].Status == verbs.WCSuccess
}

func sendRecvLatency(b *testing.B, poll bool) {
	p := newBenchPair(b, 1<<16)
	send := func(e *benchEnd) []verbs.SendWR {
		return []verbs.SendWR{{Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{e.mr.SGE(4096, latencySize)}}}
	}
	aSend, bSend := send(p.a), send(p.b)
	for _, e := range []*benchEnd{p.a, p.b} {
		for range 128 {
			if _, err := e.qp.PostRecv(e.recv); err != nil {
				b.Fatal(err)
			}
		}
	}
	ctx := benchCtx(b)
	echoCtx, stop := context.WithCancel(ctx)
	var stopPoll atomic.Bool
	echoed := make(chan error, 1)
	go func() {
		// B echoes every message it receives, until stopped.
		for {
			if !p.b.waitRecv(echoCtx, poll, &stopPoll) {
				echoed <- nil
				return
			}
			p.b.qp.PostRecv(p.b.recv)
			p.b.drain(b)
			if _, err := p.b.qp.PostSend(bSend); err != nil {
				echoed <- err
				return
			}
		}
	}()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := p.a.qp.PostSend(aSend); err != nil {
			b.Fatal(err)
		}
		if !p.a.waitRecv(ctx, poll, &stopPoll) {
			b.Fatalf("receive: %+v", p.a.wc[0])
		}
		if _, err := p.a.qp.PostRecv(p.a.recv); err != nil {
			b.Fatal(err)
		}
		p.a.drain(b)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2, "one-way-ns")
	stop()
	stopPoll.Store(true)
	if err := <-echoed; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkTCPPingPong64 is the baseline: a Go TCP ping-pong of 64-byte
// messages over loopback; one-way-ns is half a round trip.
func BenchmarkTCPPingPong64(b *testing.B) {
	a, c := tcpPair(b)
	go func() {
		buf := make([]byte, latencySize)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			if _, err := c.Write(buf); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, latencySize)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := a.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(a, buf); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2, "one-way-ns")
}

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(tb testing.TB) (net.Conn, net.Conn) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			accepted <- nil
			return
		}
		accepted <- c
	}()
	a, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	c := <-accepted
	if c == nil {
		tb.Fatal("accept failed")
	}
	tb.Cleanup(func() {
		a.Close()
		c.Close()
	})
	return a, c
}

// rdmaBandwidth streams 1 MiB RDMA Writes or Reads from A, with bwWindow
// outstanding; b.SetBytes makes the benchmark report MB/s.
func rdmaBandwidth(b *testing.B, op verbs.Opcode) {
	p := newBenchPair(b, 2*bwSize)
	ctx := benchCtx(b)
	wr := []verbs.SendWR{{Opcode: op, Flags: verbs.SendSignaled, SGList: []verbs.SGE{p.a.mr.SGE(0, bwSize)},
		RemoteAddr: p.b.mr.Addr() + bwSize, RKey: p.b.mr.RKey()}}
	inFlight(b, func() {
		if _, err := p.a.qp.PostSend(wr); err != nil {
			b.Fatal(err)
		}
	}, func() { p.a.waitOne(b, ctx, p.a.cq) })
}

// inFlight runs the benchmark's loop of 1 MiB operations with bwWindow
// of them outstanding: start starts one, finish waits for the oldest.
func inFlight(b *testing.B, start, finish func()) {
	b.SetBytes(bwSize)
	b.ReportAllocs()
	b.ResetTimer()
	outstanding := 0
	for b.Loop() {
		for outstanding >= bwWindow {
			finish()
			outstanding--
		}
		start()
		outstanding++
	}
	for ; outstanding > 0; outstanding-- {
		finish()
	}
}

// BenchmarkWrite1MiB is RDMA Write bandwidth, 1 MiB per WR.
func BenchmarkWrite1MiB(b *testing.B) { rdmaBandwidth(b, verbs.OpRDMAWrite) }

// BenchmarkRead1MiB is RDMA Read bandwidth, 1 MiB per WR.
func BenchmarkRead1MiB(b *testing.B) { rdmaBandwidth(b, verbs.OpRDMARead) }

// BenchmarkTCPStream1MiB is the baseline: a Go TCP stream of 1 MiB writes
// over loopback, read by a goroutine into a 1 MiB buffer; the op ends
// when the reader has the whole megabyte.
func BenchmarkTCPStream1MiB(b *testing.B) {
	a, c := tcpPair(b)
	got := make(chan struct{}, bwWindow)
	go func() {
		buf := make([]byte, bwSize)
		for {
			if _, err := io.ReadFull(c, buf); err != nil {
				return
			}
			got <- struct{}{}
		}
	}()
	buf := make([]byte, bwSize)
	inFlight(b, func() {
		if _, err := a.Write(buf); err != nil {
			b.Fatal(err)
		}
	}, func() { <-got })
}

// TestSpeedRatios runs the benchmarks above in one run and reports the
// ratios the goals are stated in: 64 B one-way latency of Send/Recv over
// that of Go TCP (goal at most 1.1), 1 MiB RDMA Write and Read bandwidth
// over that of a Go TCP stream (goal at least 0.9). It only reports: set
// GOVERBS_SPEED=1 to run it (it takes about ten seconds and its numbers
// depend on the machine's load).
func TestSpeedRatios(t *testing.T) {
	if os.Getenv("GOVERBS_SPEED") == "" {
		t.Skip("set GOVERBS_SPEED=1 to measure speed ratios")
	}
	oneWay := func(r testing.BenchmarkResult) float64 { return r.Extra["one-way-ns"] }
	mbps := func(r testing.BenchmarkResult) float64 {
		return float64(r.Bytes) * float64(r.N) / r.T.Seconds() / 1e6
	}
	tcpLat := testing.Benchmark(BenchmarkTCPPingPong64)
	lat := testing.Benchmark(BenchmarkSendRecvLatency64Poll)
	waitLat := testing.Benchmark(BenchmarkSendRecvLatency64)
	tcpBW := testing.Benchmark(BenchmarkTCPStream1MiB)
	wbw := testing.Benchmark(BenchmarkWrite1MiB)
	rbw := testing.Benchmark(BenchmarkRead1MiB)
	t.Logf("64 B one-way latency: Send/Recv %.0f ns polling (%.0f ns sleeping in CQ.Wait), Go TCP %.0f ns: ratio %.2f (goal <= 1.1); %d allocs/op",
		oneWay(lat), oneWay(waitLat), oneWay(tcpLat), oneWay(lat)/oneWay(tcpLat), lat.AllocsPerOp())
	t.Logf("1 MiB bandwidth: RDMA Write %.0f MB/s, RDMA Read %.0f MB/s, Go TCP stream %.0f MB/s: ratios %.2f and %.2f (goal >= 0.9); %d and %d allocs/op",
		mbps(wbw), mbps(rbw), mbps(tcpBW), mbps(wbw)/mbps(tcpBW), mbps(rbw)/mbps(tcpBW), wbw.AllocsPerOp(), rbw.AllocsPerOp())
}
