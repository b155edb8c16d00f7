// Package wire holds the iWARP wire formats as views: MPA (RFC 5044) with
// the enhanced connection setup of RFC 6581, DDP (RFC 5041), RDMAP (RFC
// 5040) and the RDMAP extensions of RFC 7306. Each format is a []byte
// type with accessor methods, in the manner of gVisor's pkg/tcpip/header:
// a view parses nothing until an accessor is called, copies nothing and
// allocates nothing. Accessors assume the view is long enough; the
// Validate functions (and the fixed lengths below) say when it is, so
// that a receiver checks a length once and then reads fields freely.
// Each view names its field offsets. What the wire says of each RDMAP
// opcode (name, header length, buffer model, DDP queue, whether it is a
// request, a response or a Terminate, the message it carries) is one
// table, read through Opcode's methods and Info.
//
// Byte order is network order (big-endian) everywhere, as the RFCs say,
// except the MPA CRC, which goes on the wire as the little-endian bytes of
// the CRC32c value, as Linux siw and the iSCSI convention have it.
package wire

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
)

// MPA Request and Reply frames (RFC 5044, section 7.1).
const (
	// KeyReq and KeyRep are the 16-byte keys that start an MPA Request
	// and an MPA Reply.
	KeyReq = "MPA ID Req Frame"
	KeyRep = "MPA ID Rep Frame"
	// FrameHeaderLen is the length of an MPA Request or Reply frame
	// before its private data.
	FrameHeaderLen = 20
	// MaxPrivateData is the most private data an MPA frame carries: RFC
	// 5044 allows 512 bytes, Linux (RDMA_MAX_PRIVATE_DATA) 256, and a
	// frame longer than Linux takes would be refused by siw.
	MaxPrivateData = 256
)

// Flags of the MPA Request and Reply frames (the byte after the key).
const (
	FlagMarkers  = 0x80 // M: the sender wants Markers in the FPDUs it receives
	FlagCRC      = 0x40 // C: the sender wants CRC32c in the FPDUs
	FlagReject   = 0x20 // R: the responder rejects the connection
	FlagEnhanced = 0x10 // RFC 6581: private data starts with the IRD/ORD block
	// FlagExtOffer and FlagExtAccept are goverbs' own use of two reserved
	// bits, which RFC 5044 says receivers ignore: an initiator that sets
	// FlagExtOffer offers the RFC 7306 atomics and immediate data; a
	// goverbs responder answers FlagExtAccept, which no other
	// implementation sets (siw echoes the request's flags in its reply,
	// so an echo of FlagExtOffer means nothing).
	FlagExtOffer  = 0x01
	FlagExtAccept = 0x02
)

// Revisions of MPA.
const (
	Revision1 = 1
	Revision2 = 2 // RFC 6581 enhanced connection setup
)

// ErrShort is returned by the Validate functions for a buffer shorter
// than the format it must hold.
var ErrShort = errors.New("iwarp wire: buffer shorter than the header it must hold")

// Frame is a view of an MPA Request or Reply frame: the 16-byte key, the
// flags, the revision, the private data length and the private data.
type Frame []byte

// Offsets of the frame's fields; the key fills the bytes before the flags.
const (
	offFrameFlags = len(KeyReq)       // the flags byte
	offFrameRev   = offFrameFlags + 1 // the revision
	offFramePDLen = offFrameFlags + 2 // the private data length (16 bits)
)

// Key is the frame's 16-byte key.
func (f Frame) Key() string { return string(f[:offFrameFlags]) }

// IsRequest reports whether the frame carries the Request key.
func (f Frame) IsRequest() bool { return string(f[:offFrameFlags]) == KeyReq }

// IsReply reports whether the frame carries the Reply key.
func (f Frame) IsReply() bool { return string(f[:offFrameFlags]) == KeyRep }

// Flags is the flags byte (FlagMarkers, FlagCRC, ...).
func (f Frame) Flags() byte { return f[offFrameFlags] }

