package iwarp_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/cm"

	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/provider/iwarp/wire"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// Regressions from an adversarial review of the receive path.

// TestPartialReadRequestHoldsNoReceive: a peer that sends a whole Send
// and then the first bytes of a Read Request, and stalls, cannot keep the
// Send's receive from completing (it was held back for the Read Request,
// to answer it first, until that FPDU was done).
func TestPartialReadRequestHoldsNoReceive(t *testing.T) {
	v := newVictim(t, 4)
	g := guard(t, v, 4096, verbs.AccessLocalWrite|verbs.RemoteAccess)
	h := dialHostile(t, v, false, false, false)
	if n, err := v.e.PostRecv(0, []verbs.RecvWR{{WRID: 5, SGList: []verbs.SGE{g.r.SGE(0, 64)}}}); n != 1 {
		t.Fatalf("post receive: %v", err)
	}
	send := h.fpdu(h.untagged(wire.OpSend, wire.QNSend, 32), bytes.Repeat([]byte{1}, 32))
	rr := h.readRequest(0, 0, 0)
	h.send(append(send, rr[:8]...))
	wcs, err := v.e.Completions(verbstest.RecvCQ, 1, 5*time.Second)
	if err != nil || len(wcs) != 1 || wcs[0].Status != verbs.WCSuccess || wcs[0].WRID != 5 {
		t.Fatalf("the Send arrived whole and its receive completed with %+v (%v), want a success", wcs, err)
	}
}

// TestAcceptSeesContextEnd: Accept returns when its context ends even
// while a client that connected says nothing (it waited out the MPA
// Request's 10 s setup timeout).
func TestAcceptSeesContextEnd(t *testing.T) {
	l, err := cm.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	silent, err := net.Dial("tcp", l.Addr()[len("tcp://"):])
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := l.Accept(ctx)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Accept: %v, want the context's end", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept did not return 5 s after its context ended")
	}
}

// waitPlaced waits until the first byte of region g reads b.
func waitPlaced(t *testing.T, v *victim, g guarded, b byte) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); runtime.Gosched() {
		if got, err := v.e.ReadRegion(g.r.ID, 0, 1); err == nil && got[0] == b {
			return
		}
	}
	t.Fatalf("the first byte of the region never became %#x", b)
}

// TestNoPlacementAfterDereg: an RDMA Write whose payload arrives in two
// parts, the region deregistered in between. Nothing of the second part
// is placed once Dereg has returned (the receiver kept reading straight
// into the region): the victim terminates the stream instead.
func TestNoPlacementAfterDereg(t *testing.T) {
	v := newVictim(t, 4)
	g := guard(t, v, 4096, verbs.AccessLocalWrite|verbs.RemoteAccess)
	h := dialHostile(t, v, false, false, false)
	const n = 3000
	f := h.write(g.r.RKey, g.r.Addr, append(bytes.Repeat([]byte{0xee}, 1000), bytes.Repeat([]byte{0xdd}, n-1000)...))
	h.send(f[:wire.TaggedLen+1000])
	waitPlaced(t, v, g, 0xee)
	if err := v.e.DeregRegion(g.r.ID); err != nil {
		t.Fatal(err)
	}
	h.send(f[wire.TaggedLen+1000:])
	h.expectTerminate(wire.LayerDDP, wire.DDPTaggedError, wire.DDPInvalidSTag)
	expectVictimError(t, v)
	b, _ := v.e.ReadRegion(g.r.ID, 0, 4096)
	if k := bytes.Count(b, []byte{0xdd}); k > 0 {
		t.Fatalf("%d bytes placed into the region after Dereg returned", k)
	}
}

// readFPDU reads the next FPDU the victim sends.
func (h *hostile) readFPDU() []byte {
	h.t.Helper()
	var l [2]byte
	if _, err := io.ReadFull(h.nc, l[:]); err != nil {
		h.t.Fatalf("read: %v", err)
	}
	n := int(binary.BigEndian.Uint16(l[:]))
	b := make([]byte, 2+n+wire.Pad(n)+wire.CRCLen)
	copy(b, l[:])
	if _, err := io.ReadFull(h.nc, b[2:]); err != nil {
		h.t.Fatalf("read: %v", err)
	}
	return b
}

