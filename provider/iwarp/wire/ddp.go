package wire

import (
	"encoding/binary"
	"fmt"
)

// An FPDU on the wire is the ULPDU length field, the ULPDU (a DDP segment:
// the DDP and RDMAP headers, then the payload), the pad and the CRC. The
// views below start at the length field, so that a receiver reads the
// length field and the headers into one buffer and views it as an Hdr.

// Opcode is an RDMAP opcode (RFC 5040, section 4.3; RFC 7306, section 5).
type Opcode uint8

// RDMAP opcodes.
const (
	OpWrite        Opcode = 0x0
	OpReadRequest  Opcode = 0x1
	OpReadResponse Opcode = 0x2
	OpSend         Opcode = 0x3
	OpSendInv      Opcode = 0x4
	OpSendSE       Opcode = 0x5
	OpSendSEInv    Opcode = 0x6
	OpTerminate    Opcode = 0x7
	// RFC 7306 opcodes, used only on connections that negotiated them.
	OpImmData        Opcode = 0x8
	OpImmDataSE      Opcode = 0x9
	OpAtomicRequest  Opcode = 0xa
	OpAtomicResponse Opcode = 0xb
)

var opNames = [...]string{
	OpWrite: "Write", OpReadRequest: "ReadRequest", OpReadResponse: "ReadResponse",
	OpSend: "Send", OpSendInv: "SendInv", OpSendSE: "SendSE", OpSendSEInv: "SendSEInv",
	OpTerminate: "Terminate", OpImmData: "ImmData", OpImmDataSE: "ImmDataSE",
	OpAtomicRequest: "AtomicRequest", OpAtomicResponse: "AtomicResponse",
}

// String names the opcode as RFC 5040 and RFC 7306 do.
func (o Opcode) String() string {
	if int(o) < len(opNames) {
		return opNames[o]
	}
	return fmt.Sprintf("Opcode(%d)", uint8(o))
}

// Tagged reports whether messages of opcode o use the tagged buffer model.
func (o Opcode) Tagged() bool { return o == OpWrite || o == OpReadResponse }

// IsSend reports whether o is one of the four Send opcodes.
func (o Opcode) IsSend() bool { return o >= OpSend && o <= OpSendSEInv }

// Extension reports whether o is an RFC 7306 opcode.
func (o Opcode) Extension() bool { return o >= OpImmData && o <= OpAtomicResponse }

// DDP queue numbers of untagged messages (RFC 5040, section 5.1; RFC 7306).
const (
	QNSend      = 0 // Send and Immediate Data
	QNRead      = 1 // RDMA Read Request
	QNTerminate = 2 // Terminate
	QNAtomic    = 3 // Atomic Request and Response
	NumQN       = 4
)

// Protocol versions (RFC 5041 DDP, RFC 5040 RDMAP).
const (
	DDPVersion   = 1
	RDMAPVersion = 1
)

// Header lengths, counted from the start of the ULPDU length field.
const (
	ctrlLen        = 4                // length field, DDP control, RDMAP control
	TaggedLen      = 16               // ... STag, Tagged Offset
	UntaggedLen    = 20               // ... reserved or Invalidate STag, QN, MSN, MO
	ReadRequestLen = UntaggedLen + 28 // ... sink STag, sink TO, size, source STag, source TO
	TerminateLen   = UntaggedLen + 4  // ... Terminate control; the terminated headers follow as payload
	ImmDataLen     = UntaggedLen + 8  // ... the 8 bytes of immediate data
	AtomicReqLen   = UntaggedLen + 52 // ... RFC 7306 Atomic Request fields
	AtomicRespLen  = UntaggedLen + 12 // ... request identifier, original value
	MinHeaderLen   = TaggedLen        // the shortest header; every FPDU is longer
	MaxHeaderLen   = AtomicReqLen     // the longest header
	// TerminateMaxLen is a Terminate with the longest copy of a
	// terminated segment: a Read Request's headers.
	TerminateMaxLen = TerminateLen + ReadRequestLen
)

