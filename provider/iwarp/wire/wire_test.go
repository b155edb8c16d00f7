package wire

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"strings"
	"testing"
)

// TestFrame builds an MPA Request with the RFC 6581 block and reads it
// back.
func TestFrame(t *testing.T) {
	pd := make([]byte, V2Len+3)
	V2(pd).Set(7, 5, true, RTRWrite|RTRRead)
	copy(pd[V2Len:], "abc")
	f := make(Frame, FrameHeaderLen+len(pd))
	f.SetHeader(KeyReq, FlagCRC|FlagEnhanced|FlagExtOffer, Revision2, len(pd))
	copy(f[FrameHeaderLen:], pd)
	n, err := ValidateFrameHeader(f)
	if err != nil || n != len(pd) {
		t.Fatalf("ValidateFrameHeader = %d, %v; want %d, nil", n, err, len(pd))
	}
	if !f.IsRequest() || f.IsReply() || f.Flags() != FlagCRC|FlagEnhanced|FlagExtOffer || f.Revision() != 2 {
		t.Fatalf("frame %x: key, flags or revision wrong", f)
	}
	v := V2(f.PrivateData())
	if v.IRD() != 7 || v.ORD() != 5 || !v.PeerToPeer() || v.RTR() != RTRWrite|RTRRead {
		t.Fatalf("RFC 6581 block %x: IRD %d ORD %d p2p %v RTR %d", []byte(v[:V2Len]), v.IRD(), v.ORD(), v.PeerToPeer(), v.RTR())
	}
	if got := string(f.PrivateData()[V2Len:]); got != "abc" {
		t.Fatalf("private data %q", got)
	}
	// The wire form of the block, as RFC 6581 lays it out.
	if want := []byte{0x80, 7, 0xc0, 5}; !bytes.Equal(pd[:V2Len], want) {
		t.Fatalf("RFC 6581 block is %x, want %x", pd[:V2Len], want)
	}
	e := make(Ext, ExtLen)
	e.Set(0x123456)
	if !e.Valid() || e.QPN() != 0x123456 {
		t.Fatalf("extension block %x", []byte(e))
	}
}

// TestValidateFrameHeader refuses what is not an MPA frame.
func TestValidateFrameHeader(t *testing.T) {
	f := make(Frame, FrameHeaderLen)
	f.SetHeader(KeyRep, 0, Revision1, 0)
	if _, err := ValidateFrameHeader(f[:10]); err != ErrShort {
		t.Fatalf("short frame: %v", err)
	}
	bad := append(Frame(nil), f...)
	bad[3] = 'x'
	if _, err := ValidateFrameHeader(bad); err == nil {
		t.Fatal("bad key accepted")
	}
	bad = append(Frame(nil), f...)
	bad[17] = 3
	if _, err := ValidateFrameHeader(bad); err == nil {
		t.Fatal("revision 3 accepted")
	}
	bad = append(Frame(nil), f...)
	binary.BigEndian.PutUint16(bad[18:], MaxPrivateData+1)
	if _, err := ValidateFrameHeader(bad); err == nil {
		t.Fatal("oversize private data accepted")
	}
}

// TestPad checks the MPA pad: length field, ULPDU and pad end on a
// 4-byte boundary.
func TestPad(t *testing.T) {
	for n := 0; n < 64; n++ {
		if p := Pad(n); p < 0 || p > 3 || (n+2+p)%4 != 0 {
			t.Fatalf("Pad(%d) = %d", n, p)
		}
		if FPDULen(n) != 2+n+Pad(n)+4 {
			t.Fatalf("FPDULen(%d) = %d", n, FPDULen(n))
		}
	}
}

