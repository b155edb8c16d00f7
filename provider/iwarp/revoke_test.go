package iwarp_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"runtime"
	"testing"
	"time"

	"github.com/goverbs/goverbs/provider/iwarp/wire"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

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

// TestNoReadResponseAfterDereg: the Read's sink is deregistered before
// its response arrives. The response is not placed, and the Read does
// not complete as a success into memory no longer registered.
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