// TestNoReadResponseAfterDereg: the Read's sink is deregistered before
// its response arrives. The response is not placed, and the Read does
// not complete as a success (it did, into memory no longer registered).
func TestNoReadResponseAfterDereg(t *testing.T) {
	v := newVictim(t, 4)
	g := guard(t, v, 4096, verbs.AccessLocalWrite|verbs.RemoteAccess)
	h := dialHostile(t, v, false, false, false)
	if n, err := v.e.PostSend(0, []verbs.SendWR{{WRID: 9, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{g.r.SGE(0, 64)}, RemoteAddr: 0x1000, RKey: 0x4242}}); n != 1 {
		t.Fatalf("post read: %v", err)
	}
	var rr wire.ReadRequest
	for rr == nil {
		if b := h.readFPDU(); !wire.Hdr(b).Tagged() && wire.Hdr(b).Opcode() == wire.OpReadRequest {
			rr = wire.ReadRequest(b)
		}
	}
	if err := v.e.DeregRegion(g.r.ID); err != nil {
		t.Fatal(err)
	}
	var hdr [wire.TaggedLen]byte
	wire.Hdr(hdr[:]).SetTagged(wire.OpReadResponse, true, rr.SinkSTag(), rr.SinkTO(), int(rr.Size()))
	h.send(h.fpdu(hdr[:], bytes.Repeat([]byte{0xdd}, int(rr.Size()))))
	wcs, err := v.e.Completions(verbstest.SendCQ, 1, 10*time.Second)
	if err != nil || len(wcs) != 1 || wcs[0].WRID != 9 || wcs[0].Status == verbs.WCSuccess {
		t.Fatalf("the Read completed with %+v (%v), want an error", wcs, err)
	}
	b, _ := v.e.ReadRegion(g.r.ID, 0, 4096)
	if k := bytes.Count(b, []byte{0xdd}); k > 0 {
		t.Fatalf("%d bytes placed into the region after Dereg returned", k)
	}
}

// TestNoPlacementAfterCloseFlush: a Send half received when the
// application disconnects. Close flushes the receive, and then lingers
// for its responses to go out (here for as long as it may: the peer
// reads nothing, and a 32 MiB Read Response fills the socket); the rest
// of the Send arriving meanwhile is not placed into the buffer whose
// flush completion the application already has.
func TestNoPlacementAfterCloseFlush(t *testing.T) {
	v := newVictim(t, 4)
	big := guard(t, v, 32<<20, verbs.AccessLocalWrite|verbs.RemoteAccess)
	g := guard(t, v, 4096, verbs.AccessLocalWrite|verbs.RemoteAccess)
	h := dialHostile(t, v, false, false, false)
	if n, err := v.e.PostRecv(0, []verbs.RecvWR{{WRID: 5, SGList: []verbs.SGE{g.r.SGE(0, 4096)}}}); n != 1 {
		t.Fatalf("post receive: %v", err)
	}
	h.send(h.readRequest(uint32(big.r.Len), big.r.RKey, big.r.Addr))
	const n = 3000
	f := h.fpdu(h.untagged(wire.OpSend, wire.QNSend, n), append(bytes.Repeat([]byte{0xee}, 1000), bytes.Repeat([]byte{0xdd}, n-1000)...))
	h.send(f[:wire.UntaggedLen+1000])
	waitPlaced(t, v, g, 0xee)
	closed := make(chan struct{})
	go func() {
		v.conn.Close()
		close(closed)
	}()
	wcs, err := v.e.Completions(verbstest.RecvCQ, 1, 10*time.Second)
	if err != nil || len(wcs) != 1 || wcs[0].Status != verbs.WCWRFlushErr {
		t.Fatalf("receive completion %+v (%v), want it flushed", wcs, err)
	}
	h.nc.Write(f[wire.UntaggedLen+1000:])
	<-closed
	b, _ := v.e.ReadRegion(g.r.ID, 0, 4096)
	if k := bytes.Count(b, []byte{0xdd}); k > 0 {
		t.Fatalf("%d bytes placed into the receive buffer after its flush completion", k)
	}
}