// TestHeaders builds each kind of FPDU header and reads it back.
func TestHeaders(t *testing.T) {
	b := make([]byte, MaxHeaderLen)
	Hdr(b).SetTagged(OpWrite, true, 0x1234, 0xfeedface00, 100)
	h := Hdr(b)
	if n, err := ValidateHdr(b, false); err != nil || n != TaggedLen {
		t.Fatalf("tagged header: %d, %v", n, err)
	}
	if !h.Tagged() || !h.Last() || h.Opcode() != OpWrite || h.STag() != 0x1234 || h.TO() != 0xfeedface00 ||
		h.PayloadLen() != 100 || h.ULPDULen() != 114 || h.DDPVersion() != 1 || h.RDMAPVersion() != 1 {
		t.Fatalf("tagged header %x", b[:TaggedLen])
	}
	// RFC 5041/5040: T and L flags, DV 1 in the DDP byte; RV 1 and the
	// opcode in the RDMAP byte.
	if b[2] != 0xc1 || b[3] != 0x40 {
		t.Fatalf("control bytes %#x %#x, want 0xc1 0x40", b[2], b[3])
	}
	Hdr(b).SetUntagged(OpSendSEInv, false, 0xabcd, QNSend, 9, 4096, 7)
	if n, err := ValidateHdr(b, false); err != nil || n != UntaggedLen {
		t.Fatalf("untagged header: %d, %v", n, err)
	}
	if h.Tagged() || h.Last() || h.Opcode() != OpSendSEInv || h.InvalidateSTag() != 0xabcd || h.QN() != 0 ||
		h.MSN() != 9 || h.MO() != 4096 || h.PayloadLen() != 7 {
		t.Fatalf("untagged header %x", b[:UntaggedLen])
	}
	r := ReadRequest(b)
	r.Set(3, 0x11, 0x22, 0x33, 0x44, 0x55)
	if n, err := ValidateHdr(b, false); err != nil || n != ReadRequestLen {
		t.Fatalf("read request: %d, %v", n, err)
	}
	if r.Hdr().QN() != QNRead || r.Hdr().MSN() != 3 || r.SinkSTag() != 0x11 || r.SinkTO() != 0x22 || r.Size() != 0x33 ||
		r.SrcSTag() != 0x44 || r.SrcTO() != 0x55 || r.Hdr().PayloadLen() != 0 {
		t.Fatalf("read request %x", b[:ReadRequestLen])
	}
	a := AtomicRequest(b)
	a.Set(2, AtomicCmpSwap, 77, 0x99, 0x1000, 5, ^uint64(0), 6, ^uint64(0))
	if _, err := ValidateHdr(b, false); err == nil {
		t.Fatal("an atomic request was accepted on a connection without RFC 7306")
	}
	if n, err := ValidateHdr(b, true); err != nil || n != AtomicReqLen {
		t.Fatalf("atomic request: %d, %v", n, err)
	}
	if a.Op() != AtomicCmpSwap || a.ID() != 77 || a.STag() != 0x99 || a.TO() != 0x1000 || a.AddSwap() != 5 ||
		a.AddSwapMask() != ^uint64(0) || a.Compare() != 6 || a.CompareMask() != ^uint64(0) || Hdr(b).QN() != QNAtomic {
		t.Fatalf("atomic request %x", b[:AtomicReqLen])
	}
	ar := AtomicResponse(b)
	ar.Set(4, 77, 0xdead)
	if ar.ID() != 77 || ar.Value() != 0xdead || Hdr(b).Opcode() != OpAtomicResponse {
		t.Fatalf("atomic response %x", b[:AtomicRespLen])
	}
	d := ImmData(b)
	d.Set(true, 5, 0xcafe, ImmWithSend)
	if d.Imm() != 0xcafe || d.Flags() != ImmWithSend || Hdr(b).Opcode() != OpImmDataSE || Hdr(b).PayloadLen() != 0 {
		t.Fatalf("immediate data %x", b[:ImmDataLen])
	}
}

// TestValidateHdr refuses malformed headers with the Terminate error
// RFC 5040/5041/5044 prescribe.
func TestValidateHdr(t *testing.T) {
	good := make([]byte, MinHeaderLen)
	Hdr(good).SetTagged(OpWrite, true, 1, 0, 0)
	for _, tc := range []struct {
		name  string
		spoil func(b []byte)
		layer Layer
		etype uint8
		ecode uint8
	}{
		{"DDPVersion", func(b []byte) { b[2] = b[2]&^3 | 2 }, LayerDDP, DDPTaggedError, DDPTaggedVersion},
		{"RDMAPVersion", func(b []byte) { b[3] = b[3]&^0xc0 | 0x80 }, LayerRDMAP, RDMAPRemoteOperation, RDMAPInvalidVersion},
		{"UnknownOpcode", func(b []byte) { b[3] = b[3]&^0xf | 0xe; b[2] &^= 0x80 }, LayerRDMAP, RDMAPRemoteOperation, RDMAPUnexpectedOpcode},
		{"ExtensionOpcode", func(b []byte) { b[3] = b[3]&^0xf | 0xa; b[2] &^= 0x80 }, LayerRDMAP, RDMAPRemoteOperation, RDMAPUnexpectedOpcode},
		{"TaggedSend", func(b []byte) { b[3] = b[3]&^0xf | byte(OpSend) }, LayerRDMAP, RDMAPRemoteOperation, RDMAPUnexpectedOpcode},
		{"Reserved", func(b []byte) { b[2] |= 0x04 }, LayerDDP, DDPCatastrophic, 0},
		{"ShortULPDU", func(b []byte) { binary.BigEndian.PutUint16(b, 13) }, LayerLLP, LLPMPAError, LLPLengthMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := append([]byte(nil), good...)
			tc.spoil(b)
			_, err := ValidateHdr(b, false)
			he, ok := err.(*HeaderError)
			if !ok || he.Layer != tc.layer || he.EType != tc.etype || he.ECode != tc.ecode {
				t.Fatalf("ValidateHdr(%x) = %v, want layer %d type %d code %d", b, err, tc.layer, tc.etype, tc.ecode)
			}
		})
	}
	if _, err := ValidateHdr(good[:MinHeaderLen-1], false); err != ErrShort {
		t.Fatalf("short header: %v", err)
	}
}