// Revision is the MPA revision.
func (f Frame) Revision() byte { return f[offFrameRev] }

// PrivateDataLen is the length of the private data that follows the
// header, as the frame states it.
func (f Frame) PrivateDataLen() int { return int(binary.BigEndian.Uint16(f[offFramePDLen:])) }

// PrivateData is the private data, as much of it as the view holds.
func (f Frame) PrivateData() []byte {
	n := min(f.PrivateDataLen(), len(f)-FrameHeaderLen)
	return f[FrameHeaderLen : FrameHeaderLen+n]
}

// SetHeader fills the frame header: key, flags, revision and private
// data length.
func (f Frame) SetHeader(key string, flags, rev byte, pdLen int) {
	copy(f[:offFrameFlags], key)
	f[offFrameFlags] = flags
	f[offFrameRev] = rev
	binary.BigEndian.PutUint16(f[offFramePDLen:], uint16(pdLen))
}

// ValidateFrameHeader checks the first FrameHeaderLen bytes of an MPA
// frame: a known key, a revision MPA defines (1 or 2; 0 is treated as
// 1 by Linux) and a private data length no longer than MaxPrivateData.
// It returns the number of private data bytes that follow.
func ValidateFrameHeader(b []byte) (int, error) {
	if len(b) < FrameHeaderLen {
		return 0, ErrShort
	}
	f := Frame(b)
	if !f.IsRequest() && !f.IsReply() {
		return 0, errors.New("iwarp wire: not an MPA Request or Reply frame (bad key): the peer does not speak iWARP")
	}
	if f.Revision() > Revision2 {
		return 0, errors.New("iwarp wire: MPA revision above 2")
	}
	if n := f.PrivateDataLen(); n > MaxPrivateData {
		return 0, errors.New("iwarp wire: MPA private data longer than 256 bytes")
	}
	return f.PrivateDataLen(), nil
}

// Enhanced connection setup (RFC 6581): with FlagEnhanced and revision 2
// the private data starts with this 4-byte block.
const V2Len = 4

// Bits of the RFC 6581 block.
const (
	v2PeerToPeer = 0x8000 // in the IRD word: peer-to-peer mode, an RTR message follows
	v2ZeroSend   = 0x4000 // in the IRD word: RTR as a zero-length Send
	v2WriteRTR   = 0x8000 // in the ORD word: RTR as a zero-length RDMA Write
	v2ReadRTR    = 0x4000 // in the ORD word: RTR as a zero-length RDMA Read
	v2Mask       = 0x3fff // IRD and ORD
)

// RTR says which ready-to-receive messages a peer-to-peer connection may
// use (RFC 6581, section 4).
type RTR uint8

// RTR messages.
const (
	RTRWrite RTR = 1 << iota // zero-length RDMA Write
	RTRRead                  // zero-length RDMA Read
	RTRSend                  // zero-length Send
)

// V2 is a view of the RFC 6581 block: IRD and ORD (14 bits each), the
// peer-to-peer flag and the RTR choices.
type V2 []byte

// Offsets of the block's two words.
const (
	offV2IRD = 0 // IRD, with the peer-to-peer and zero-length Send RTR flags
	offV2ORD = 2 // ORD, with the Write and Read RTR flags
)

// IRD is the inbound RDMA Read queue depth the sender offers.
func (v V2) IRD() int { return int(binary.BigEndian.Uint16(v[offV2IRD:]) & v2Mask) }

// ORD is the outbound RDMA Read queue depth the sender wants.
func (v V2) ORD() int { return int(binary.BigEndian.Uint16(v[offV2ORD:]) & v2Mask) }

// PeerToPeer reports the peer-to-peer flag.
func (v V2) PeerToPeer() bool { return binary.BigEndian.Uint16(v[offV2IRD:])&v2PeerToPeer != 0 }

