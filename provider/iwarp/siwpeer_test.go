package iwarp_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/provider/iwarp/wire"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// Peers that behave as Linux siw (6.1) does where it departs from what
// RFC 5040/5044/6581 lead a peer to expect, played by a raw socket, so
// that tcp0's tolerance of them is checked without siw at hand.

// siwResponder listens for one goverbs initiator and answers its MPA
// Request as siw's responder does: MPA v2, no RFC 7306 block, CRC if the
// initiator asks, and peer-to-peer mode with an RTR Write if p2p (siw
// agrees to the mode when asked). It returns the listening address and
// a channel that yields the raw end once the Reply is out.
func siwResponder(t *testing.T, p2p bool) (string, <-chan *hostile) {
	return rawResponder(t, p2p, false)
}

// rawResponder is siwResponder that, with ext, accepts the RFC 7306
// extensions as a goverbs responder does.
func rawResponder(t *testing.T, p2p, ext bool) (string, <-chan *hostile) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	out := make(chan *hostile, 1)
	go func() {
		defer close(out)
		nc, err := l.Accept()
		if err != nil {
			return
		}
		nc.SetDeadline(time.Now().Add(20 * time.Second))
		hdr := make([]byte, wire.FrameHeaderLen)
		if _, err := io.ReadFull(nc, hdr); err != nil {
			nc.Close()
			return
		}
		n, err := wire.ValidateFrameHeader(hdr)
		if err != nil || !wire.Frame(hdr).IsRequest() {
			nc.Close()
			return
		}
		if _, err := io.ReadFull(nc, make([]byte, n)); err != nil {
			nc.Close()
			return
		}
		crc := wire.Frame(hdr).Flags()&wire.FlagCRC != 0
		flags := byte(wire.FlagEnhanced)
		if crc {
			flags |= wire.FlagCRC
		}
		rtr := wire.RTR(0)
		if p2p {
			rtr = wire.RTRWrite
		}
		pdLen := wire.V2Len
		if ext {
			flags |= wire.FlagExtAccept
			pdLen += wire.ExtLen
		}
		rep := make(wire.Frame, wire.FrameHeaderLen+pdLen)
		rep.SetHeader(wire.KeyRep, flags, wire.Revision2, pdLen)
		wire.V2(rep[wire.FrameHeaderLen:]).Set(4, 4, p2p, rtr)
		if ext {
			wire.Ext(rep[wire.FrameHeaderLen+wire.V2Len:]).Set(0x777)
		}
		if _, err := nc.Write(rep); err != nil {
			nc.Close()
			return
		}
		out <- &hostile{t: t, nc: nc, crc: crc, ird: 4, ext: ext, msn: [wire.NumQN]uint32{1, 1, 1, 1}}
	}()
	return "tcp://" + l.Addr().String(), out
}

// dialSiw connects a goverbs endpoint of one QP to a siwResponder.
func dialSiw(t *testing.T, crc, p2p bool) (*verbstest.Local, *hostile) {
	t.Helper()
	return dialRaw(t, crc, p2p, false)
}