// TestTerminate builds Terminates with each kind of terminated header
// and reads them back.
func TestTerminate(t *testing.T) {
	var seg [ReadRequestLen]byte
	ReadRequest(seg[:]).Set(6, 1, 2, 3, 4, 5)
	var b [TerminateMaxLen]byte
	n := SetTerminate(b[:], 1, LayerRDMAP, RDMAPRemoteProtect, RDMAPAccessRights, Hdr(seg[:]))
	if n != TerminateLen+ReadRequestLen {
		t.Fatalf("Terminate with a Read Request's headers is %d bytes, want %d", n, TerminateLen+ReadRequestLen)
	}
	term := Terminate(b[:n])
	if term.Layer() != LayerRDMAP || term.EType() != RDMAPRemoteProtect || term.ECode() != RDMAPAccessRights ||
		!term.HasDDP() || !term.HasRDMAP() || Hdr(term).QN() != QNTerminate || Hdr(term).PayloadLen() != ReadRequestLen {
		t.Fatalf("Terminate %x: %v", b[:n], term)
	}
	th := term.Terminated()
	if th == nil || th.Opcode() != OpReadRequest || th.QN() != QNRead || th.MSN() != 6 || ReadRequest(th).SrcSTag() != 4 {
		t.Fatalf("terminated headers %x", []byte(th))
	}
	var w [TaggedLen]byte
	Hdr(w[:]).SetTagged(OpWrite, false, 0x77, 0x88, 10)
	n = SetTerminate(b[:], 1, LayerDDP, DDPTaggedError, DDPInvalidSTag, Hdr(w[:]))
	term = Terminate(b[:n])
	if th := term.Terminated(); n != TerminateLen+TaggedLen || term.HasRDMAP() || th == nil || th.STag() != 0x77 || th.TO() != 0x88 {
		t.Fatalf("Terminate of a Write: %x", b[:n])
	}
	n = SetTerminate(b[:], 1, LayerLLP, LLPMPAError, LLPCRCError, nil)
	if term = Terminate(b[:n]); n != TerminateLen || term.HasDDP() || term.Terminated() != nil || term.ECode() != LLPCRCError {
		t.Fatalf("Terminate without headers: %x", b[:n])
	}
	if s := term.String(); s == "" {
		t.Fatal("Terminate describes itself as nothing")
	}
}

// TestCRC checks the MPA CRC against the CRC32c check value and its
// wire order (the little-endian bytes of the value, as Linux siw sends).
func TestCRC(t *testing.T) {
	if c := crc32.Checksum([]byte("123456789"), Castagnoli); c != 0xe3069283 {
		t.Fatalf("CRC32c check value %#x, want 0xe3069283", c)
	}
	var b [4]byte
	PutCRC(b[:], 0xe3069283)
	if b != [4]byte{0x83, 0x92, 0x06, 0xe3} || CRC(b[:]) != 0xe3069283 {
		t.Fatalf("CRC bytes %x", b)
	}
}

