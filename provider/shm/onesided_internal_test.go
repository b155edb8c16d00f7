package shm

import (
	"bytes"
	"encoding/binary"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// TestOneSidedWhileTargetStopped: RDMA Writes, Reads, FetchAndAdd,
// CompareAndSwap, Sends and Writes with immediate all complete while the
// target process is stopped with SIGSTOP: the initiator does the work
// itself, in the target's shared memory, and writes the target's receive
// completions into the target's CQ. After SIGCONT the target finds the
// written bytes, the atomics' results, the message and both receive
// completions.
// Nothing touches the target's memory before it stops: the target pushed
// its shareable segments to the requester when they became shareable, so
// even a first access needs nothing from the target.
func TestOneSidedWhileTargetStopped(t *testing.T) {
	p := remoteHarness().NewPair(t, verbstest.PairOptions{})
	pid := verbstest.PeerPID(p.B)
	if pid == 0 {
		t.Fatal("B is not in a child process")
	}
	const (
		faaOff   = 0
		casOff   = 8
		writeOff = 1024
		immOff   = 1600
		readOff  = 2048
		n        = 512
	)
	tgt := newRegion(t, p.B, 4096, verbs.AccessLocalWrite|verbs.RemoteAccess)
	fill(t, p.B, tgt, readOff, pattern(1, n))
	fill(t, p.B, tgt, faaOff, word(1000))
	fill(t, p.B, tgt, casOff, word(5))
	rbuf := newRegion(t, p.B, 256, verbs.AccessLocalWrite)
	postRecv(t, p.B, 0, recv(101, rbuf.SGE(64, 64)), recv(102, rbuf.SGE(128, 64)))

	src := newRegion(t, p.A, 4096, verbs.AccessLocalWrite)
	dst := newRegion(t, p.A, 4096, verbs.AccessLocalWrite)
	fill(t, p.A, src, 0, pattern(2, n))
	fill(t, p.A, src, 1024, pattern(3, 64))
	fill(t, p.A, src, 2048, pattern(4, 16))

	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	// Wait, in the kernel, until the child has stopped.
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, pid, &info, unix.WSTOPPED|unix.WNOWAIT, nil); err != nil {
		t.Fatalf("waitid for the stop: %v", err)
	}
	if s, err := procState(pid); err != nil || s != 'T' {
		t.Fatalf("target process state %c (%v), want T (stopped)", s, err)
	}

	imm := rdma(15, verbs.OpRDMAWriteWithImm, src.SGE(2048, 16), tgt, immOff)
	imm.Imm = 0xabc
	postSend(t, p.A, 0,
		rdma(10, verbs.OpRDMAWrite, src.SGE(0, n), tgt, writeOff),
		rdma(11, verbs.OpRDMARead, dst.SGE(0, n), tgt, readOff),
		atomicWR(12, verbs.OpAtomicFetchAndAdd, dst.SGE(1024, 8), tgt, faaOff, 5, 0),
		atomicWR(13, verbs.OpAtomicCmpAndSwp, dst.SGE(1032, 8), tgt, casOff, 5, 77),
		send(14, src.SGE(1024, 64)),
		imm)
	wcs := waitWCs(t, p.A, verbstest.SendCQ, 6)
	if s, err := procState(pid); err != nil || s != 'T' {
		t.Fatalf("target process state %c (%v) after the completions, want T (still stopped)", s, err)
	}
	for i, wc := range wcs {
		expectWC(t, wc, uint64(10+i), verbs.WCSuccess)
	}
	if got := contents(t, p.A, dst, 0, n); !bytes.Equal(got, pattern(1, n)) {
		t.Fatal("RDMA Read from the stopped target returned wrong bytes")
	}
	if old := binary.NativeEndian.Uint64(contents(t, p.A, dst, 1024, 8)); old != 1000 {
		t.Fatalf("FetchAndAdd returned %d, want 1000", old)
	}
	if old := binary.NativeEndian.Uint64(contents(t, p.A, dst, 1032, 8)); old != 5 {
		t.Fatalf("CompareAndSwap returned %d, want 5", old)
	}

	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// The target, running again, finds everything in place.
	if got := contents(t, p.B, tgt, writeOff, n); !bytes.Equal(got, pattern(2, n)) {
		t.Fatal("the target does not hold the bytes written while it was stopped")
	}
	if got := contents(t, p.B, tgt, immOff, 16); !bytes.Equal(got, pattern(4, 16)) {
		t.Fatal("the target does not hold the bytes of the Write with immediate")
	}
	if v := binary.NativeEndian.Uint64(contents(t, p.B, tgt, faaOff, 8)); v != 1005 {
		t.Fatalf("the target's FetchAndAdd word holds %d, want 1005", v)
	}
	if v := binary.NativeEndian.Uint64(contents(t, p.B, tgt, casOff, 8)); v != 77 {
		t.Fatalf("the target's CompareAndSwap word holds %d, want 77", v)
	}
	rwcs := waitWCs(t, p.B, verbstest.RecvCQ, 2)
	expectWC(t, rwcs[0], 101, verbs.WCSuccess)
	if rwcs[0].Opcode != verbs.WCRecv || rwcs[0].ByteLen != 64 {
		t.Fatalf("receive completion %+v, want a 64-byte receive", rwcs[0])
	}
	expectWC(t, rwcs[1], 102, verbs.WCSuccess)
	if rwcs[1].Opcode != verbs.WCRecvRDMAWithImm || rwcs[1].Imm != 0xabc || rwcs[1].Flags&verbs.WCWithImm == 0 {
		t.Fatalf("receive completion %+v, want a Write with immediate 0xabc", rwcs[1])
	}
	if got := contents(t, p.B, rbuf, 64, 64); !bytes.Equal(got, pattern(3, 64)) {
		t.Fatal("the target's receive buffer does not hold the message sent while it was stopped")
	}
	expectCanaries(t, p.B, tgt, rbuf)
	expectCanaries(t, p.A, src, dst)
}