// HeaderLen returns the length of the headers of an FPDU of opcode op,
// counted from the length field.
func HeaderLen(op Opcode) int {
	switch op {
	case OpWrite, OpReadResponse:
		return TaggedLen
	case OpSend, OpSendInv, OpSendSE, OpSendSEInv:
		return UntaggedLen
	case OpReadRequest:
		return ReadRequestLen
	case OpTerminate:
		return TerminateLen
	case OpImmData, OpImmDataSE:
		return ImmDataLen
	case OpAtomicRequest:
		return AtomicReqLen
	case OpAtomicResponse:
		return AtomicRespLen
	}
	return 0
}

// DDP and RDMAP control bits.
const (
	ddpTagged   = 0x80
	ddpLast     = 0x40
	ddpReserved = 0x3c
	ddpVersion  = 0x03
	rdmapVers   = 0xc0
	rdmapRsvd   = 0x30
	rdmapOpcode = 0x0f
)

// Hdr is a view of the start of an FPDU: the ULPDU length field, the DDP
// and RDMAP control bytes, and the rest of the headers of its buffer
// model (tagged: STag and Tagged Offset; untagged: QN, MSN, MO) and its
// opcode. A Terminate's copy of a terminated segment's headers is an Hdr
// too, with the DDP segment length in place of the ULPDU length.
type Hdr []byte

// ULPDULen is the length of the ULPDU (the DDP segment: headers and
// payload) that follows the length field.
func (h Hdr) ULPDULen() int { return int(binary.BigEndian.Uint16(h[0:])) }

// Tagged reports the DDP Tagged flag.
func (h Hdr) Tagged() bool { return h[2]&ddpTagged != 0 }

// Last reports the DDP Last flag: the segment ends its message.
func (h Hdr) Last() bool { return h[2]&ddpLast != 0 }

// DDPVersion is the DDP version field.
func (h Hdr) DDPVersion() int { return int(h[2] & ddpVersion) }

// RDMAPVersion is the RDMAP version field.
func (h Hdr) RDMAPVersion() int { return int(h[3]&rdmapVers) >> 6 }

// Opcode is the RDMAP opcode.
func (h Hdr) Opcode() Opcode { return Opcode(h[3] & rdmapOpcode) }

// STag is the tagged header's Steering Tag.
func (h Hdr) STag() uint32 { return binary.BigEndian.Uint32(h[4:]) }

// TO is the tagged header's Tagged Offset.
func (h Hdr) TO() uint64 { return binary.BigEndian.Uint64(h[8:]) }

// InvalidateSTag is the untagged header's first word: the STag a Send
// with Invalidate invalidates (reserved for other opcodes).
func (h Hdr) InvalidateSTag() uint32 { return binary.BigEndian.Uint32(h[4:]) }

// QN is the untagged header's queue number.
func (h Hdr) QN() uint32 { return binary.BigEndian.Uint32(h[8:]) }

// MSN is the untagged header's message sequence number.
func (h Hdr) MSN() uint32 { return binary.BigEndian.Uint32(h[12:]) }

// MO is the untagged header's message offset.
func (h Hdr) MO() uint32 { return binary.BigEndian.Uint32(h[16:]) }

// PayloadLen is the length of the payload after the headers of the
// FPDU's opcode; negative when the ULPDU is shorter than its headers.
func (h Hdr) PayloadLen() int { return h.ULPDULen() - (HeaderLen(h.Opcode()) - LenFieldLen) }

// SetTagged fills a tagged header (TaggedLen bytes): ULPDU length from
// the payload length n, flags, opcode, STag and Tagged Offset.
func (h Hdr) SetTagged(op Opcode, last bool, stag uint32, to uint64, n int) {
	h.setCtrl(op, true, last, TaggedLen-LenFieldLen+n)
	binary.BigEndian.PutUint32(h[4:], stag)
	binary.BigEndian.PutUint64(h[8:], to)
}

