package wire

import (
	"encoding/binary"
	"fmt"
)

// ReadRequest is a view of an RDMA Read Request FPDU (ReadRequestLen
// bytes from the length field): an untagged header on QNRead, then the
// data sink and data source of the Read (RFC 5040, section 4.4).
type ReadRequest []byte

// Offsets of the Read Request's fields, after its untagged header.
const (
	offSinkSTag = UntaggedLen      // data sink STag
	offSinkTO   = UntaggedLen + 4  // data sink Tagged Offset
	offSize     = UntaggedLen + 12 // RDMA Read message size
	offSrcSTag  = UntaggedLen + 16 // data source STag
	offSrcTO    = UntaggedLen + 20 // data source Tagged Offset
)

// Hdr is the request's DDP and RDMAP header.
func (r ReadRequest) Hdr() Hdr { return Hdr(r) }

// SinkSTag is the STag the Read Response is placed with.
func (r ReadRequest) SinkSTag() uint32 { return binary.BigEndian.Uint32(r[offSinkSTag:]) }

// SinkTO is the Tagged Offset the Read Response starts at.
func (r ReadRequest) SinkTO() uint64 { return binary.BigEndian.Uint64(r[offSinkTO:]) }

// Size is the number of bytes to read.
func (r ReadRequest) Size() uint32 { return binary.BigEndian.Uint32(r[offSize:]) }

// SrcSTag is the STag of the memory read.
func (r ReadRequest) SrcSTag() uint32 { return binary.BigEndian.Uint32(r[offSrcSTag:]) }

// SrcTO is the Tagged Offset of the memory read.
func (r ReadRequest) SrcTO() uint64 { return binary.BigEndian.Uint64(r[offSrcTO:]) }

// Set fills the request: its untagged header with msn, and the Read.
func (r ReadRequest) Set(msn, sinkSTag uint32, sinkTO uint64, size, srcSTag uint32, srcTO uint64) {
	Hdr(r).SetUntagged(OpReadRequest, true, 0, QNRead, msn, 0, 0)
	binary.BigEndian.PutUint32(r[offSinkSTag:], sinkSTag)
	binary.BigEndian.PutUint64(r[offSinkTO:], sinkTO)
	binary.BigEndian.PutUint32(r[offSize:], size)
	binary.BigEndian.PutUint32(r[offSrcSTag:], srcSTag)
	binary.BigEndian.PutUint64(r[offSrcTO:], srcTO)
}

// Layer is the layer a Terminate message blames (RFC 5040, section 7).
type Layer uint8

// Terminate layers.
const (
	LayerRDMAP Layer = 0
	LayerDDP   Layer = 1
	LayerLLP   Layer = 2
)

// Error types and codes a Terminate carries (RFC 5040 section 7.2, RFC
// 5041 section 7.2, RFC 5044 section 8, RFC 6581 section 5, RFC 7306).
const (
	// RDMAP error types.
	RDMAPCatastrophic    = 0x0
	RDMAPRemoteProtect   = 0x1
	RDMAPRemoteOperation = 0x2
	// RDMAP error codes.
	RDMAPInvalidSTag       = 0x00
	RDMAPBaseBounds        = 0x01
	RDMAPAccessRights      = 0x02
	RDMAPSTagNotAssoc      = 0x03
	RDMAPTOWrap            = 0x04
	RDMAPInvalidVersion    = 0x05
	RDMAPUnexpectedOpcode  = 0x06
	RDMAPCatastrophicLocal = 0x07
	RDMAPCatastrophicAll   = 0x08
	RDMAPCannotInvalidate  = 0x09
	RDMAPUnspecified       = 0xff
	// DDP error types.
	DDPCatastrophic  = 0x0
	DDPTaggedError   = 0x1
	DDPUntaggedError = 0x2
	// DDP tagged error codes.
	DDPInvalidSTag     = 0x00
	DDPBaseBounds      = 0x01
	DDPSTagNotAssoc    = 0x02
	DDPTOWrap          = 0x03
	DDPTaggedVersion   = 0x04
	DDPInvalidQN       = 0x01
	DDPNoBuffer        = 0x02
	DDPInvalidMSN      = 0x03
	DDPInvalidMO       = 0x04
	DDPTooLong         = 0x05
	DDPUntaggedVersion = 0x06
	// LLP (MPA) error type and codes.
	LLPMPAError        = 0x0
	LLPConnectionLost  = 0x01
	LLPCRCError        = 0x02
	LLPLengthMismatch  = 0x03
	LLPInvalidRequest  = 0x04
	LLPLocalFailure    = 0x05
	LLPInsufficientIRD = 0x06
	LLPNoMatchingRTR   = 0x07
	terminateFlagM     = 0x8000 // the DDP segment length is valid
	terminateFlagD     = 0x4000 // the terminated DDP header follows
	terminateFlagR     = 0x2000 // the terminated RDMAP header follows
	// Linux siw's M, D and R flags: the low 3 bits of the flags' first
	// byte, the other 5 clear (FromSiw).
	siwFlags     = 0x07
	siwFlagsRsvd = 0xf8
)