// TestSilentClientHoldsUpNoOther: a client that connects and says
// nothing does not hold up the one behind it (the listener read one MPA
// Request at a time, and waited out the silent one's 10 s).
func TestSilentClientHoldsUpNoOther(t *testing.T) {
	v := newVictim(t, 4)
	silent, err := net.Dial("tcp", v.l.Addr()[len("tcp://"):])
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	start := time.Now()
	dialHostile(t, v, false, false, false)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the connection behind a silent one was accepted after %v", d)
	}
}

// bigReadUnderWay has a hostile peer Read a victim's 32 MiB region and
// take the first FPDU of the response.
func bigReadUnderWay(t *testing.T) (*victim, guarded, *hostile) {
	t.Helper()
	v := newVictim(t, 4)
	big := guard(t, v, 32<<20, verbs.AccessLocalWrite|verbs.RemoteAccess)
	h := dialHostile(t, v, false, false, false)
	h.send(h.readRequest(uint32(big.r.Len), big.r.RKey, big.r.Addr))
	if b := h.readFPDU(); !wire.Hdr(b).Tagged() || wire.Hdr(b).Opcode() != wire.OpReadResponse {
		t.Fatalf("the victim sent %x, want a Read Response", b[:min(len(b), wire.TaggedLen)])
	}
	return v, big, h
}

// TestNoReadResponseFromDeregisteredRegion: the peer's Read of a 32 MiB
// region is under way, its socket full, when the region is deregistered
// and its memory reused. Nothing written to the memory after Dereg
// returns reaches the peer (the transmitter went on sending the rest of
// the response from it): the stream ends with a Terminate, or, when the
// peer takes nothing for 2 s, without.
func TestNoReadResponseFromDeregisteredRegion(t *testing.T) {
	v, big, h := bigReadUnderWay(t)
	t0 := time.Now()
	if err := v.e.DeregRegion(big.r.ID); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("Dereg took %v: it waits for the response in the socket for 2 s at most", d)
	}
	if err := v.e.WriteRegion(big.r.ID, 0, bytes.Repeat([]byte{0xdd}, big.r.Len)); err != nil {
		t.Fatal(err)
	}
	leaked := 0
	for {
		var l [2]byte
		if _, err := io.ReadFull(h.nc, l[:]); err != nil {
			break
		}
		n := int(binary.BigEndian.Uint16(l[:]))
		b := make([]byte, 2+n+wire.Pad(n)+wire.CRCLen)
		copy(b, l[:])
		if _, err := io.ReadFull(h.nc, b[2:]); err != nil {
			break
		}
		if wire.Hdr(b).Tagged() && wire.Hdr(b).Opcode() == wire.OpReadResponse && 2+n >= wire.TaggedLen {
			leaked += bytes.Count(b[wire.TaggedLen:2+n], []byte{0xdd})
		}
	}
	if leaked > 0 {
		t.Fatalf("%d bytes written to the region after its Dereg went out in the Read Response", leaked)
	}
	expectVictimError(t, v)
}

// TestPeerThatStopsReadingTimesOut: a peer that takes nothing more, yet
// whose TCP answers the zero-window probes (a stopped process), keeps a
// Write outstanding only for the QP's timeout and retries (here cm's
// Timeout 14 and RetryCnt 7: 0.55 s); the Write then completes with
// WCRetryExcErr and the QP fails (the Write stayed outstanding for good).
// The application busy-polls, so that the receive side may be the one the
// kernel tells of the timeout (the Write was then flushed instead).
func TestPeerThatStopsReadingTimesOut(t *testing.T) {
	defer iwarp.SetMinUserTimeout(0)()
	for range 3 {
		v := newVictim(t, 4)
		src := guard(t, v, 32<<20, verbs.AccessLocalWrite)
		dialHostile(t, v, false, false, false)
		if n, err := v.e.PostSend(0, []verbs.SendWR{{WRID: 7, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
			SGList: []verbs.SGE{src.r.SGE(0, src.r.Len)}, RemoteAddr: 0x1000, RKey: 0x4242}}); n != 1 {
			t.Fatalf("post write: %v", err)
		}
		wc := make([]verbs.WorkCompletion, 4)
		deadline := time.Now().Add(20 * time.Second)
		for v.e.SendCQ.Poll(wc) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the Write never completed")
			}
		}
		if wc[0].WRID != 7 || wc[0].Status != verbs.WCRetryExcErr {
			t.Fatalf("the Write completed with %+v, want a retry-exceeded error", wc[0])
		}
		expectVictimError(t, v)
	}
}