// SetUntagged fills an untagged header (UntaggedLen bytes) for opcode
// op, whose headers and payload n make the ULPDU. The first word is inv
// (the Invalidate STag of a Send with Invalidate, zero otherwise).
func (h Hdr) SetUntagged(op Opcode, last bool, inv, qn, msn, mo uint32, n int) {
	h.setCtrl(op, false, last, HeaderLen(op)-LenFieldLen+n)
	binary.BigEndian.PutUint32(h[4:], inv)
	binary.BigEndian.PutUint32(h[8:], qn)
	binary.BigEndian.PutUint32(h[12:], msn)
	binary.BigEndian.PutUint32(h[16:], mo)
}

func (h Hdr) setCtrl(op Opcode, tagged, last bool, ulpdu int) {
	binary.BigEndian.PutUint16(h[0:], uint16(ulpdu))
	c := byte(DDPVersion)
	if tagged {
		c |= ddpTagged
	}
	if last {
		c |= ddpLast
	}
	h[2] = c
	h[3] = RDMAPVersion<<6 | byte(op)
}

// HeaderError says what is wrong with an FPDU's headers, in the terms a
// Terminate message reports it with.
type HeaderError struct {
	Layer Layer
	EType uint8
	ECode uint8
	What  string
}

// Error describes what is wrong with the headers.
func (e *HeaderError) Error() string { return "iwarp wire: " + e.What }

// ValidateHdr checks the first MinHeaderLen bytes of an FPDU and returns
// the length of its headers: a DDP and RDMAP version of 1, reserved bits
// clear, a known opcode whose buffer model matches the Tagged flag, and
// a ULPDU length that covers the headers. ext says whether the RFC 7306
// opcodes were negotiated. The rest of the headers (HeaderLen of the
// opcode) must be read before their fields are used.
func ValidateHdr(b []byte, ext bool) (int, error) {
	if len(b) < MinHeaderLen {
		return 0, ErrShort
	}
	h := Hdr(b)
	switch {
	case h.DDPVersion() != DDPVersion:
		if h.Tagged() {
			return 0, &HeaderError{LayerDDP, DDPTaggedError, DDPTaggedVersion, fmt.Sprintf("DDP version %d", h.DDPVersion())}
		}
		return 0, &HeaderError{LayerDDP, DDPUntaggedError, DDPUntaggedVersion, fmt.Sprintf("DDP version %d", h.DDPVersion())}
	case h.RDMAPVersion() != RDMAPVersion:
		return 0, &HeaderError{LayerRDMAP, RDMAPRemoteOperation, RDMAPInvalidVersion, fmt.Sprintf("RDMAP version %d", h.RDMAPVersion())}
	case h[2]&ddpReserved != 0 || h[3]&rdmapRsvd != 0:
		return 0, &HeaderError{LayerDDP, DDPCatastrophic, 0, "reserved DDP or RDMAP control bits set"}
	}
	op := h.Opcode()
	n := HeaderLen(op)
	if n == 0 || (op.Extension() && !ext) {
		return 0, &HeaderError{LayerRDMAP, RDMAPRemoteOperation, RDMAPUnexpectedOpcode, fmt.Sprintf("unexpected RDMAP opcode %d", uint8(op))}
	}
	if op.Tagged() != h.Tagged() {
		return 0, &HeaderError{LayerRDMAP, RDMAPRemoteOperation, RDMAPUnexpectedOpcode, fmt.Sprintf("%v with the DDP Tagged flag %v", op, h.Tagged())}
	}
	if h.ULPDULen() < n-LenFieldLen {
		return 0, &HeaderError{LayerLLP, LLPMPAError, LLPLengthMismatch, fmt.Sprintf("ULPDU of %d bytes is shorter than the %d-byte %v header", h.ULPDULen(), n-LenFieldLen, op)}
	}
	return n, nil
}