// Terminate is a view of a Terminate FPDU: an untagged header on
// QNTerminate, the Terminate control word, and, when its D flag is set,
// the DDP segment length and headers of the terminated segment, then,
// with R, the terminated RDMAP header (a Read Request's 28 bytes).
type Terminate []byte

// Offsets of the Terminate control word (RFC 5040 section 4.8), after
// its untagged header, and the terminated headers.
const (
	offTermLayer = UntaggedLen     // Layer (high half) and Error Type (low half)
	offTermECode = UntaggedLen + 1 // Error Code
	offTermFlags = UntaggedLen + 2 // M, D and R flags, then reserved bits (16 bits)
)

// Layer is the layer that found the error.
func (t Terminate) Layer() Layer { return Layer(t[offTermLayer] >> 4) }

// EType is the error type.
func (t Terminate) EType() uint8 { return t[offTermLayer] & 0xf }

// ECode is the error code.
func (t Terminate) ECode() uint8 { return t[offTermECode] }

// HasDDP reports the D flag: the terminated DDP headers follow.
func (t Terminate) HasDDP() bool {
	return binary.BigEndian.Uint16(t[offTermFlags:])&terminateFlagD != 0
}

// HasRDMAP reports the R flag: the terminated RDMAP header follows.
func (t Terminate) HasRDMAP() bool {
	return binary.BigEndian.Uint16(t[offTermFlags:])&terminateFlagR != 0
}

// Terminated returns the copy of the terminated segment's headers as an
// Hdr (its length field holding the DDP segment length), or nil when the
// message carries none or the view is too short to hold them.
func (t Terminate) Terminated() Hdr {
	if len(t) < TerminateLen+MinHeaderLen || !t.HasDDP() {
		return nil
	}
	h := Hdr(t[TerminateLen:])
	if !h.Tagged() && len(h) < UntaggedLen {
		return nil
	}
	return h
}

// SetTerminate fills a Terminate of layer, etype and ecode into t
// (TerminateLen bytes plus room for the copy) with msn on QNTerminate,
// copying the terminated headers hdr (an Hdr of the segment, nil for
// none), and returns the length of the FPDU's headers and copy.
func SetTerminate(t []byte, msn uint32, layer Layer, etype, ecode uint8, hdr Hdr) int {
	n := TerminateLen
	var flags uint16
	if len(hdr) >= MinHeaderLen {
		copyLen := TaggedLen
		if !hdr.Tagged() {
			copyLen = UntaggedLen
			if hdr.Opcode() == OpReadRequest && len(hdr) >= ReadRequestLen {
				copyLen = ReadRequestLen
				flags |= terminateFlagR
			}
		}
		if len(hdr) >= copyLen {
			flags |= terminateFlagM | terminateFlagD
			n += copy(t[TerminateLen:], hdr[:copyLen])
		} else {
			flags = 0
		}
	}
	Hdr(t).SetUntagged(OpTerminate, true, 0, QNTerminate, msn, 0, n-TerminateLen)
	t[offTermLayer] = byte(layer)<<4 | etype&0xf
	t[offTermECode] = ecode
	binary.BigEndian.PutUint16(t[offTermFlags:], flags)
	return n
}

// FromSiw rewrites the control word of a Terminate that Linux siw sent
// into the layout of RFC 5040, and reports whether it did. siw (6.1)
// builds the word with C bitfields that, on a little-endian machine, put
// the Layer in the low half of the first byte and the Error Type in the
// high half (RFC 5040: the other way round), and the M, D and R flags in
// the three low bits of the third byte, where RFC 5040 has reserved
// bits, rather than the three high ones: its Terminate for an invalid
// STag in RDMAP reads as a DDP catastrophic error whose copied headers
// are absent. A control word whose reserved bits are set in exactly that
// place, and no other, is taken for siw's (a caller does so only for a
// peer known not to lay it out as RFC 5040 does); one that copies no
// headers cannot be told from an RFC one and is left as it is.
func (t Terminate) FromSiw() bool {
	f := t[offTermFlags]
	if f&siwFlagsRsvd != 0 || f&siwFlags == 0 || t[offTermFlags+1] != 0 {
		return false
	}
	t[offTermLayer] = t[offTermLayer]<<4 | t[offTermLayer]>>4
	t[offTermFlags] = (f&1)<<7 | (f&2)<<5 | (f&4)<<3
	return true
}