// TestSmallWriteToStoppedPeerTimesOut: a 64-byte Write whose bytes, and
// the Read that asks for its confirmation, the peer's TCP takes and
// acknowledges, but that nothing answers (the peer's process is
// stopped), completes with WCRetryExcErr after the QP's timeout: TCP's
// own timeout never fires, as nothing stays unacknowledged.
func TestSmallWriteToStoppedPeerTimesOut(t *testing.T) {
	defer iwarp.SetMinUserTimeout(0)()
	v := newVictim(t, 4)
	src := guard(t, v, 4096, verbs.AccessLocalWrite)
	dialHostile(t, v, false, false, false)
	if n, err := v.e.PostSend(0, []verbs.SendWR{{WRID: 7, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{src.r.SGE(0, 64)}, RemoteAddr: 0x1000, RKey: 0x4242}}); n != 1 {
		t.Fatalf("post write: %v", err)
	}
	wcs, err := v.e.Completions(verbstest.SendCQ, 1, 20*time.Second)
	if err != nil || len(wcs) != 1 || wcs[0].WRID != 7 || wcs[0].Status != verbs.WCRetryExcErr {
		t.Fatalf("the Write completed with %+v (%v), want a retry-exceeded error", wcs, err)
	}
	expectVictimError(t, v)
}

