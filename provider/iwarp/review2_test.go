package iwarp_test

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/provider/iwarp/wire"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// Regressions from the second adversarial review (1 December, night).

// flood has h send zero-length RDMA Writes (which name no STag) as fast
// as it can, until stop closes; the returned channel closes when it has
// stopped.
func flood(h *hostile, stop chan struct{}) chan struct{} {
	done := make(chan struct{})
	burst := bytes.Repeat(h.write(0, 0, nil), 1<<16)
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			h.nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			if _, err := h.nc.Write(burst); err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					continue
				}
				return
			}
		}
	}()
	return done
}

// untilFrames waits until q's connection has received more than n FPDUs.
func untilFrames(t *testing.T, v *victim, n uint64) {
	t.Helper()
	q := v.e.QPs[0].Driver()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for iwarp.FramesReceived(q) <= n {
		if time.Now().After(deadline) {
			t.Fatalf("the flood never reached the victim (%d FPDUs)", iwarp.FramesReceived(q))
		}
		<-tick.C
	}
}

// TestCloseWhilePeerFloods: a peer that keeps the socket full must not
// keep a disconnect waiting: the receive goroutine's rounds are bounded
// (rxBudget), so Close gets the receive lock it takes to stop receiving.
func TestCloseWhilePeerFloods(t *testing.T) {
	v := newVictim(t, 4)
	h := dialHostile(t, v, false, false, false)
	go io.Copy(io.Discard, h.nc)
	stop := make(chan struct{})
	fdone := flood(h, stop)
	defer func() {
		close(stop)
		h.nc.Close()
		<-fdone
	}()
	untilFrames(t, v, 100000)
	closed := make(chan struct{})
	go func() { v.conn.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return within 10 s while the peer streamed zero-length Writes")
	}
}

// TestDeregWhilePeerFloods: the same for a Dereg that must cut a Read
// Response still owed from the region (revokeRead takes the receive
// lock too).
func TestDeregWhilePeerFloods(t *testing.T) {
	v := newVictim(t, 4)
	g := guard(t, v, 32<<20, verbs.AccessLocalWrite|verbs.RemoteAccess)
	h := dialHostile(t, v, false, false, false)
	h.send(h.readRequest(uint32(g.r.Len), g.r.RKey, g.r.Addr)) // an answer the peer does not read yet
	stop := make(chan struct{})
	fdone := flood(h, stop)
	untilFrames(t, v, 100000)
	done := make(chan error, 1)
	go func() { done <- v.e.DeregRegion(g.r.ID) }()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Error("Dereg did not return within 10 s while the peer streamed zero-length Writes")
		close(stop)
		go io.Copy(io.Discard, h.nc)
		h.nc.Close()
		err = <-done
	}
	if err != nil {
		t.Errorf("Dereg: %v", err)
	}
	select {
	case <-stop:
	default:
		close(stop)
		h.nc.Close()
	}
	<-fdone
}

// sendInv is a Send with Invalidate of stag, with no payload, as the
// peer's next Send.
func (h *hostile) sendInv(stag uint32) []byte {
	inv := h.untagged(wire.OpSendInv, wire.QNSend, 0)
	binary.BigEndian.PutUint32(inv[4:], stag)
	return h.fpdu(inv, nil)
}

// TestSendInvalidateOfLocalKeyRefused: a region that grants no remote
// access has a local key only, and a peer may not revoke it with a Send
// with Invalidate (before the fix it could, and the application's own
// receive buffers then failed).
func TestSendInvalidateOfLocalKeyRefused(t *testing.T) {
	v := newVictim(t, 4)
	rb := guard(t, v, 64, verbs.AccessLocalWrite)
	h := dialHostile(t, v, false, false, false)
	if n, err := v.e.PostRecv(0, []verbs.RecvWR{{WRID: 5, SGList: []verbs.SGE{rb.r.SGE(0, 8)}}}); n != 1 {
		t.Fatalf("post receive: %v", err)
	}
	h.send(h.sendInv(rb.r.LKey))
	h.expectTerminate(wire.LayerRDMAP, wire.RDMAPRemoteOperation, wire.RDMAPCannotInvalidate)
	expectVictimError(t, v)
	wcs, err := v.e.Completions(verbstest.RecvCQ, 1, 10*time.Second)
	if err != nil || len(wcs) != 1 {
		t.Fatalf("receive completions: %+v, %v", wcs, err)
	}
	if wcs[0].Status == verbs.WCSuccess || wcs[0].Flags&verbs.WCWithInv != 0 {
		t.Fatalf("the Send invalidating a local key completed %+v; want an error, no invalidation", wcs[0])
	}
	rb.intact(t, v, 0, 0)
}

// TestSendInvalidateWithReadResponseOwed: a Send with Invalidate of a
// region with a Read Response still owed from it must not leave that
// response at the head of the queue for good, holding back every later
// response and Terminate: the response is cut short with a Terminate, or
// was sent whole before the invalidation; either way the Terminate for a
// forged Write that follows goes out.
func TestSendInvalidateWithReadResponseOwed(t *testing.T) {
	v := newVictim(t, 4)
	g := guard(t, v, 4096, verbs.AccessLocalWrite|verbs.RemoteAccess)
	rb := guard(t, v, 64, verbs.AccessLocalWrite)
	h := dialHostile(t, v, false, false, false)
	if n, err := v.e.PostRecv(0, []verbs.RecvWR{{WRID: 5, SGList: []verbs.SGE{rb.r.SGE(0, 8)}}}); n != 1 {
		t.Fatalf("post receive: %v", err)
	}
	h.send(append(h.readRequest(4096, g.r.RKey, g.r.Addr), h.sendInv(g.r.RKey)...))
	h.send(h.write(g.r.RKey^0xdead0000, g.r.Addr, []byte("x")))
	terms := make(chan bool, 1)
	go func() {
		for {
			var l [2]byte
			if _, err := io.ReadFull(h.nc, l[:]); err != nil {
				terms <- false
				return
			}
			n := int(binary.BigEndian.Uint16(l[:]))
			b := make([]byte, 2+n+wire.Pad(n)+wire.CRCLen)
			copy(b, l[:])
			if _, err := io.ReadFull(h.nc, b[2:]); err != nil {
				terms <- false
				return
			}
			if n >= wire.TaggedLen-2 && wire.Hdr(b).Opcode() == wire.OpTerminate {
				terms <- true
				return
			}
		}
	}()
	select {
	case ok := <-terms:
		if !ok {
			t.Fatal("the victim ended the stream without a Terminate")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no Terminate within 10 s: the Read Response of the invalidated region holds the queue")
	}
	expectVictimError(t, v)
	g.intact(t, v, 0, 0)
}

// TestMalformedFirstFPDUGetsTerminate: the accepting side sends nothing
// before the first FPDU arrives; a first FPDU that is malformed (here an
// unknown opcode, with no RTR negotiated) must still get its Terminate
// rather than a silent close after terminateTimeout.
func TestMalformedFirstFPDUGetsTerminate(t *testing.T) {
	v := newVictim(t, 4)
	h := dialHostile(t, v, false, false, true)
	b := h.untagged(wire.OpSend, wire.QNSend, 0)
	b[3] = b[3]&^0xf | 0xd // an opcode RDMAP does not define
	h.send(h.fpdu(b, nil))
	h.expectTerminate(wire.LayerRDMAP, wire.RDMAPRemoteOperation, wire.RDMAPUnexpectedOpcode)
	h.nc.Close() // the victim drains until the peer closes
	<-v.accepted
}
