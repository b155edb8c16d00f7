package iwarp_test

import (
	"encoding/binary"
	"io"
	"testing"
	"time"

	"github.com/goverbs/goverbs/provider/iwarp/wire"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// sendInv is a Send with Invalidate of stag, with no payload, as the
// peer's next Send.
func (h *hostile) sendInv(stag uint32) []byte {
	inv := h.untagged(wire.OpSendInv, wire.QNSend, 0)
	binary.BigEndian.PutUint32(inv[4:], stag)
	return h.fpdu(inv, nil)
}

// TestSendInvalidateOfLocalKeyRefused: a region that grants no remote
// access has a local key only, and a peer may not revoke it with a Send
// with Invalidate (the application's own receive buffers would then
// fail).
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
