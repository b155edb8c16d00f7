package shm

import (
	"bytes"
	"testing"

	"github.com/goverbs/goverbs/internal/sglist"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/driver"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// Sends of at most inlineMax bytes travel in their receive completion and
// the receiver's Poll places them; longer ones, and those into receives
// of more than recSGEs buffers, the sender copies into the buffers. The
// receiver believes no length the peer wrote beyond its own record of
// the receive and the slot's room.

// lastSlot is the completion slot of A's QP i that Poll took last.
func lastSlot(p *verbstest.Pair, i int) *cqSlot {
	r := driverQP(p.A.QPs[i]).sh.cring
	return &r.slots[(r.head-1)&r.mask]
}

// TestInlineSendPlaced: Sends of every size around inlineMax land whole,
// in receives of one, two and three buffers, with nothing written around
// them; those of at most inlineMax bytes into at most recSGEs buffers
// came inline, the others did not.
func TestInlineSendPlaced(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 3}})
	const room = 3 * 100
	src := newRegion(t, p.B, room, verbs.AccessLocalWrite)
	dst := newRegion(t, p.A, room+64, verbs.AccessLocalWrite)
	for _, n := range []int{0, 1, 8, 63, 64, inlineMax - 1, inlineMax, inlineMax + 1, 200, room} {
		for sges := 1; sges <= 3; sges++ {
			data := pattern(n+sges, n)
			fill(t, p.B, src, 0, data)
			before := pattern(7, room+64)
			fill(t, p.A, dst, 0, before)
			// sges buffers of room/sges bytes, 8 bytes apart.
			per := room / sges
			wr := verbs.RecvWR{WRID: uint64(n*10 + sges)}
			for k := range sges {
				wr.SGList = append(wr.SGList, dst.SGE(8+k*(per+8), per))
			}
			postRecv(t, p.A, 0, wr)
			postSend(t, p.B, 0, send(1, src.SGE(0, n)))
			wc := waitWCs(t, p.A, verbstest.RecvCQ, 1)[0]
			if wc.WRID != wr.WRID || wc.Status != verbs.WCSuccess || wc.ByteLen != uint32(n) {
				t.Fatalf("%d bytes into %d buffers: completion %+v; want WRID %d, %d bytes", n, sges, wc, wr.WRID, n)
			}
			want := bytes.Clone(before)
			rest := data
			for k := range sges {
				off := 8 + k*(per+8)
				rest = rest[copy(want[off:off+per], rest):]
			}
			if got := contents(t, p.A, dst, 0, room+64); !bytes.Equal(got, want) {
				t.Fatalf("%d bytes into %d buffers: the receive's region holds\n%x\nwant\n%x", n, sges, got, want)
			}
			if inline := lastSlot(p, 0).placed != 0; inline != (n <= inlineMax && sges <= recSGEs) {
				t.Fatalf("%d bytes into %d buffers: carried inline %v", n, sges, inline)
			}
			if wc := waitWCs(t, p.B, verbstest.SendCQ, 1)[0]; wc.Status != verbs.WCSuccess {
				t.Fatalf("%d bytes into %d buffers: the Send completed %v", n, sges, wc.Status)
			}
		}
	}
	expectCanaries(t, p.A, dst)
}

// forgeInline has B write a completion of A's receive at position 0 of
// QP 0 claiming byteLen bytes, carrying payload inline.
func forgeInline(t *testing.T, p *verbstest.Pair, op driver.WCOpcode, byteLen uint32, payload []byte) {
	t.Helper()
	var l sglist.List
	l.One(payload)
	wc := driver.WorkCompletion{WRID: 0, Opcode: op, ByteLen: byteLen}
	if !connOf(driverQP(p.B.(*verbstest.Local).QPs[0])).peerCQ.produce(&wc, &l) {
		t.Fatal("the ring is full")
	}
}

