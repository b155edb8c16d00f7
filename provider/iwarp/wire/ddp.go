package wire

import (
	"encoding/binary"
	"fmt"
)

// An FPDU on the wire is the ULPDU length field, the ULPDU (a DDP segment:
// the DDP and RDMAP headers, then the payload), the pad and the CRC. The
// views below start at the length field, so that a receiver reads the
// length field and the headers into one buffer and views it as an Hdr.

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

// Field offsets in the headers, counted from the length field (RFC 5041
// section 4, RFC 5040 section 4).
const (
	offULPDULen  = 0 // ULPDU length (in a Terminate's copy: the DDP segment length)
	offDDPCtrl   = 2 // DDP control: Tagged, Last, reserved bits, version
	offRDMAPCtrl = 3 // RDMAP control: version, reserved bits, opcode
	// The tagged header.
	offSTag = 4 // Steering Tag
	offTO   = 8 // Tagged Offset
	// The untagged header.
	offInvSTag = 4  // Invalidate STag of a Send with Invalidate, reserved otherwise
	offQN      = 8  // queue number
	offMSN     = 12 // message sequence number
	offMO      = 16 // message offset
)

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
func (h Hdr) ULPDULen() int { return int(binary.BigEndian.Uint16(h[offULPDULen:])) }

// Tagged reports the DDP Tagged flag.
func (h Hdr) Tagged() bool { return h[offDDPCtrl]&ddpTagged != 0 }

// Last reports the DDP Last flag: the segment ends its message.
func (h Hdr) Last() bool { return h[offDDPCtrl]&ddpLast != 0 }

// DDPVersion is the DDP version field.
func (h Hdr) DDPVersion() int { return int(h[offDDPCtrl] & ddpVersion) }

// RDMAPVersion is the RDMAP version field.
func (h Hdr) RDMAPVersion() int { return int(h[offRDMAPCtrl]&rdmapVers) >> 6 }

// Opcode is the RDMAP opcode.
func (h Hdr) Opcode() Opcode { return Opcode(h[offRDMAPCtrl] & rdmapOpcode) }

// STag is the tagged header's Steering Tag.
func (h Hdr) STag() uint32 { return binary.BigEndian.Uint32(h[offSTag:]) }

// TO is the tagged header's Tagged Offset.
func (h Hdr) TO() uint64 { return binary.BigEndian.Uint64(h[offTO:]) }

// InvalidateSTag is the untagged header's first word: the STag a Send
// with Invalidate invalidates (reserved for other opcodes).
func (h Hdr) InvalidateSTag() uint32 { return binary.BigEndian.Uint32(h[offInvSTag:]) }

// QN is the untagged header's queue number.
func (h Hdr) QN() uint32 { return binary.BigEndian.Uint32(h[offQN:]) }

// MSN is the untagged header's message sequence number.
func (h Hdr) MSN() uint32 { return binary.BigEndian.Uint32(h[offMSN:]) }

// MO is the untagged header's message offset.
func (h Hdr) MO() uint32 { return binary.BigEndian.Uint32(h[offMO:]) }

// PayloadLen is the length of the payload after the headers of the
// FPDU's opcode; negative when the ULPDU is shorter than its headers.
func (h Hdr) PayloadLen() int { return h.ULPDULen() - (HeaderLen(h.Opcode()) - LenFieldLen) }

// SetTagged fills a tagged header (TaggedLen bytes): ULPDU length from
// the payload length n, flags, opcode, STag and Tagged Offset.
func (h Hdr) SetTagged(op Opcode, last bool, stag uint32, to uint64, n int) {
	h.setCtrl(op, true, last, TaggedLen-LenFieldLen+n)
	binary.BigEndian.PutUint32(h[offSTag:], stag)
	binary.BigEndian.PutUint64(h[offTO:], to)
}

// SetUntagged fills an untagged header (UntaggedLen bytes) for opcode
// op, whose headers and payload n make the ULPDU. The first word is inv
// (the Invalidate STag of a Send with Invalidate, zero otherwise).
func (h Hdr) SetUntagged(op Opcode, last bool, inv, qn, msn, mo uint32, n int) {
	h.setCtrl(op, false, last, HeaderLen(op)-LenFieldLen+n)
	binary.BigEndian.PutUint32(h[offInvSTag:], inv)
	binary.BigEndian.PutUint32(h[offQN:], qn)
	binary.BigEndian.PutUint32(h[offMSN:], msn)
	binary.BigEndian.PutUint32(h[offMO:], mo)
}

func (h Hdr) setCtrl(op Opcode, tagged, last bool, ulpdu int) {
	binary.BigEndian.PutUint16(h[offULPDULen:], uint16(ulpdu))
	c := byte(DDPVersion)
	if tagged {
		c |= ddpTagged
	}
	if last {
		c |= ddpLast
	}
	h[offDDPCtrl] = c
	h[offRDMAPCtrl] = RDMAPVersion<<6 | byte(op)
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
	case h[offDDPCtrl]&ddpReserved != 0 || h[offRDMAPCtrl]&rdmapRsvd != 0:
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