// TestDeregFailsTheReadItCuts: a Write, then a 32 MiB Read whose region
// the responder deregisters while the response goes out. The Read fails
// with a remote access error and the Write, which was placed, succeeds
// (the Terminate named no request, and the peer blamed the Write).
func TestDeregFailsTheReadItCuts(t *testing.T) {
	for range 3 {
		a, b, _, _ := connectPair(t, 1<<16, nil, nil)
		const size = 32 << 20
		big, err := b.pd.AllocMR(size, verbs.AccessLocalWrite|verbs.RemoteAccess)
		if err != nil {
			t.Fatal(err)
		}
		for i := range big.Bytes() {
			big.Bytes()[i] = 0x5a
		}
		sink, err := a.pd.AllocMR(size, verbs.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.qp.PostSend([]verbs.SendWR{
			{WRID: 1, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled, SGList: []verbs.SGE{a.mr.SGE(0, 64)},
				RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()},
			{WRID: 2, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled, SGList: []verbs.SGE{sink.SGE(0, size)},
				RemoteAddr: big.Addr(), RKey: big.RKey()},
		}); err != nil {
			t.Fatal(err)
		}
		// The response has begun arriving (the kernel's writes into the
		// sink are invisible to the race detector).
		sb := sink.Bytes()
		for deadline := time.Now().Add(10 * time.Second); sb[0] != 0x5a && time.Now().Before(deadline); {
			runtime.Gosched()
		}
		if err := big.Dereg(); err != nil {
			t.Fatal(err)
		}
		wcs := a.wait(t, 2)
		if wcs[0].WRID != 1 || wcs[0].Status != verbs.WCSuccess {
			t.Fatalf("the Write completed with %+v, want a success", wcs[0])
		}
		if wcs[1].WRID != 2 || (wcs[1].Status != verbs.WCRemAccessErr && wcs[1].Status != verbs.WCSuccess) {
			t.Fatalf("the Read completed with %+v, want a remote access error (or a success, had it ended first)", wcs[1])
		}
	}
}

// TestDeregTerminateSurvivesPeerTraffic: what the peer sends once the
// responder, cutting a Read short for a Dereg, has stopped receiving is
// read and dropped before the socket closes, so that the Terminate
// reaches the peer (closing with it unread reset the stream, and the
// Terminate was lost).
func TestDeregTerminateSurvivesPeerTraffic(t *testing.T) {
	v, big, h := bigReadUnderWay(t)
	done := make(chan error, 1)
	go func() { done <- v.e.DeregRegion(big.r.ID) }()
	expectVictimError(t, v) // receiving has stopped
	h.send(h.readRequest(0, 0, 0))
	term := h.expectTerminate(wire.LayerRDMAP, wire.RDMAPRemoteProtect, wire.RDMAPInvalidSTag)
	if wire.Hdr(term[wire.TerminateLen:]).Opcode() != wire.OpReadRequest {
		t.Fatalf("the Terminate names %v, want the Read Request", wire.Hdr(term[wire.TerminateLen:]).Opcode())
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestSlowPeerIsNotTimedOut: a healthy peer on a slow path (it reads the
// stream at some 6 MB/s, and answers each confirming Read at once) is
// not timed out while an 8 MiB Write, and the Read behind it, take longer
// than the QP's timeout (0.55 s) to reach it: they sit in the socket, and
// nothing comes from the peer meanwhile (the Write failed with
// WCRetryExcErr).
func TestSlowPeerIsNotTimedOut(t *testing.T) {
	defer iwarp.SetMinUserTimeout(0)()
	v := newVictim(t, 4)
	src := guard(t, v, 8<<20, verbs.AccessLocalWrite)
	h := dialHostile(t, v, false, false, false)
	if n, err := v.e.PostSend(0, []verbs.SendWR{{WRID: 7, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{src.r.SGE(0, src.r.Len)}, RemoteAddr: 0x1000, RKey: 0x4242}}); n != 1 {
		t.Fatalf("post write: %v", err)
	}
	done := make(chan []verbs.WorkCompletion, 1)
	go func() {
		wcs, _ := v.e.Completions(verbstest.SendCQ, 1, 15*time.Second)
		done <- wcs
	}()
	for {
		select {
		case wcs := <-done:
			if len(wcs) != 1 || wcs[0].WRID != 7 || wcs[0].Status != verbs.WCSuccess {
				t.Fatalf("the Write to a slow, healthy peer completed with %+v, want a success", wcs)
			}
			return
		default:
		}
		b := h.readFPDU()
		switch {
		case !wire.Hdr(b).Tagged() && wire.Hdr(b).Opcode() == wire.OpReadRequest:
			r := wire.ReadRequest(b)
			var hdr [wire.TaggedLen]byte
			wire.Hdr(hdr[:]).SetTagged(wire.OpReadResponse, true, r.SinkSTag(), r.SinkTO(), 0)
			h.send(h.fpdu(hdr[:], nil))
		case !wire.Hdr(b).Tagged() && wire.Hdr(b).Opcode() == wire.OpTerminate:
			t.Fatal("the victim terminated the stream")
		}
		time.Sleep(10 * time.Millisecond) // the slow path: some 64 KiB per 10 ms
	}
}

// TestDeregReturnsBeforeQuietPeerCloses: a Dereg that cuts a Read short
// returns soon after the Terminate is out (200 ms at most), though the
// peer keeps its side open (it waited for the peer to close, 2 s).
func TestDeregReturnsBeforeQuietPeerCloses(t *testing.T) {
	v, big, h := bigReadUnderWay(t)
	done := make(chan time.Duration, 1)
	start := time.Now()
	go func() {
		v.e.DeregRegion(big.r.ID)
		done <- time.Since(start)
	}()
	h.expectTerminate(wire.LayerRDMAP, wire.RDMAPRemoteProtect, wire.RDMAPInvalidSTag)
	if d := <-done; d > time.Second {
		t.Fatalf("Dereg returned %v after it began, its Terminate long out: it waited for the peer to close", d)
	}
}

// TestDeregCutsReadsOnAllConnectionsAtOnce: two peers Read the same
// 32 MiB region, then read nothing more. Dereg cuts both short at once,
// so it waits for peers that take nothing once (2 s), not once per
// connection.
func TestDeregCutsReadsOnAllConnectionsAtOnce(t *testing.T) {
	v := newVictimN(t, 4, 2)
	big := guard(t, v, 32<<20, verbs.AccessLocalWrite|verbs.RemoteAccess)
	for range 2 {
		h := dialHostile(t, v, false, false, false)
		h.send(h.readRequest(uint32(big.r.Len), big.r.RKey, big.r.Addr))
		if b := h.readFPDU(); !wire.Hdr(b).Tagged() || wire.Hdr(b).Opcode() != wire.OpReadResponse {
			t.Fatalf("the victim sent %x, want a Read Response", b[:min(len(b), wire.TaggedLen)])
		}
	}
	start := time.Now()
	if err := v.e.DeregRegion(big.r.ID); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3500*time.Millisecond {
		t.Fatalf("Dereg took %v: it cut the two Reads one after the other", d)
	}
}

// TestAcceptFailingAfterStartClosesOnce: an initiator that completes MPA
// but closes before its RTR ends the connection once it has started
// (Accept failed then, until it stopped waiting for the RTR). The
// connection's descriptors must be closed once: before the fix, both
// Accept's failure path and the receive goroutine closed the socket's,
// the second time under whoever had reused the number (here, the test's
// own descriptors, which a goroutine keeps opening).
func TestAcceptFailingAfterStartClosesOnce(t *testing.T) {
	maxFD := func() int {
		d, _ := os.ReadDir("/proc/self/fd")
		m := 0
		for _, e := range d {
			if n, err := strconv.Atoi(e.Name()); err == nil && n > m {
				m = n
			}
		}
		return m
	}
	v := newVictim(t, 4)
	h := dialHostile(t, v, false, false, true) // no RTR: the connection is started
	limit := maxFD()
	var stop atomic.Bool
	got := make(chan []int)
	go func() {
		var kept []int
		for !stop.Load() {
			fd, err := unix.Open("/dev/null", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				continue
			}
			if fd <= limit {
				kept = append(kept, fd) // a number the victim freed
			} else {
				unix.Close(fd)
			}
		}
		got <- kept
	}()
	h.nc.Close()
	if err := <-v.accepted; err == nil {
		select {
		case <-v.conn.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the connection goes on after the initiator closed before its RTR")
		}
	}
	stop.Store(true)
	kept := <-got
	for _, fd := range kept {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			t.Errorf("descriptor %d, opened by the test, was closed under it: %v", fd, err)
		} else {
			unix.Close(fd)
		}
	}
}

// TestNoDescriptorLeakAfterDestroyOrReset: QPs destroyed without a
// disconnect, and connections the peer resets, leave no descriptor open.
func TestNoDescriptorLeakAfterDestroyOrReset(t *testing.T) {
	for _, mode := range []string{"destroy", "reset"} {
		round := func() {
			t.Run(mode, func(t *testing.T) {
				if mode == "destroy" {
					a, b, _, _ := connectPair(t, 4096, nil, nil)
					for _, e := range []*pairEnd{a, b} {
						if err := e.qp.Destroy(); err != nil {
							t.Fatal(err)
						}
					}
					return
				}
				v := newVictim(t, 4)
				h := dialHostile(t, v, false, false, false)
				h.nc.(*net.TCPConn).SetLinger(0) // close with a reset
				h.nc.Close()
				select {
				case <-v.conn.Done():
				case <-time.After(5 * time.Second):
					t.Fatal("the connection did not end after the peer reset it")
				}
				if err := v.e.QPs[0].Destroy(); err != nil {
					t.Fatal(err)
				}
			})
		}
		leavesNoDescriptor(t, mode, 10, round)
	}
}

// TestConcurrentAbortWaitsForWriter: while one abort (a Close, Destroy or
// Modify to the error state) waits for a system call announced on the
// socket (a writev between sock.enter and its call), the receive
// goroutine ends (a poller's kick finds the connection aborted). Its own
// abort must wait too: rxLoop closes the socket's descriptor right after
// it, which would leave the writev to run on a closed, or reused,
// descriptor number. Before the fix, the second abort returned at once
// and the descriptor was closed under the writer in every run.
func TestConcurrentAbortWaitsForWriter(t *testing.T) {
	_, b, _, _ := connectPair(t, 4096, nil, nil)
	fd, aborted, end, ok := iwarp.AbortWithSocketCallHeld(b.qp.Driver())
	if !ok {
		t.Fatal("no live connection to hold a system call on")
	}
	// Nothing signals that the descriptor was not closed: look for a while
	// (the receive goroutine, unblocked, ends within microseconds).
	for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); runtime.Gosched() {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			t.Errorf("descriptor %d closed while a system call on it was announced: %v", fd, err)
			break
		}
	}
	select {
	case <-aborted:
		t.Error("the first abort returned while a system call on the socket was announced")
	default:
	}
	end()
	<-aborted
}

// TestPeerThatNeverAnswersTimesOut: a peer that keeps sending (RDMA
// Writes of 64 KiB every millisecond) but never answers a Read keeps it
// outstanding only for a few of the QP's timeouts (here 0.55 s), once it
// has sent more than any healthy peer can have queued ahead of an answer
// (answerSlack): the Read then completes with WCRetryExcErr and the QP
// fails. (The peer's traffic used to keep the Read outstanding for good:
// only silence timed a request out.)
func TestPeerThatNeverAnswersTimesOut(t *testing.T) {
	defer iwarp.SetMinUserTimeout(0)()
	v := newVictim(t, 4)
	sink := guard(t, v, 4096, verbs.AccessLocalWrite)
	const chunk = 16 << 10
	target := guard(t, v, chunk, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	h := dialHostile(t, v, false, false, false)
	if n, err := v.e.PostSend(0, []verbs.SendWR{{WRID: 7, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{sink.r.SGE(0, 64)}, RemoteAddr: 0x1000, RKey: 0x4242}}); n != 1 {
		t.Fatalf("post read: %v", err)
	}
	done := make(chan []verbs.WorkCompletion, 1)
	go func() {
		wcs, _ := v.e.Completions(verbstest.SendCQ, 1, 30*time.Second)
		done <- wcs
	}()
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	write := h.write(target.r.RKey, target.r.Addr, bytes.Repeat([]byte{0xa5}, chunk))
	sent := 0
	for {
		select {
		case wcs := <-done:
			if len(wcs) != 1 || wcs[0].WRID != 7 || wcs[0].Status != verbs.WCRetryExcErr {
				t.Fatalf("the unanswered Read completed with %+v, want a retry-exceeded error", wcs)
			}
			t.Logf("the Read timed out after %v, the peer having sent %d MiB meanwhile", time.Since(start).Round(time.Millisecond), sent>>20)
			if sent <= iwarp.AnswerSlack {
				t.Fatalf("the peer sent only %d bytes before the timeout, no more than AnswerSlack (%d): the test did not keep it talking", sent, iwarp.AnswerSlack)
			}
			expectVictimError(t, v)
			return
		case <-tick.C:
			for range 4 {
				if _, err := h.nc.Write(write); err != nil {
					break
				}
				sent += chunk
			}
		}
	}
}

// slowProxy forwards a TCP connection to server: what the client sends
// at full speed, what the server sends at rate bytes a second, read from
// the server no faster, so that the server's data waits in its own
// socket as on a slow path.
func slowProxy(t *testing.T, server string, rate int) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) {
				unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 64<<10)
			})
		}}
		s, err := d.Dial("tcp", server)
		if err != nil {
			c.Close()
			return
		}
		t.Cleanup(func() { c.Close(); s.Close() })
		go io.Copy(s, c)
		go func() {
			buf := make([]byte, 4096)
			next := time.Now()
			for {
				n, err := s.Read(buf)
				if n > 0 {
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
				if err != nil {
					return
				}
				next = next.Add(time.Duration(n) * time.Second / time.Duration(rate)) // pacing, not synchronisation
				time.Sleep(time.Until(next))
			}
		}()
	}()
	return l.Addr().String()
}