// RTR is the set of RTR messages the block names.
func (v V2) RTR() RTR {
	var r RTR
	if binary.BigEndian.Uint16(v[offV2IRD:])&v2ZeroSend != 0 {
		r |= RTRSend
	}
	ord := binary.BigEndian.Uint16(v[offV2ORD:])
	if ord&v2WriteRTR != 0 {
		r |= RTRWrite
	}
	if ord&v2ReadRTR != 0 {
		r |= RTRRead
	}
	return r
}

// Set fills the block. IRD and ORD above 0x3fff are clipped.
func (v V2) Set(ird, ord int, p2p bool, rtr RTR) {
	i := uint16(min(max(ird, 0), v2Mask))
	o := uint16(min(max(ord, 0), v2Mask))
	if p2p {
		i |= v2PeerToPeer
	}
	if rtr&RTRSend != 0 {
		i |= v2ZeroSend
	}
	if rtr&RTRWrite != 0 {
		o |= v2WriteRTR
	}
	if rtr&RTRRead != 0 {
		o |= v2ReadRTR
	}
	binary.BigEndian.PutUint16(v[offV2IRD:], i)
	binary.BigEndian.PutUint16(v[offV2ORD:], o)
}

// ExtLen is the length of goverbs' extension block, which a goverbs
// responder puts after the RFC 6581 block of its Reply when it sets
// FlagExtAccept: a magic word and the responder's QP number.
const ExtLen = 8

// extMagic starts the extension block: "GVx1".
const extMagic = 0x47567831

// Ext is a view of the extension block.
type Ext []byte

// Offsets of the extension block's two words.
const (
	offExtMagic = 0 // extMagic
	offExtQPN   = 4 // the sender's QP number
)

// Valid reports whether the block starts with the magic word.
func (e Ext) Valid() bool { return binary.BigEndian.Uint32(e[offExtMagic:]) == extMagic }

// QPN is the sender's QP number.
func (e Ext) QPN() uint32 { return binary.BigEndian.Uint32(e[offExtQPN:]) }

// Set fills the block.
func (e Ext) Set(qpn uint32) {
	binary.BigEndian.PutUint32(e[offExtMagic:], extMagic)
	binary.BigEndian.PutUint32(e[offExtQPN:], qpn)
}

// RTRQPNTag marks the Tagged Offset of a goverbs RTR Write that carries
// the initiator's QP number in its low 32 bits (the offset of a
// zero-length Write is not checked by its receiver, RFC 6581 section 5).
const RTRQPNTag = 0x6776515000000000 // "gvQP" in the high half

// MPA FPDU framing (RFC 5044, section 4).
const (
	// LenFieldLen is the length of the ULPDU length field that starts
	// every FPDU.
	LenFieldLen = 2
	// CRCLen is the length of the CRC field that ends every FPDU; with
	// CRC off it is sent as zero and ignored.
	CRCLen = 4
	// MaxULPDU is the largest ULPDU length the 16-bit field can state.
	MaxULPDU = 0xffff
)

// Pad returns the number of pad bytes after a ULPDU of length n, so that
// the length field, the ULPDU and the pad end on a 4-byte boundary.
func Pad(n int) int { return (4 - (n+LenFieldLen)%4) % 4 }

// FPDULen returns the length on the wire of an FPDU whose ULPDU is n
// bytes: length field, ULPDU, pad and CRC.
func FPDULen(n int) int { return LenFieldLen + n + Pad(n) + CRCLen }

// Castagnoli is the CRC32c table MPA's CRC uses.
var Castagnoli = crc32.MakeTable(crc32.Castagnoli)

// PutCRC writes the MPA CRC crc into b (4 bytes) in wire order.
func PutCRC(b []byte, crc uint32) { binary.LittleEndian.PutUint32(b, crc) }

// CRC reads the MPA CRC from b (4 bytes).
func CRC(b []byte) uint32 { return binary.LittleEndian.Uint32(b) }