// String describes the error the Terminate reports.
func (t Terminate) String() string {
	return fmt.Sprintf("%s (layer %d, type %d, code %#02x)", describe(t.Layer(), t.EType(), t.ECode()), t.Layer(), t.EType(), t.ECode())
}

// describe names a Terminate error in words.
func describe(l Layer, etype, ecode uint8) string {
	switch l {
	case LayerRDMAP:
		switch etype {
		case RDMAPRemoteProtect:
			return "RDMAP remote protection error: " + rdmapCode(ecode)
		case RDMAPRemoteOperation:
			return "RDMAP remote operation error: " + rdmapCode(ecode)
		}
		return "RDMAP catastrophic error"
	case LayerDDP:
		switch etype {
		case DDPTaggedError:
			return [...]string{"DDP tagged buffer error: invalid STag", "DDP tagged buffer error: base or bounds violation",
				"DDP tagged buffer error: STag not associated with the stream", "DDP tagged buffer error: TO wrap",
				"DDP tagged buffer error: invalid DDP version", "DDP tagged buffer error"}[min(int(ecode), 5)]
		case DDPUntaggedError:
			return [...]string{"DDP untagged buffer error", "DDP untagged buffer error: invalid QN",
				"DDP untagged buffer error: no receive posted", "DDP untagged buffer error: invalid MSN",
				"DDP untagged buffer error: invalid MO", "DDP untagged buffer error: message too long for the receive",
				"DDP untagged buffer error: invalid DDP version", "DDP untagged buffer error"}[min(int(ecode), 7)]
		}
		return "DDP catastrophic error"
	case LayerLLP:
		return [...]string{"MPA error", "MPA error: TCP connection lost", "MPA error: CRC error",
			"MPA error: ULPDU length mismatch", "MPA error: invalid request or reply", "MPA error: local failure",
			"MPA error: insufficient IRD", "MPA error: no matching RTR", "MPA error"}[min(int(ecode), 8)]
	}
	return "unknown layer"
}

// rdmapCodes names the RDMAP error codes.
var rdmapCodes = [...]string{
	RDMAPInvalidSTag:       "invalid STag",
	RDMAPBaseBounds:        "base or bounds violation",
	RDMAPAccessRights:      "access rights violation",
	RDMAPSTagNotAssoc:      "STag not associated with the stream",
	RDMAPTOWrap:            "TO wrap",
	RDMAPInvalidVersion:    "invalid RDMAP version",
	RDMAPUnexpectedOpcode:  "unexpected opcode",
	RDMAPCatastrophicLocal: "catastrophic error of the stream",
	RDMAPCatastrophicAll:   "global catastrophic error",
	RDMAPCannotInvalidate:  "STag cannot be invalidated",
}

// rdmapCode names the RDMAP error code c.
func rdmapCode(c uint8) string {
	if int(c) < len(rdmapCodes) {
		return rdmapCodes[c]
	}
	return "unspecified"
}

// RFC 7306 atomic operations.
const (
	AtomicFetchAdd = 0x0
	AtomicSwap     = 0x1
	AtomicCmpSwap  = 0x2
)

// AtomicRequest is a view of an RFC 7306 Atomic Request FPDU
// (AtomicReqLen bytes from the length field): an untagged header on
// QNAtomic, the atomic operation, a request identifier, the target STag
// and Tagged Offset, and the operands with their masks.
type AtomicRequest []byte

// Offsets of the Atomic Request's fields, after its untagged header.
const (
	offAtomicOp          = UntaggedLen      // a word whose low 4 bits are the operation
	offAtomicID          = UntaggedLen + 4  // request identifier
	offAtomicSTag        = UntaggedLen + 8  // target STag
	offAtomicTO          = UntaggedLen + 12 // target Tagged Offset
	offAtomicAddSwap     = UntaggedLen + 20 // add or swap data
	offAtomicAddSwapMask = UntaggedLen + 28 // its mask
	offAtomicCompare     = UntaggedLen + 36 // compare data
	offAtomicCompareMask = UntaggedLen + 44 // its mask
	atomicOpMask         = 0xf
)

// Op is the atomic operation (AtomicFetchAdd, AtomicCmpSwap, ...).
func (a AtomicRequest) Op() uint8 { return a[offAtomicOp+3] & atomicOpMask }

// ID is the request identifier the response echoes.
func (a AtomicRequest) ID() uint32 { return binary.BigEndian.Uint32(a[offAtomicID:]) }

// STag is the STag of the target.
func (a AtomicRequest) STag() uint32 { return binary.BigEndian.Uint32(a[offAtomicSTag:]) }

