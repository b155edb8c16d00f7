package ibverbs

import (
	"fmt"
	"testing"
	"unsafe"

	"github.com/goverbs/goverbs/verbs/driver"
)

// goSide is a QP and its CQ whose data-path entry points are C library
// functions that touch nothing the provider reads back, in place of a
// device's: what BenchmarkGoSideSendLat runs is the provider's own Go
// side of the data path, with one real foreign call per post and poll.
// strncmp stands in for post_send and post_recv (the QP's first byte and
// the WR's, its WRID's low byte, are both 0, so it returns 0, "posted");
// strnlen for poll_cq (the CQ's bytes are a one-letter string, so it
// returns min(1, n), one completion, which the scratch array already
// holds: a successful receive).
type goSide struct {
	q   *qp
	cq  *cq
	mem []byte // the QP's and the CQ's C-side bytes
}

func newGoSide(tb testing.TB) *goSide {
	tb.Helper()
	if err := load(); err != nil {
		tb.Skip(err)
	}
	strncmp, strnlen := libcAddr("strncmp"), libcAddr("strnlen")
	g := &goSide{mem: make([]byte, 64)}
	g.mem[32] = 'x'
	c := &devContext{name: "goside", postSend: strncmp, postRecv: strncmp, pollCQ: strnlen,
		owners: map[uintptr]any{}, pds: map[*pd]struct{}{}, qpByNum: map[uint32]*qp{}}
	g.cq = &cq{ctx: c, p: uintptr(unsafe.Pointer(&g.mem[32]))}
	cp := driver.QPCap{MaxSendWR: 64, MaxRecvWR: 64, MaxSendSGE: 1, MaxRecvSGE: 1}
	g.q = &qp{pd: &pd{ctx: c}, ctx: c, p: uintptr(unsafe.Pointer(&g.mem[0])), num: 7, cap: cp, cqs: [2]*cq{g.cq, g.cq}}
	g.q.sqMarks = make([]uint64, cp.MaxSendWR)
	g.cq.prepare()
	g.q.prepare()
	g.q.state.Store(uint32(driver.QPSRTS))
	c.qpByNum[g.q.num] = g.q
	g.cq.wcs[0] = ibvWC{wrID: 0x100, status: uint32(driver.WCSuccess), opcode: uint32(driver.WCRecv), byteLen: 8, qpNum: g.q.num, srcQP: 9}
	return g
}

// BenchmarkGoSideSendLat is one side's iteration of send_lat, unsignaled
// (as most of perftest's are), through the provider with C functions that
// do nothing in place of the device's: PostSend of one Send, Poll of its
// peer's message, PostRecv of the receive that replaces it. Its
// instruction count (callgrind) is what the provider adds to the device's
// own work in each iteration.
func BenchmarkGoSideSendLat(b *testing.B) {
	g := newGoSide(b)
	buf := make([]byte, 8)
	sge := []driver.SGE{{Addr: uint64(uintptr(unsafe.Pointer(&buf[0]))), Length: 8, LKey: 1}}
	swr := []driver.SendWR{{WRID: 0x200, Opcode: driver.OpSend, SGList: sge}}
	rwr := []driver.RecvWR{{WRID: 0x100, SGList: sge}}
	wc := make([]driver.WorkCompletion, 1)
	b.ReportAllocs()
	for b.Loop() {
		if n, err := g.q.PostSend(swr); n != 1 {
			b.Fatal(err)
		}
		if g.cq.Poll(wc) != 1 || wc[0].Status != driver.WCSuccess || wc[0].Opcode != driver.WCRecv {
			b.Fatalf("poll: %+v", wc[0])
		}
		if n, err := g.q.PostRecv(rwr); n != 1 {
			b.Fatal(err)
		}
		if q := g.q; q.sqPosted.Load()-q.sqRetired.Load() == 32 {
			// What the signaled Send polled every cq_mod iterations
			// does: retire the unsignaled ones.
			q.sqRetired.Store(q.sqPosted.Load())
		}
	}
}