// forgedInline posts a receive, WRID 77, of bufs buffers of size bytes
// in a region of 256 bytes filled with a pattern, has the peer forge its
// completion, with op and byteLen and an inline payload of inlineMax
// bytes, and checks that the one completion polled failed with want and
// no byte count, that nothing of the region changed, and that the peer
// is cut off.
func forgedInline(t *testing.T, op driver.WCOpcode, byteLen uint32, bufs, size int, want verbs.WCStatus) {
	t.Helper()
	p := localHarness().NewPair(t, verbstest.PairOptions{Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 4}})
	buf := newRegion(t, p.A, 256, verbs.AccessLocalWrite)
	before := pattern(3, 256)
	fill(t, p.A, buf, 0, before)
	wr := verbs.RecvWR{WRID: 77}
	for k := range bufs {
		wr.SGList = append(wr.SGList, buf.SGE(k*(size+8), size))
	}
	postRecv(t, p.A, 0, wr)
	forgeInline(t, p, op, byteLen, bytes.Repeat([]byte{0xee}, inlineMax))
	got := pollAll(p)
	if len(got) != 1 || got[0].WRID != 77 || got[0].Status != want || got[0].ByteLen != 0 {
		t.Fatalf("a forged inline completion claiming %d bytes came out %+v; want receive 77 failed with %v, no byte count", byteLen, got, want)
	}
	if after := contents(t, p.A, buf, 0, 256); !bytes.Equal(after, before) {
		t.Fatalf("a forged inline completion claiming %d bytes wrote into the region:\n%x", byteLen, after)
	}
	expectCanaries(t, p.A, buf)
	expectCutOff(t, p, 0)
}

// TestForgedInlineLongerThanSlot: an inline Send claiming more bytes
// than a slot carries, into a receive that would hold them, is a length
// error.
func TestForgedInlineLongerThanSlot(t *testing.T) {
	forgedInline(t, driver.WCRecv, inlineMax+1, 2, 100, verbs.WCLocLenErr)
	forgedInline(t, driver.WCRecv, 4096, 2, 100, verbs.WCLocLenErr)
}

// TestForgedInlineLongerThanReceive: an inline Send claiming more bytes
// than the receive's buffers hold, though the slot carries them, is a
// length error.
func TestForgedInlineLongerThanReceive(t *testing.T) {
	forgedInline(t, driver.WCRecv, 17, 1, 16, verbs.WCLocLenErr)
	forgedInline(t, driver.WCRecv, 33, 2, 16, verbs.WCLocLenErr)
}

// TestForgedInlineWhereNoneGoes: a message carried inline into a
// receive with more buffers than its record holds, or as a Write with
// immediate, is a general error.
func TestForgedInlineWhereNoneGoes(t *testing.T) {
	forgedInline(t, driver.WCRecv, 8, recSGEs+1, 16, verbs.WCGeneralErr)
	forgedInline(t, driver.WCRecvRDMAWithImm, 8, 1, 16, verbs.WCGeneralErr)
}

// TestInlineSendIntoDeregisteredBuffer: a Send travels inline into a
// receive whose region A deregisters before it polls: the receive
// completes with a protection error, nothing is written, and A's QP
// moves to the error state.
func TestInlineSendIntoDeregisteredBuffer(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	buf := newRegion(t, p.A, 64, verbs.AccessLocalWrite)
	before := pattern(5, 64)
	fill(t, p.A, buf, 0, before)
	postRecv(t, p.A, 0, recv(9, buf.SGE(0, 32)))
	src := newRegion(t, p.B, 32, verbs.AccessLocalWrite)
	fill(t, p.B, src, 0, pattern(6, 32))
	postSend(t, p.B, 0, send(1, src.SGE(0, 32)))
	if wc := waitWCs(t, p.B, verbstest.SendCQ, 1)[0]; wc.Status != verbs.WCSuccess {
		t.Fatalf("the Send completed %v", wc.Status)
	}
	if err := p.A.DeregRegion(buf.ID); err != nil {
		t.Fatal(err)
	}
	got := pollAll(p)
	if len(got) != 1 || got[0].WRID != 9 || got[0].Status != verbs.WCLocProtErr || got[0].ByteLen != 0 {
		t.Fatalf("the receive into a deregistered region came out %+v; want receive 9 failed with %v", got, verbs.WCLocProtErr)
	}
	if after := contents(t, p.A, buf, 0, 64); !bytes.Equal(after, before) {
		t.Fatalf("the Send was placed into a deregistered region:\n%x", after)
	}
	expectCutOff(t, p, 0)
}