// TO is the Tagged Offset of the target.
func (a AtomicRequest) TO() uint64 { return binary.BigEndian.Uint64(a[offAtomicTO:]) }

// AddSwap is the value added (FetchAdd) or swapped in (CmpSwap).
func (a AtomicRequest) AddSwap() uint64 { return binary.BigEndian.Uint64(a[offAtomicAddSwap:]) }

// AddSwapMask is the mask of AddSwap: for FetchAdd the field boundaries
// of a masked add (zero for a plain add), for CmpSwap the bits swapped.
func (a AtomicRequest) AddSwapMask() uint64 { return binary.BigEndian.Uint64(a[offAtomicAddSwapMask:]) }

// Compare is the value CmpSwap compares.
func (a AtomicRequest) Compare() uint64 { return binary.BigEndian.Uint64(a[offAtomicCompare:]) }

// CompareMask is the bits CmpSwap compares.
func (a AtomicRequest) CompareMask() uint64 { return binary.BigEndian.Uint64(a[offAtomicCompareMask:]) }

// Set fills the request.
func (a AtomicRequest) Set(msn uint32, op uint8, id, stag uint32, to, addSwap, addSwapMask, compare, compareMask uint64) {
	Hdr(a).SetUntagged(OpAtomicRequest, true, 0, QNAtomic, msn, 0, 0)
	binary.BigEndian.PutUint32(a[offAtomicOp:], uint32(op&atomicOpMask))
	binary.BigEndian.PutUint32(a[offAtomicID:], id)
	binary.BigEndian.PutUint32(a[offAtomicSTag:], stag)
	binary.BigEndian.PutUint64(a[offAtomicTO:], to)
	binary.BigEndian.PutUint64(a[offAtomicAddSwap:], addSwap)
	binary.BigEndian.PutUint64(a[offAtomicAddSwapMask:], addSwapMask)
	binary.BigEndian.PutUint64(a[offAtomicCompare:], compare)
	binary.BigEndian.PutUint64(a[offAtomicCompareMask:], compareMask)
}

// AtomicResponse is a view of an RFC 7306 Atomic Response FPDU
// (AtomicRespLen bytes): an untagged header on QNAtomic, the identifier
// of the request answered and the target's value before the operation.
type AtomicResponse []byte

// Offsets of the Atomic Response's fields, after its untagged header.
const (
	offAtomicRespID    = UntaggedLen     // identifier of the request answered
	offAtomicRespValue = UntaggedLen + 4 // original value
)

// ID is the identifier of the request answered.
func (a AtomicResponse) ID() uint32 { return binary.BigEndian.Uint32(a[offAtomicRespID:]) }

// Value is the original value of the target.
func (a AtomicResponse) Value() uint64 { return binary.BigEndian.Uint64(a[offAtomicRespValue:]) }

// Set fills the response.
func (a AtomicResponse) Set(msn, id uint32, value uint64) {
	Hdr(a).SetUntagged(OpAtomicResponse, true, 0, QNAtomic, msn, 0, 0)
	binary.BigEndian.PutUint32(a[offAtomicRespID:], id)
	binary.BigEndian.PutUint64(a[offAtomicRespValue:], value)
}

// ImmData is a view of an RFC 7306 Immediate Data FPDU (ImmDataLen
// bytes): an untagged header on QNSend and 8 bytes of immediate data.
// goverbs carries the 32-bit verbs immediate in the first four bytes and
// uses the last four as flags: ImmWithSend says the immediate belongs to
// the Send message that follows (a Send with immediate), and consumes no
// receive of its own; without it the Immediate Data consumes a receive
// and completes it (an RDMA Write with immediate).
type ImmData []byte

// Offsets of the Immediate Data's two words, after its untagged header.
const (
	offImm      = UntaggedLen     // the verbs immediate
	offImmFlags = UntaggedLen + 4 // goverbs' flags (ImmWithSend)
)

// ImmWithSend is the flag of an Immediate Data message that belongs to
// the next Send.
const ImmWithSend = 1

// Imm is the 32-bit verbs immediate.
func (d ImmData) Imm() uint32 { return binary.BigEndian.Uint32(d[offImm:]) }

// Flags is the second word of the immediate data.
func (d ImmData) Flags() uint32 { return binary.BigEndian.Uint32(d[offImmFlags:]) }

// Set fills the message.
func (d ImmData) Set(solicited bool, msn, imm, flags uint32) {
	op := OpImmData
	if solicited {
		op = OpImmDataSE
	}
	Hdr(d).SetUntagged(op, true, 0, QNSend, msn, 0, 0)
	binary.BigEndian.PutUint32(d[offImm:], imm)
	binary.BigEndian.PutUint32(d[offImmFlags:], flags)
}