// dialRaw connects a goverbs endpoint of one QP to a rawResponder.
func dialRaw(t *testing.T, crc, p2p, ext bool) (*verbstest.Local, *hostile) {
	t.Helper()
	defer setCRC(crc)()
	addr, raw := rawResponder(t, p2p, ext)
	opts := verbstest.PairOptions{QPs: 1}.Defaults()
	e, err := verbstest.NewLocal("tcp0", opts, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	if err := e.Dial(addr, opts); err != nil {
		t.Fatalf("dial the siw-like responder: %v", err)
	}
	h := <-raw
	if h == nil {
		t.Fatal("the siw-like responder saw no MPA Request")
	}
	t.Cleanup(func() { h.nc.Close() })
	return e, h
}

// nextOf reads the victim's FPDUs until one of opcode op, skipping the
// zero-length Writes (RTR and startup kicks) before it.
func (h *hostile) nextOf(op wire.Opcode) []byte {
	h.t.Helper()
	for {
		b := h.readFPDU()
		hd := wire.Hdr(b)
		if hd.Opcode() == op {
			return b
		}
		if hd.Opcode() != wire.OpWrite || hd.PayloadLen() != 0 {
			h.t.Fatalf("a %v of %d bytes from the victim, waiting for a %v", hd.Opcode(), hd.PayloadLen(), op)
		}
	}
}

// readResponse returns the FPDU of a Read Response segment.
func (h *hostile) readResponse(stag uint32, to uint64, last bool, payload []byte) []byte {
	var b [wire.TaggedLen]byte
	wire.Hdr(b[:]).SetTagged(wire.OpReadResponse, last, stag, to, len(payload))
	return h.fpdu(b[:], payload)
}

// postSend posts a signaled Send of n bytes of region r of QP 0.
func postSend(t *testing.T, e *verbstest.Local, r verbstest.Region, id uint64, n int) {
	t.Helper()
	wr := verbs.SendWR{WRID: id, Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{{Addr: r.Addr, Length: uint32(n), LKey: r.LKey}}}
	if _, err := e.PostSend(0, []verbs.SendWR{wr}); err != nil {
		t.Fatalf("post send: %v", err)
	}
}

// expectSendDone waits for the completion of Send id and checks it.
func expectSendDone(t *testing.T, e *verbstest.Local, id uint64, want verbs.WCStatus) {
	t.Helper()
	wcs, err := e.Completions(verbstest.SendCQ, 1, 10*time.Second)
	if err != nil || len(wcs) != 1 {
		t.Fatalf("Send %d: completions %v, %v", id, wcs, err)
	}
	if wcs[0].WRID != id || wcs[0].Status != want {
		t.Fatalf("Send %d completed as %+v, want status %v", id, wcs[0], want)
	}
}

// TestOversizedAnswerToZeroLengthRead: siw answers a zero-length Read
// that waited behind another of its messages with the buffer of that
// message, in many segments at the Read's sink, and under CRC sends them
// from a buffer its owner may be writing, so that some segments' CRCs do
// not match. The Sends the Read confirms complete, nothing is placed,
// and the stream goes on; an answer whose segments are out of order
// still ends it, and so does a bad CRC on any other FPDU.
func TestOversizedAnswerToZeroLengthRead(t *testing.T) {
	for _, crc := range []bool{false, true} {
		t.Run(fmt.Sprintf("crc=%v", crc), func(t *testing.T) {
			e, h := dialSiw(t, crc, false)
			r := newRegion(t, e, 4096, verbs.AccessLocalWrite)
			const seg = 1428 // an Ethernet segment's worth, as siw cuts them
			stale := bytes.Repeat([]byte{0xee}, 3*seg+100)
			for i := range 3 {
				id := uint64(i + 1)
				postSend(t, e, r, id, 200)
				if b := h.nextOf(wire.OpSend); wire.Hdr(b).PayloadLen() != 200 {
					t.Fatalf("Send of %d bytes, want 200", wire.Hdr(b).PayloadLen())
				}
				rr := wire.ReadRequest(h.nextOf(wire.OpReadRequest))
				if rr.Size() != 0 {
					t.Fatalf("the Read after a Send asks for %d bytes, want a zero-length one", rr.Size())
				}
				// The first answer is siw's oversized one, the others as
				// they should be: the stream must go on after it.
				var answer []byte
				if i == 0 {
					for off := 0; off < len(stale); off += seg {
						end := min(off+seg, len(stale))
						b := h.readResponse(rr.SinkSTag(), rr.SinkTO()+uint64(off), end == len(stale), stale[off:end])
						if crc && off > 0 {
							// Written after siw computed the CRC.
							b[wire.TaggedLen+7] ^= 0x5a
						}
						answer = append(answer, b...)
					}
				} else {
					answer = h.readResponse(rr.SinkSTag(), rr.SinkTO(), true, nil)
				}
				h.send(answer)
				expectSendDone(t, e, id, verbs.WCSuccess)
			}
			if ok, err := e.CanariesIntact(r.ID); !ok || err != nil {
				t.Fatalf("canaries around the Send's region: intact %v, %v", ok, err)
			}
			if s, err := e.QPState(0); s != verbs.QPSRTS || err != nil {
				t.Fatalf("QP in %v (%v) after the answers, want RTS", s, err)
			}
			if crc {
				// A Send whose bytes are not those its CRC covers.
				if _, err := e.PostRecv(0, []verbs.RecvWR{{WRID: 7, SGList: []verbs.SGE{{Addr: r.Addr, Length: 64, LKey: r.LKey}}}}); err != nil {
					t.Fatal(err)
				}
				b := h.fpdu(h.untagged(wire.OpSend, wire.QNSend, 16), make([]byte, 16))
				b[len(b)-wire.CRCLen-1] ^= 1
				h.send(b)
				h.expectTerminate(wire.LayerLLP, wire.LLPMPAError, wire.LLPCRCError)
				expectError(t, e)
				return
			}

			// Out of order: the second segment skips ahead.
			postSend(t, e, r, 9, 200)
			h.nextOf(wire.OpSend)
			rr := wire.ReadRequest(h.nextOf(wire.OpReadRequest))
			h.send(append(h.readResponse(rr.SinkSTag(), rr.SinkTO(), false, stale[:seg]),
				h.readResponse(rr.SinkSTag(), rr.SinkTO()+seg+4, true, stale[:seg])...))
			h.expectTerminate(wire.LayerDDP, wire.DDPTaggedError, wire.DDPBaseBounds)
			expectError(t, e)
		})
	}
}

// TestOversizedAnswerFromGoverbsRefused: a peer that negotiated the RFC
// 7306 extensions is goverbs, which answers a zero-length Read with no
// data: an answer that carries some ends the stream.
func TestOversizedAnswerFromGoverbsRefused(t *testing.T) {
	e, h := dialRaw(t, false, false, true)
	r := newRegion(t, e, 4096, verbs.AccessLocalWrite)
	postSend(t, e, r, 1, 200)
	h.nextOf(wire.OpSend)
	rr := wire.ReadRequest(h.nextOf(wire.OpReadRequest))
	h.send(h.readResponse(rr.SinkSTag(), rr.SinkTO(), true, make([]byte, 64)))
	h.expectTerminate(wire.LayerDDP, wire.DDPTaggedError, wire.DDPBaseBounds)
	expectError(t, e)
}

// expectError waits for QP 0 of e to reach the error state.
func expectError(t *testing.T, e *verbstest.Local) {
	t.Helper()
	expectVictimError(t, &victim{e: e})
}

// TestServerSpeaksFirstWithoutPeerToPeer: an initiator that does not ask
// for peer-to-peer mode, as siw's never does, and sends nothing after the
// MPA exchange still gets what the accepting side's application sends
// first (a server whose protocol speaks first, such as cmatose's).
func TestServerSpeaksFirstWithoutPeerToPeer(t *testing.T) {
	for _, rev := range []byte{wire.Revision1, wire.Revision2} {
		for _, crc := range []bool{false, true} {
			t.Run(fmt.Sprintf("rev=%d,crc=%v", rev, crc), func(t *testing.T) {
				v := newVictim(t, 4)
				h := dialNoP2P(t, v, rev, crc)
				if err := <-v.accepted; err != nil {
					t.Fatalf("victim accept: %v", err)
				}
				r := newRegion(t, v.e, 4096, verbs.AccessLocalWrite)
				msg := []byte("the server speaks first")
				if err := v.e.WriteRegion(r.ID, 0, msg); err != nil {
					t.Fatal(err)
				}
				postSend(t, v.e, r, 1, len(msg))
				b := h.nextOf(wire.OpSend)
				hd := wire.Hdr(b)
				if got := b[wire.HeaderLen(wire.OpSend) : wire.HeaderLen(wire.OpSend)+hd.PayloadLen()]; !bytes.Equal(got, msg) {
					t.Fatalf("the initiator got %q, want %q", got, msg)
				}
				rr := wire.ReadRequest(h.nextOf(wire.OpReadRequest))
				h.send(h.readResponse(rr.SinkSTag(), rr.SinkTO(), true, nil))
				expectSendDone(t, v.e, 1, verbs.WCSuccess)
			})
		}
	}
}

// dialNoP2P connects to the victim with an MPA Request of revision rev
// that does not ask for peer-to-peer mode (revision 2: with the RFC 6581
// block, as siw's initiator sends it) and reads the Reply.
func dialNoP2P(t *testing.T, v *victim, rev byte, crc bool) *hostile {
	t.Helper()
	flags, pd := byte(0), []byte(nil)
	if rev == wire.Revision2 {
		flags = wire.FlagEnhanced
		pd = make([]byte, wire.V2Len)
		wire.V2(pd).Set(4, 4, false, 0)
	}
	if crc {
		flags |= wire.FlagCRC
	}
	nc, repFlags, rpd := mpaConnect(t, v, flags, rev, pd)
	if rev == wire.Revision2 && wire.V2(rpd).PeerToPeer() {
		t.Fatal("the Reply turns on peer-to-peer mode the Request did not ask for")
	}
	return &hostile{t: t, nc: nc, crc: repFlags&wire.FlagCRC != 0, ird: 4,
		msn: [wire.NumQN]uint32{1, 1, 1, 1}}
}

// TestStrandedRTRIsKicked: siw's responder hooks its socket for RDMA mode
// only after its MPA Reply is out, so an RTR that arrives in between
// stays unread, and siw completes the connection only once more bytes
// come. A goverbs initiator whose application only waits for data must
// send them: here the raw responder ignores the RTR, as siw does when it
// loses that race, and speaks only once something follows it.
func TestStrandedRTRIsKicked(t *testing.T) {
	for _, crc := range []bool{false, true} {
		t.Run(fmt.Sprintf("crc=%v", crc), func(t *testing.T) {
			e, h := dialSiw(t, crc, true)
			r := newRegion(t, e, 4096, verbs.AccessLocalWrite)
			if _, err := e.PostRecv(0, []verbs.RecvWR{{WRID: 7, SGList: []verbs.SGE{{Addr: r.Addr, Length: 4096, LKey: r.LKey}}}}); err != nil {
				t.Fatal(err)
			}
			if rtr := wire.Hdr(h.readFPDU()); rtr.Opcode() != wire.OpWrite || rtr.PayloadLen() != 0 {
				t.Fatalf("the first FPDU is a %v of %d bytes, want the RTR Write", rtr.Opcode(), rtr.PayloadLen())
			}
			// Stranded: nothing happens until more bytes arrive.
			if kick := wire.Hdr(h.readFPDU()); kick.Opcode() != wire.OpWrite || kick.PayloadLen() != 0 {
				t.Fatalf("after the RTR a %v of %d bytes, want a zero-length Write", kick.Opcode(), kick.PayloadLen())
			}
			msg := []byte("established at last")
			h.send(h.fpdu(h.untagged(wire.OpSend, wire.QNSend, len(msg)), msg))
			wcs, err := e.Completions(verbstest.RecvCQ, 1, 10*time.Second)
			if err != nil || len(wcs) != 1 || wcs[0].Status != verbs.WCSuccess || wcs[0].ByteLen != uint32(len(msg)) {
				t.Fatalf("receive: %+v, %v", wcs, err)
			}
			got, err := e.ReadRegion(r.ID, 0, len(msg))
			if err != nil || !bytes.Equal(got, msg) {
				t.Fatalf("received %q (%v), want %q", got, err, msg)
			}
		})
	}
}

// setCRC makes this side ask for MPA CRC as on says; it returns a
// function that restores the setting.
func setCRC(on bool) (restore func()) {
	prev := iwarp.CRC()
	iwarp.SetCRC(on)
	return func() { iwarp.SetCRC(prev) }
}

// TestTerminateForConfirmingReadConfirmsSends: siw fails its connection
// when it answers a zero-length Read queued behind an inline Send of its
// own (the stale SGE names STag 0), and its Terminate copies a Read
// Request header with a wrong MSN. The Send that went before the Read
// was placed (a responder takes messages in order): it completes as a
// success, and the QP fails. siw lays out the Terminate's control word
// its own way (see siwTerminate), which is read as it means.
func TestTerminateForConfirmingReadConfirmsSends(t *testing.T) {
	e, h := dialSiw(t, false, false)
	r := newRegion(t, e, 4096, verbs.AccessLocalWrite)
	postSend(t, e, r, 1, 16)
	h.nextOf(wire.OpSend)
	rr := wire.ReadRequest(h.nextOf(wire.OpReadRequest))
	// The header siw copies: a Read Request whose MSN is not the one sent.
	bogus := make([]byte, wire.ReadRequestLen)
	wire.ReadRequest(bogus).Set(wire.Hdr(rr).MSN()+15, 0, 0, 16, 0, 0)
	term := make([]byte, wire.TerminateLen+wire.ReadRequestLen)
	n := wire.SetTerminate(term, 1, wire.LayerRDMAP, wire.RDMAPRemoteProtect, wire.RDMAPInvalidSTag, wire.Hdr(bogus))
	// siw's control word: Layer and Error Type swapped, the M, D and R
	// flags in the low bits of the third byte.
	term[20] = term[20]<<4 | term[20]>>4
	term[22] = 0x07
	h.send(h.fpdu(term[:n], nil))
	expectSendDone(t, e, 1, verbs.WCSuccess)
	expectError(t, e)
}

// TestOrderlyEndCreditsSends: siw drops the Read Responses it owes when
// its application disconnects, so a peer that disconnects as soon as it
// has received a Send never confirms it. A peer other than goverbs that
// ends the stream in order, with every byte acknowledged, placed what it
// got: the Send completes as a success. A goverbs peer always answers
// first, so from one the same end flushes the Send.
func TestOrderlyEndCreditsSends(t *testing.T) {
	for _, ext := range []bool{false, true} {
		t.Run(fmt.Sprintf("goverbs=%v", ext), func(t *testing.T) {
			e, h := dialRaw(t, false, false, ext)
			r := newRegion(t, e, 4096, verbs.AccessLocalWrite)
			postSend(t, e, r, 1, 100)
			h.nextOf(wire.OpSend)
			h.nextOf(wire.OpReadRequest)
			h.nc.Close()
			want := verbs.WCSuccess
			if ext {
				want = verbs.WCWRFlushErr
			}
			expectSendDone(t, e, 1, want)
			expectError(t, e)
		})
	}
}

// FuzzReceiveFromSiw is FuzzReceive from the other end: a goverbs
// initiator with a Send awaiting its confirmation takes arbitrary bytes
// from a responder that is not goverbs, which is where tcp0 takes siw's
// departures (an oversized answer to a zero-length Read, siw's Terminate
// layout). It must not panic or hang, must touch no byte around its
// regions, and must end in the error state once the stream ends.
func FuzzReceiveFromSiw(f *testing.F) {
	seed := &hostile{msn: [wire.NumQN]uint32{1, 1, 1, 1}}
	var oversized []byte
	for off := 0; off < 3000; off += 1000 {
		oversized = append(oversized, seed.readResponse(0, uint64(off), off+1000 >= 3000, make([]byte, 1000))...)
	}
	f.Add(oversized)
	term := make([]byte, wire.TerminateLen+wire.ReadRequestLen)
	bogus := make([]byte, wire.ReadRequestLen)
	wire.ReadRequest(bogus).Set(16, 0, 0, 16, 0, 0)
	n := wire.SetTerminate(term, 1, wire.LayerRDMAP, wire.RDMAPRemoteProtect, wire.RDMAPInvalidSTag, wire.Hdr(bogus))
	term[20], term[22] = term[20]<<4|term[20]>>4, 0x07
	f.Add(seed.fpdu(term[:n], nil))
	f.Add(append(seed.readResponse(0, 0, false, make([]byte, 8)), seed.readResponse(0, 100, true, make([]byte, 8))...))
	f.Fuzz(func(t *testing.T, stream []byte) {
		e, h := dialSiw(t, false, false)
		r := newRegion(t, e, 256, verbs.AccessLocalWrite)
		postSend(t, e, r, 1, 100)
		h.nextOf(wire.OpSend)
		h.nextOf(wire.OpReadRequest)
		h.pour(stream, "initiator")
		expectError(t, e)
		if ok, err := e.CanariesIntact(r.ID); err != nil || !ok {
			t.Fatalf("a byte around the initiator's region changed (intact %v, %v)", ok, err)
		}
		if wcs, err := e.Completions(verbstest.SendCQ, 1, 5*time.Second); err != nil || len(wcs) != 1 || wcs[0].WRID != 1 {
			t.Fatalf("send completions %+v, %v: want WRID 1", wcs, err)
		}
	})
}
