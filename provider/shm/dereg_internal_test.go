package shm

import (
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// TestDeregWhilePeerBusy: a Dereg of a region the peer may write while
// the peer's requester works through a long queue of 64 MiB Writes (into
// another region). The peer confirms between two WRs, not once its queue
// is done: it confirmed only when its QP's lock was free, and Dereg,
// tired of waiting, ended the connection and flushed the rest.
func TestDeregWhilePeerBusy(t *testing.T) {
	const n, k = 64 << 20, 48
	p := localHarness().NewPair(t, verbstest.PairOptions{Cap: verbs.QPCap{MaxSendWR: k, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}, CQDepth: 64})
	b := p.B.(*verbstest.Local)
	dst := allocMR(t, p.A.PD, n, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	other, err := p.A.PD.AllocMR(4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	src := allocMR(t, b.PD, n, verbs.AccessLocalWrite)
	wrs := make([]verbs.SendWR, k)
	for i := range wrs {
		wrs[i] = verbs.SendWR{WRID: uint64(i), Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
			SGList: []verbs.SGE{{Addr: src.Addr(), Length: n, LKey: src.LKey()}}, RemoteAddr: dst.Addr(), RKey: dst.RKey()}
	}
	posted := make(chan struct{})
	go func() {
		defer close(posted)
		b.QPs[0].PostSend(wrs)
	}()
	waitForFrame(t, "shm.(*qp).PostSend(")
	if err := other.Dereg(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-posted:
		t.Error("Dereg returned only once the peer's whole queue was done")
	default:
	}
	<-posted
	for _, wc := range waitWCs(t, p.B, verbstest.SendCQ, k) {
		if wc.Status != verbs.WCSuccess {
			t.Fatalf("Write %d of the busy peer completed with %v after the Dereg", wc.WRID, wc.Status)
		}
	}
}

// TestLocalDeregWhileTargetStopped: one-sided operations go on while the
// target process is stopped (SIGSTOP), and so they do after a Dereg of a
// region no peer can reach (no remote rights, no receive): Dereg asked
// every peer to confirm, and ended the connection to the stopped one.
func TestLocalDeregWhileTargetStopped(t *testing.T) {
	p := remoteHarness().NewPair(t, verbstest.PairOptions{})
	pid := verbstest.PeerPID(p.B)
	tgt := newRegion(t, p.B, 4096, verbs.AccessLocalWrite|verbs.RemoteAccess)
	src := newRegion(t, p.A, 4096, verbs.AccessLocalWrite)
	other, err := p.A.PD.AllocMR(4096, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGCONT) })
	var info unix.Siginfo
	if err := unix.Waitid(unix.P_PID, pid, &info, unix.WSTOPPED|unix.WNOWAIT, nil); err != nil {
		t.Fatal(err)
	}
	if err := other.Dereg(); err != nil {
		t.Fatal(err)
	}
	postSend(t, p.A, 0, rdma(10, verbs.OpRDMAWrite, src.SGE(0, 64), tgt, 0))
	wcs := waitWCs(t, p.A, verbstest.SendCQ, 1)
	if wcs[0].Status != verbs.WCSuccess {
		t.Errorf("Write to the stopped target after a local Dereg: %v", wcs[0].Status)
	}
}