// BenchmarkGoSideWriteLat is one side's iteration of write_lat as goverbs
// bench runs it: PostSend of one signaled 8-byte RDMA Write, inline (as
// for sizes up to the inline limit) or not, and Poll of its completion,
// with the same stand-ins as BenchmarkGoSideSendLat (the scratch array
// holds the Write's successful completion).
func BenchmarkGoSideWriteLat(b *testing.B) {
	for _, bc := range []struct {
		name  string
		flags driver.SendFlags
	}{{"Inline", driver.SendSignaled | driver.SendInline}, {"NotInline", driver.SendSignaled}} {
		b.Run(bc.name, func(b *testing.B) {
			g := newGoSide(b)
			buf := make([]byte, 64)
			g.q.cap.MaxInlineData = 64
			g.q.pd.byLKey = map[uint32]*mr{}
			g.q.pd.addRegion(&mr{pd: g.q.pd, buf: buf, lkey: 1})
			g.q.prepare()
			g.cq.wcs[0] = ibvWC{wrID: 0x200, status: uint32(driver.WCSuccess), opcode: uint32(driver.WCRDMAWrite), qpNum: g.q.num}
			sge := []driver.SGE{{Addr: uint64(uintptr(unsafe.Pointer(&buf[56]))), Length: 8, LKey: 1}}
			wr := []driver.SendWR{{WRID: 0x200, Opcode: driver.OpRDMAWrite, Flags: bc.flags, SGList: sge, RemoteAddr: 0x1000, RKey: 2}}
			wc := make([]driver.WorkCompletion, 1)
			b.ReportAllocs()
			for b.Loop() {
				if n, err := g.q.PostSend(wr); n != 1 {
					b.Fatal(err)
				}
				if g.cq.Poll(wc) != 1 || wc[0].Status != driver.WCSuccess || wc[0].Opcode != driver.WCRDMAWrite {
					b.Fatalf("poll: %+v", wc[0])
				}
			}
			if q := g.q; q.sqPosted.Load() != q.sqRetired.Load() {
				b.Fatalf("%d send WRs posted, %d retired", q.sqPosted.Load(), q.sqRetired.Load())
			}
		})
	}
}

// TestGoSideAllocatesNothing: send_lat's and write_lat's iterations, a
// Send, an inline RDMA Write and a receive posted, and their completions
// polled, allocate nothing on the provider's side.
func TestGoSideAllocatesNothing(t *testing.T) {
	g := newGoSide(t)
	buf := make([]byte, 64)
	g.q.cap.MaxInlineData = 64
	g.q.pd.byLKey = map[uint32]*mr{}
	g.q.pd.addRegion(&mr{pd: g.q.pd, buf: buf, lkey: 1})
	g.q.prepare()
	sge := []driver.SGE{{Addr: uint64(uintptr(unsafe.Pointer(&buf[0]))), Length: 8, LKey: 1}}
	send := []driver.SendWR{{WRID: 0x200, Opcode: driver.OpSend, SGList: sge}}
	write := []driver.SendWR{{WRID: 0x300, Opcode: driver.OpRDMAWrite, Flags: driver.SendSignaled | driver.SendInline, SGList: sge, RemoteAddr: 0x1000, RKey: 2}}
	recv := []driver.RecvWR{{WRID: 0x100, SGList: sge}}
	wc := make([]driver.WorkCompletion, 1)
	var failure string
	allocs := testing.AllocsPerRun(200, func() {
		for _, wr := range [][]driver.SendWR{send, write} {
			if n, err := g.q.PostSend(wr); n != 1 && failure == "" {
				failure = fmt.Sprintf("PostSend of %v: %v", wr[0].Opcode, err)
			}
		}
		if g.cq.Poll(wc) != 1 && failure == "" {
			failure = "Poll took no completion"
		}
		if n, err := g.q.PostRecv(recv); n != 1 && failure == "" {
			failure = fmt.Sprintf("PostRecv: %v", err)
		}
		// What the completions of the signaled WRs would retire.
		g.q.sqRetired.Store(g.q.sqPosted.Load())
		g.q.sqHead, g.q.sqLen = 0, 0
	})
	if failure != "" {
		t.Fatal(failure)
	}
	if allocs != 0 {
		t.Fatalf("a Send, an inline Write, a Poll and a PostRecv allocate %v times, want 0", allocs)
	}
}

// BenchmarkGoSideEmptyPoll is a Poll of a CQ that holds nothing, what the
// spin loop of read_lat (and of every latency test between completions)
// repeats: strnlen, in place of the device's poll_cq, reads the CQ's
// bytes as an empty string and returns 0.
func BenchmarkGoSideEmptyPoll(b *testing.B) {
	g := newGoSide(b)
	g.mem[32] = 0
	wc := make([]driver.WorkCompletion, 1)
	b.ReportAllocs()
	for b.Loop() {
		if g.cq.Poll(wc) != 0 {
			b.Fatal("a Poll of an empty CQ took a completion")
		}
	}
}
