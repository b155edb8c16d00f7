package iwarp_test

import (
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/verbs"
)

// What one message costs, without waiting: one goroutine does both ends
// of a Send/Recv ping-pong, so that no thread sleeps, wakes or waits for
// a processor, and the time is the work alone. The three benchmarks
// split tcp0's one-way latency into its parts:
//
//	go test -run '^$' -bench 'Path|InMemory|PollEmpty' ./provider/iwarp/
//
// BenchmarkRawSocketPath64 is the kernel's share (a write(2) and a
// read(2) each way), BenchmarkSendRecvInMemory goverbs' own (the same
// exchange with the sockets replaced by memory), and
// BenchmarkSendRecvPath64 both together.

// cqMod is how often the path benchmarks signal a Send, as perftest's
// latency tests (and goverbs bench) do by default.
const cqMod = 100

// BenchmarkSendRecvPath64 is a 64-byte Send/Recv round trip between two
// tcp0 QPs over loopback, driven by one goroutine: it posts a Send on A,
// polls B's receive CQ (loopback delivers the segment within the
// sender's writev, so the first poll finds it), reposts the receive,
// and answers the other way.
func BenchmarkSendRecvPath64(b *testing.B) { sendRecvPath(b, false) }

// BenchmarkSendRecvInMemory is BenchmarkSendRecvPath64 with the
// connections' readv and writev moving the bytes in memory
// (iwarp.SocketsInMemory): the processor time goverbs itself spends on a
// round trip of two messages, with the kernel left out.
func BenchmarkSendRecvInMemory(b *testing.B) { sendRecvPath(b, true) }

func sendRecvPath(b *testing.B, inMemory bool) {
	p := newBenchPair(b, 1<<16)
	for _, e := range []*benchEnd{p.a, p.b} {
		for range 128 {
			if _, err := e.qp.PostRecv(e.recv); err != nil {
				b.Fatal(err)
			}
		}
	}
	type end struct {
		*benchEnd
		wr      []verbs.SendWR
		sent    int
		pending bool // a signaled Send whose completion is not yet polled
	}
	a := &end{benchEnd: p.a, wr: []verbs.SendWR{{Opcode: verbs.OpSend, SGList: []verbs.SGE{p.a.mr.SGE(4096, latencySize)}}}}
	c := &end{benchEnd: p.b, wr: []verbs.SendWR{{Opcode: verbs.OpSend, SGList: []verbs.SGE{p.b.mr.SGE(4096, latencySize)}}}}
	// reap polls the completion of from's last signaled Send. tcp0
	// completes a Send once the peer has answered the Read that confirms
	// it, and a peer that polls answers with its next post: reaped after
	// the peer's answering hop, as perftest's loop and goverbs bench
	// find it, the completion is there at once. (Waiting for it right
	// after the post would wait for lazyAge, the peer not posting.)
	reap := func(from, to *end) {
		if !from.pending {
			return
		}
		for from.cq.Poll(from.wc[:1]) == 0 {
			to.rcq.Poll(nil)
		}
		if from.wc[0].Status != verbs.WCSuccess {
			b.Fatalf("send: %+v", from.wc[0])
		}
		from.pending = false
	}
	hop := func(from, to *end) {
		reap(from, to)
		from.sent++
		from.pending = from.sent%cqMod == 0
		from.wr[0].Flags = 0
		if from.pending {
			from.wr[0].Flags = verbs.SendSignaled
		}
		if _, err := from.qp.PostSend(from.wr); err != nil {
			b.Fatal(err)
		}
		for to.rcq.Poll(to.wc[:1]) == 0 {
		}
		if to.wc[0].Status != verbs.WCSuccess {
			b.Fatalf("receive: %+v", to.wc[0])
		}
		if _, err := to.qp.PostRecv(to.recv); err != nil {
			b.Fatal(err)
		}
	}
	if inMemory {
		// A round trip on the sockets first: the connections are up and
		// the sockets hold nothing when the memory takes over.
		hop(a, c)
		hop(c, a)
		held, restore := iwarp.SocketsInMemory(p.a.qp.Driver(), p.b.qp.Driver())
		defer func() {
			// What is still on its way (an answer left for a while, see
			// lazyAge) is taken before the sockets come back.
			for held() > 0 {
				p.a.rcq.Poll(nil)
				p.b.rcq.Poll(nil)
			}
			restore()
		}()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		hop(a, c)
		hop(c, a)
	}
	b.StopTimer()
}

// BenchmarkRawSocketPath64 is BenchmarkSendRecvPath64's exchange on raw
// non-blocking sockets: a write(2) of 64 bytes and the read(2) that
// takes it, each way. (A writev of three iovecs and a readv, as tcp0
// makes, measured the same.)
func BenchmarkRawSocketPath64(b *testing.B) {
	x, y := rawPair(b)
	var buf [latencySize]byte
	hop := func(from, to int) {
		if n, err := unix.Write(from, buf[:]); n != len(buf) || err != nil {
			b.Fatal(n, err)
		}
		for got := 0; got < len(buf); {
			n, err := unix.Read(to, buf[got:])
			if err == unix.EAGAIN {
				continue
			}
			if err != nil || n == 0 {
				b.Fatal(n, err)
			}
			got += n
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		hop(x, y)
		hop(y, x)
	}
}

// BenchmarkPollEmpty is a poll of a CQ that finds nothing, with one
// connected QP: a busy poller makes several of these for each message
// that arrives (one read system call each), and how long one takes is
// part of how soon a message is seen.
func BenchmarkPollEmpty(b *testing.B) {
	p := newBenchPair(b, 1<<16)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if p.a.rcq.Poll(p.a.wc[:1]) != 0 {
			b.Fatalf("a completion: %+v", p.a.wc[0])
		}
	}
}

// rawPair returns the two ends of a loopback TCP connection as
// non-blocking descriptors outside the Go runtime's poller, with Nagle
// off, as tcp0's sockets are.
func rawPair(tb testing.TB) (int, int) {
	sock := func() int {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	l := sock()
	loopback := [4]byte{127, 0, 0, 1}
	if err := unix.Bind(l, &unix.SockaddrInet4{Addr: loopback}); err != nil {
		tb.Fatal(err)
	}
	if err := unix.Listen(l, 1); err != nil {
		tb.Fatal(err)
	}
	sa, err := unix.Getsockname(l)
	if err != nil {
		tb.Fatal(err)
	}
	x := sock()
	if err := unix.Connect(x, &unix.SockaddrInet4{Port: sa.(*unix.SockaddrInet4).Port, Addr: loopback}); err != nil {
		tb.Fatal(err)
	}
	y, _, err := unix.Accept4(l, unix.SOCK_CLOEXEC)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { unix.Close(y) })
	for _, fd := range []int{x, y} {
		if err := unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1); err != nil {
			tb.Fatal(err)
		}
		if err := unix.SetNonblock(fd, true); err != nil {
			tb.Fatal(err)
		}
	}
	return x, y
}