// TestOpcodeTable checks the opcode table against RFC 5040 (section 4.3
// and 5.1) and RFC 7306 (section 5): header lengths (from the length
// field), buffer model, queue, and what each message is.
func TestOpcodeTable(t *testing.T) {
	const req, resp, term = KindRequest, KindResponse, KindTerminate
	for _, tc := range []struct {
		op                          Opcode
		name                        string
		hlen                        int
		tagged                      bool
		qn                          uint32
		kind                        Kind
		msg                         Message
		ext, bare, solicited, inval bool
	}{
		{OpWrite, "Write", 16, true, 0, req, MsgWrite, false, false, false, false},
		{OpReadRequest, "ReadRequest", 48, false, 1, req, MsgReadRequest, false, true, false, false},
		{OpReadResponse, "ReadResponse", 16, true, 0, resp, MsgReadResponse, false, false, false, false},
		{OpSend, "Send", 20, false, 0, req, MsgSend, false, false, false, false},
		{OpSendInv, "SendInv", 20, false, 0, req, MsgSend, false, false, false, true},
		{OpSendSE, "SendSE", 20, false, 0, req, MsgSend, false, false, true, false},
		{OpSendSEInv, "SendSEInv", 20, false, 0, req, MsgSend, false, false, true, true},
		{OpTerminate, "Terminate", 24, false, 2, term, MsgTerminate, false, false, false, false},
		{OpImmData, "ImmData", 28, false, 0, req, MsgImmData, true, true, false, false},
		{OpImmDataSE, "ImmDataSE", 28, false, 0, req, MsgImmData, true, true, true, false},
		{OpAtomicRequest, "AtomicRequest", 72, false, 3, req, MsgAtomicRequest, true, true, false, false},
		{OpAtomicResponse, "AtomicResponse", 32, false, 3, resp, MsgAtomicResponse, true, true, false, false},
	} {
		op := tc.op
		if op.String() != tc.name || HeaderLen(op) != tc.hlen || op.Tagged() != tc.tagged || op.Kind() != tc.kind ||
			op.Msg() != tc.msg || op.Extension() != tc.ext || op.Bare() != tc.bare || op.Solicited() != tc.solicited ||
			op.Invalidates() != tc.inval || !op.Defined() || op.IsSend() != (tc.msg == MsgSend) {
			t.Errorf("opcode %d: table says %+v", uint8(op), op.Info())
		}
		if !tc.tagged && op.QN() != tc.qn {
			t.Errorf("%v on DDP queue %d, want %d", op, op.QN(), tc.qn)
		}
		if HeaderLen(op) < MinHeaderLen || HeaderLen(op) > MaxHeaderLen {
			t.Errorf("%v: header length %d outside [MinHeaderLen, MaxHeaderLen]", op, HeaderLen(op))
		}
	}
	for _, op := range []Opcode{0xc, 0xd, 0xe, 0xf, 0x10, 0xff} {
		if op.Defined() || HeaderLen(op) != 0 || op.Msg() != 0 || op.String() != fmt.Sprintf("Opcode(%d)", uint8(op)) {
			t.Errorf("undefined opcode %d: table says %+v, named %q", uint8(op), op.Info(), op.String())
		}
	}
}

// TestTerminateFromSiw reads a Terminate whose control word Linux siw
// laid out (Layer and Error Type swapped, M, D and R in the low bits of
// the flags' first byte) as RFC 5040 lays it out, and leaves an RFC one
// alone.
func TestTerminateFromSiw(t *testing.T) {
	var seg [ReadRequestLen]byte
	ReadRequest(seg[:]).Set(6, 1, 2, 3, 4, 5)
	var rfc [TerminateMaxLen]byte
	n := SetTerminate(rfc[:], 1, LayerRDMAP, RDMAPRemoteProtect, RDMAPInvalidSTag, Hdr(seg[:]))
	siw := rfc
	siw[20] = byte(RDMAPRemoteProtect)<<4 | byte(LayerRDMAP) // siw: Layer low, Error Type high
	siw[22] = 0x07                                           // siw: M, D, R in the three low bits
	if !Terminate(siw[:n]).FromSiw() || siw != rfc {
		t.Fatalf("siw's Terminate %x read as %x, want %x", siw[:n], siw[:n], rfc[:n])
	}
	if Terminate(rfc[:n]).FromSiw() {
		t.Fatalf("an RFC 5040 Terminate %x was taken for siw's", rfc[:n])
	}
}

// TestTerminateDescribes names a Terminate's error in words.
func TestTerminateDescribes(t *testing.T) {
	var b [TerminateMaxLen]byte
	for _, tc := range []struct {
		layer        Layer
		etype, ecode uint8
		want         string
	}{
		{LayerRDMAP, RDMAPRemoteProtect, RDMAPAccessRights, "RDMAP remote protection error: access rights violation"},
		{LayerRDMAP, RDMAPRemoteOperation, RDMAPCannotInvalidate, "RDMAP remote operation error: STag cannot be invalidated"},
		{LayerRDMAP, RDMAPRemoteOperation, RDMAPUnspecified, "RDMAP remote operation error: unspecified"},
		{LayerDDP, DDPUntaggedError, DDPNoBuffer, "DDP untagged buffer error: no receive posted"},
		{LayerLLP, LLPMPAError, LLPCRCError, "MPA error: CRC error"},
	} {
		n := SetTerminate(b[:], 1, tc.layer, tc.etype, tc.ecode, nil)
		if got := Terminate(b[:n]).String(); !strings.HasPrefix(got, tc.want+" (") {
			t.Errorf("Terminate of layer %d type %d code %#x reads %q, want %q", tc.layer, tc.etype, tc.ecode, got, tc.want)
		}
	}
}
