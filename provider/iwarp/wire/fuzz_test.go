package wire

import "testing"

// The fuzz tests feed every decoder arbitrary bytes: after the check a
// receiver makes, every accessor of the view must work (no panic) and
// what it reports must be consistent with the check.

// FuzzFrame decodes MPA Request and Reply frames and their private data
// blocks.
func FuzzFrame(f *testing.F) {
	req := make(Frame, FrameHeaderLen+V2Len+ExtLen+2)
	req.SetHeader(KeyReq, FlagEnhanced|FlagExtOffer|FlagCRC, Revision2, V2Len+ExtLen+2)
	V2(req[FrameHeaderLen:]).Set(4, 4, true, RTRWrite)
	Ext(req[FrameHeaderLen+V2Len:]).Set(17)
	f.Add([]byte(req))
	f.Add([]byte(KeyRep + "\x20\x01\x00\x00"))
	f.Add([]byte(KeyRep))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		n, err := ValidateFrameHeader(b)
		if err != nil {
			return
		}
		fr := Frame(b)
		if n != fr.PrivateDataLen() || n > MaxPrivateData || (!fr.IsRequest() && !fr.IsReply()) || fr.Revision() > Revision2 {
			t.Fatalf("ValidateFrameHeader(%x) = %d: inconsistent with the frame", b, n)
		}
		_, _ = fr.Flags(), fr.Key()
		pd := fr.PrivateData()
		if len(pd) > n || len(pd) > len(b)-FrameHeaderLen {
			t.Fatalf("private data of %d bytes from a frame of %d stating %d", len(pd), len(b), n)
		}
		if len(pd) >= V2Len {
			v := V2(pd)
			if v.IRD() > 0x3fff || v.ORD() > 0x3fff {
				t.Fatalf("IRD %d ORD %d beyond 14 bits", v.IRD(), v.ORD())
			}
			_, _ = v.PeerToPeer(), v.RTR()
		}
		if len(pd) >= ExtLen {
			e := Ext(pd)
			_, _ = e.Valid(), e.QPN()
		}
	})
}

// FuzzHdr decodes FPDU headers: ValidateHdr, then every accessor of the
// view of the opcode it accepts.
func FuzzHdr(f *testing.F) {
	for _, op := range []Opcode{OpWrite, OpReadResponse} {
		b := make([]byte, MaxHeaderLen)
		Hdr(b).SetTagged(op, true, 1, 2, 3)
		f.Add(b, true)
	}
	for _, op := range []Opcode{OpSend, OpSendInv, OpSendSE, OpSendSEInv, OpTerminate, OpImmData} {
		b := make([]byte, MaxHeaderLen)
		Hdr(b).SetUntagged(op, true, 0, 0, 1, 0, 0)
		f.Add(b, true)
	}
	b := make([]byte, MaxHeaderLen)
	ReadRequest(b).Set(1, 2, 3, 4, 5, 6)
	f.Add(b, false)
	b = make([]byte, MaxHeaderLen)
	AtomicRequest(b).Set(1, AtomicFetchAdd, 2, 3, 8, 1, 0, 0, 0)
	f.Add(b, true)
	f.Add([]byte{0, 0, 0, 0}, false)
	f.Fuzz(func(t *testing.T, b []byte, ext bool) {
		n, err := ValidateHdr(b, ext)
		if err != nil {
			if he, ok := err.(*HeaderError); ok && he.Error() == "" {
				t.Fatal("a header error without words")
			}
			return
		}
		h := Hdr(b)
		op := h.Opcode()
		if n != HeaderLen(op) || n < MinHeaderLen || n > MaxHeaderLen || h.Tagged() != op.Tagged() || h.PayloadLen() < 0 ||
			(op.Extension() && !ext) {
			t.Fatalf("ValidateHdr(%x) = %d: inconsistent with opcode %v", b, n, op)
		}
		_, _, _, _ = h.Last(), h.DDPVersion(), h.RDMAPVersion(), h.ULPDULen()
		if len(b) < n {
			return // the receiver reads the rest of the headers first
		}
		if h.Tagged() {
			_, _ = h.STag(), h.TO()
			return
		}
		_, _, _, _ = h.InvalidateSTag(), h.QN(), h.MSN(), h.MO()
		switch op {
		case OpReadRequest:
			r := ReadRequest(b)
			_, _, _, _, _ = r.SinkSTag(), r.SinkTO(), r.Size(), r.SrcSTag(), r.SrcTO()
		case OpAtomicRequest:
			a := AtomicRequest(b)
			_, _, _, _, _, _, _, _ = a.Op(), a.ID(), a.STag(), a.TO(), a.AddSwap(), a.AddSwapMask(), a.Compare(), a.CompareMask()
		case OpAtomicResponse:
			a := AtomicResponse(b)
			_, _ = a.ID(), a.Value()
		case OpImmData, OpImmDataSE:
			d := ImmData(b)
			_, _ = d.Imm(), d.Flags()
		case OpTerminate:
			term := Terminate(b)
			_, _, _, _, _ = term.Layer(), term.EType(), term.ECode(), term.HasDDP(), term.HasRDMAP()
			_ = term.String()
		}
	})
}

// FuzzTerminate decodes Terminate messages of any length and the headers
// they copy.
func FuzzTerminate(f *testing.F) {
	var seg [ReadRequestLen]byte
	ReadRequest(seg[:]).Set(6, 1, 2, 3, 4, 5)
	var b [TerminateMaxLen]byte
	n := SetTerminate(b[:], 1, LayerRDMAP, RDMAPRemoteProtect, RDMAPBaseBounds, Hdr(seg[:]))
	f.Add(append([]byte(nil), b[:n]...))
	n = SetTerminate(b[:], 1, LayerLLP, LLPMPAError, LLPCRCError, nil)
	f.Add(append([]byte(nil), b[:n]...))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < TerminateLen {
			return
		}
		term := Terminate(b)
		_ = term.String()
		// Reading it as siw lays it out must not panic either.
		Terminate(append([]byte(nil), b...)).FromSiw()
		h := term.Terminated()
		if h == nil {
			return
		}
		if len(h) < MinHeaderLen || (!h.Tagged() && len(h) < UntaggedLen) {
			t.Fatalf("Terminated returned %d bytes of headers", len(h))
		}
		_, _ = h.Opcode(), h.ULPDULen()
		if h.Tagged() {
			_, _ = h.STag(), h.TO()
		} else {
			_, _ = h.QN(), h.MSN()
		}
		// Encoding what was decoded must not panic either.
		var out [TerminateMaxLen]byte
		SetTerminate(out[:], 1, term.Layer(), term.EType(), term.ECode(), h)
	})
}
