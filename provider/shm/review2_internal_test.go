package shm

import (
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// Regressions from the second adversarial review (1 December, night).

// spinSink keeps the busy loops below from being optimised away.
var spinSink atomic.Uint64

// TestPostRecvRacingDestroy: a PostRecv that read the QP's state before
// a concurrent Destroy published it is still writing the receive ring
// when Destroy unmaps the block that holds the ring; Destroy must wait
// it out (before the fix: a fault in recvRing.produce).
func TestPostRecvRacingDestroy(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	a := p.A
	rbuf := newRegion(t, p.A, 4096, verbs.AccessLocalWrite)
	const n = 1 << 13
	wrs := make([]verbs.RecvWR, n)
	for i := range wrs {
		wrs[i] = recv(uint64(i), rbuf.SGE(0, 64))
	}
	for it := range 100 {
		q, err := a.PD.CreateQP(verbs.QPInitAttr{SendCQ: a.SendCQ, RecvCQ: a.RecvCQ,
			Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: n, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if err := toInit(q); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		started := make(chan struct{})
		wg.Go(func() {
			close(started)
			q.PostRecv(wrs) // all of them, or ErrClosed: either is right
		})
		<-started
		for i := range it % 50 * 200 { // vary where in the post Destroy lands
			spinSink.Add(uint64(i))
		}
		if err := q.Destroy(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
	}
}

// TestWriteImmFailedCopyCompletesReceive: an RDMA Write with immediate
// takes the responder's receive before it copies; when the copy then
// fails (the target is process memory whose pages are gone), that
// receive must still complete — flushed, as the responder's QP moves to
// the error state — rather than vanish from the ring unreported.
func TestWriteImmFailedCopyCompletesReceive(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	b := p.B.(*verbstest.Local)
	buf, err := unix.Mmap(-1, 0, 1<<16, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	mr, err := b.PD.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		unix.Munmap(buf)
		t.Fatal(err)
	}
	defer mr.Dereg()
	addr := uint64(uintptr(unsafe.Pointer(&buf[0])))
	if err := unix.Munmap(buf); err != nil { // the registered pages go away
		t.Fatal(err)
	}
	rbuf := newRegion(t, p.B, 4096, verbs.AccessLocalWrite)
	postRecv(t, p.B, 0, recv(42, rbuf.SGE(0, 64)))
	src := newRegion(t, p.A, 4096, verbs.AccessLocalWrite)
	postSend(t, p.A, 0, verbs.SendWR{WRID: 1, Opcode: verbs.OpRDMAWriteWithImm, Flags: verbs.SendSignaled, Imm: 5,
		SGList: []verbs.SGE{src.SGE(0, 64)}, RemoteAddr: addr, RKey: mr.RKey()})
	expectWC(t, waitWCs(t, p.A, verbstest.SendCQ, 1)[0], 1, verbs.WCRemAccessErr)
	wc := waitWCs(t, p.B, verbstest.RecvCQ, 1)[0]
	expectWC(t, wc, 42, verbs.WCWRFlushErr)
}
