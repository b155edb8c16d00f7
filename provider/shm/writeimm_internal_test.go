package shm

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

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