// TestSlowPathReadBehindWrites: a healthy goverbs peer W on a slow path
// (256 KB/s towards the requester R) has 1 MiB of RDMA Writes queued for
// R when R posts a 64-byte Read of W. W's Read Response waits, in W's
// transmitter and socket, behind its Writes, while R receives W's Writes
// steadily and no answer: for longer than answerStalls of R's timeouts
// (0.55 s), yet less than answerSlack bytes. The Read succeeds.
func TestSlowPathReadBehindWrites(t *testing.T) {
	defer iwarp.SetMinUserTimeout(0)()
	opts := verbstest.PairOptions{}.Defaults()
	w, err := verbstest.NewLocal("tcp0", opts, false)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	r, err := verbstest.NewLocal("tcp0", opts, false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	l, err := cm.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	acc := make(chan error, 1)
	go func() { acc <- w.Accept(l, opts) }()
	if err := r.Dial("tcp://"+slowProxy(t, l.Addr()[len("tcp://"):], 256<<10), opts); err != nil {
		t.Fatal(err)
	}
	if err := <-acc; err != nil {
		t.Fatal(err)
	}
	// W's own timeout is long (Timeout 20: 34 s): only R's is under test.
	for _, m := range []struct {
		a    verbs.QPAttr
		mask verbs.QPAttrMask
	}{
		{verbs.QPAttr{State: verbs.QPSSQD}, verbs.QPAttrState},
		{verbs.QPAttr{State: verbs.QPSSQD, Timeout: 20}, verbs.QPAttrState | verbs.QPAttrTimeout},
		{verbs.QPAttr{State: verbs.QPSRTS}, verbs.QPAttrState},
	} {
		if err := w.QPs[0].Modify(&m.a, m.mask); err != nil {
			t.Fatal(err)
		}
	}
	const wlen, nw = 256 << 10, 4
	src, err := w.NewRegion(wlen, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	dst, err := r.NewRegion(wlen, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	sink, err := r.NewRegion(64, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteRegion(src.ID, 0, bytes.Repeat([]byte{0x5a}, wlen)); err != nil {
		t.Fatal(err)
	}
	var wrs []verbs.SendWR
	for i := range nw {
		wrs = append(wrs, verbs.SendWR{WRID: uint64(i), Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
			SGList: []verbs.SGE{src.SGE(0, wlen)}, RemoteAddr: dst.Addr, RKey: dst.RKey})
	}
	if n, err := w.PostSend(0, wrs); n != nw {
		t.Fatalf("post the Writes: %d, %v", n, err)
	}
	// The Read goes once the Writes have begun to arrive.
	for deadline := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
		b, err := r.ReadRegion(dst.ID, 0, 1)
		if err != nil {
			t.Fatal(err)
		}
		if b[0] == 0x5a {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no Write arrived")
		}
	}
	start := time.Now()
	if n, err := r.PostSend(0, []verbs.SendWR{{WRID: 99, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{sink.SGE(0, 64)}, RemoteAddr: src.Addr, RKey: src.RKey}}); n != 1 {
		t.Fatalf("post the Read: %v", err)
	}
	wcs, err := r.Completions(verbstest.SendCQ, 1, 60*time.Second)
	if err != nil || len(wcs) != 1 {
		t.Fatalf("the Read: %v, %v", wcs, err)
	}
	t.Logf("the Read completed with %v after %v", wcs[0].Status, time.Since(start).Round(time.Millisecond))
	if wcs[0].Status != verbs.WCSuccess {
		t.Fatalf("the Read of a healthy peer on a slow path completed with %v", wcs[0].Status)
	}
	wwcs, err := w.Completions(verbstest.SendCQ, nw, 60*time.Second)
	if err != nil || len(wwcs) != nw {
		t.Fatalf("the Writes: %d completions, %v", len(wwcs), err)
	}
	for _, wc := range wwcs {
		if wc.Status != verbs.WCSuccess {
			t.Fatalf("Write %d completed with %v", wc.WRID, wc.Status)
		}
	}
}
