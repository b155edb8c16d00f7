package shm

import (
	"context"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/driver"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// oldPeer is what the peer of a QP's connection keeps of it after the QP
// is reset, as a hostile peer that ignores being told to drop its
// mappings would: its own mappings of the QP's block (header, receive
// ring, receive completion ring) and of its grant table.
type oldPeer struct {
	block, grants []byte
	recv          *recvRing
	cring         *cqRing
	keys          *keyTable
}

// mapLikePeer maps q's block and grant table as its peer does.
func mapLikePeer(t *testing.T, q *qp) *oldPeer {
	t.Helper()
	block, err := unix.Mmap(q.block.fd, 0, len(q.block.mem), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	grants, err := unix.Mmap(q.grantsRO, 0, len(q.grantSeg.mem), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unix.Munmap(block)
		unix.Munmap(grants)
	})
	sges := int(q.cap.MaxRecvSGE)
	pad := blockPad(q.num)
	return &oldPeer{block: block, grants: grants, recv: viewRecvRing(block[pad:], q.rqN, sges),
		cring: viewCQRing(block[pad+recvCQOffset(q.rqN, sges):], q.recvCQ.n),
		keys:  viewKeyTable(grants, maxKeys, grantRotation(q.num))}
}

// TestResetLeavesOldPeerNothing: A's QP is connected to B, moved to the
// error state and Reset, and connected to B again. The peer of the first
// connection kept its mappings of A's QP; through them it finds neither
// the keys A grants the new peer nor the receives A posts for it, and
// what it writes there — receive ring, header, completions — reaches
// neither A nor the new connection, whose Send lands in A's receive and
// completes with A's WRID.
func TestResetLeavesOldPeerNothing(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	aq := driverQP(p.A.QPs[0])
	old := mapLikePeer(t, aq)

	for _, e := range []verbstest.Endpoint{p.A, p.B} {
		for _, st := range []verbs.QPState{verbs.QPSErr, verbs.QPSReset} {
			if err := e.SetQPState(0, st); err != nil {
				t.Fatalf("move QP to %v: %v", st, err)
			}
		}
	}
	pollAll(p)
	addr := uniqueAddr("reset")
	if err := p.B.Relisten(0, addr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	c, err := cm.Dial(ctx, addr, p.A.QPs[0], nil)
	cancel()
	if err != nil {
		t.Fatalf("dial again: %v", err)
	}
	defer c.Close()
	if err := p.B.Reaccepted(); err != nil {
		t.Fatalf("accept again: %v", err)
	}

	granted := newRegion(t, p.A, 64, verbs.AccessLocalWrite|verbs.RemoteAccess)
	buf := newRegion(t, p.A, 64, verbs.AccessLocalWrite)
	postRecv(t, p.A, 0, recv(42, buf.SGE(0, 16)))
	if _, ok := old.keys.lookup(granted.RKey); ok {
		t.Fatal("the old peer's grant table names a key granted to the new connection")
	}
	if keysIn(old.grants)[buf.LKey] {
		t.Fatal("the old peer's grant table names the new connection's receive buffer")
	}
	var e recvEntry
	if ok, _ := old.recv.consume(&e); ok {
		t.Fatalf("the old peer took a receive posted for the new connection: %+v", e)
	}
	// Scribbles of the old peer: a receive of its own making, the header's
	// state and indices, and a completion of the receive just posted.
	old.recv.h.state.Store(uint32(driver.QPSErr))
	old.recv.h.head.Store(7)
	old.recv.h.tail.Store(9)
	if old.cring != nil {
		old.cring.produce(&driver.WorkCompletion{WRID: 0, Opcode: driver.WCRecv, ByteLen: 16}, nil)
	}
	if got := pollAll(p); len(got) != 0 {
		t.Fatalf("A polled completions the old peer wrote: %+v", got)
	}

	src := newRegion(t, p.B, 16, verbs.AccessLocalWrite)
	fill(t, p.B, src, 0, pattern(9, 16))
	postSend(t, p.B, 0, send(43, src.SGE(0, 16)))
	wcs := waitWCs(t, p.A, verbstest.RecvCQ, 1)
	if wcs[0].WRID != 42 || wcs[0].Status != verbs.WCSuccess || wcs[0].ByteLen != 16 {
		t.Fatalf("the new connection's Send completed A's receive as %+v; want WRID 42, 16 bytes", wcs[0])
	}
	if got := contents(t, p.A, buf, 0, 16); string(got) != string(pattern(9, 16)) {
		t.Fatal("the new connection's Send did not land in A's receive")
	}
}

// TestDestroyLeavesOldPeerNothing: A's two QPs complete receives into one
// CQ. QP 0 is destroyed; its peer, keeping its mappings, writes a
// completion into QP 0's ring: A's CQ never hands it out, and QP 1 goes
// on receiving.
func TestDestroyLeavesOldPeerNothing(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{QPs: 2})
	buf := newRegion(t, p.A, 64, verbs.AccessLocalWrite)
	postRecv(t, p.A, 0, recv(50, buf.SGE(0, 16)))
	old := mapLikePeer(t, driverQP(p.A.QPs[0]))
	if err := p.A.QPs[0].Destroy(); err != nil {
		t.Fatal(err)
	}
	if !old.cring.produce(&driver.WorkCompletion{WRID: 0, Opcode: driver.WCRecv, ByteLen: 16}, nil) {
		t.Fatal("the old ring is full")
	}
	if got := pollAll(p); len(got) != 0 {
		t.Fatalf("A polled completions written into a destroyed QP's ring: %+v", got)
	}
	postRecv(t, p.A, 1, recv(51, buf.SGE(16, 16)))
	src := newRegion(t, p.B, 16, verbs.AccessLocalWrite)
	postSend(t, p.B, 1, send(52, src.SGE(0, 16)))
	if w := waitWCs(t, p.A, verbstest.RecvCQ, 1)[0]; w.WRID != 51 || w.QPNum != p.A.QPNum(1) {
		t.Fatalf("QP 1's receive completed as %+v; want receive 51 on QP %#x", w, p.A.QPNum(1))
	}
}
