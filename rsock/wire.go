package rsock

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// hello is the private data each side sends with its connection request or
// acceptance: where its receive ring is and how the peer may notify it.
// It is a view on the bytes; see the package documentation for the layout.
type hello []byte

// Offsets and size of hello's fields.
const (
	helloMagic    = 0  // 4 bytes: "RSK1"
	helloVersion  = 4  // 1 byte: helloVersion1
	helloFlags    = 5  // 1 byte: flag bits
	helloReserved = 6  // 2 bytes: zero
	helloRingAddr = 8  // 8 bytes: address of the receive ring
	helloRingKey  = 16 // 4 bytes: rkey of the receive ring
	helloRingSize = 20 // 4 bytes: size of the receive ring in bytes
	helloRecvs    = 24 // 4 bytes: receives posted for control messages
	helloLen      = 28
)

const (
	helloVersion1 = 1
	// flagAcceptsImm: the sender of the hello takes control messages as
	// the immediate data of RDMA Writes; without it, as 4-byte Sends.
	flagAcceptsImm = 1 << 0
	// flagAcceptsInline: the sender of the hello posts receives of
	// inlineSlot bytes, which take a data message of up to inlineMax
	// bytes inside its Send (an inline data message).
	flagAcceptsInline = 1 << 1
	helloKnownFlags   = flagAcceptsImm | flagAcceptsInline
)

var helloMagicBytes = [4]byte{'R', 'S', 'K', '1'}

// errHello is wrapped by every error about a malformed hello.
var errHello = errors.New("rsock: the peer's connection data is not an rsock hello")

func (h hello) ringAddr() uint64 { return binary.BigEndian.Uint64(h[helloRingAddr:]) }
func (h hello) ringKey() uint32  { return binary.BigEndian.Uint32(h[helloRingKey:]) }
func (h hello) ringSize() uint32 { return binary.BigEndian.Uint32(h[helloRingSize:]) }
func (h hello) recvs() uint32    { return binary.BigEndian.Uint32(h[helloRecvs:]) }
func (h hello) flags() uint8     { return h[helloFlags] }

// putHello writes a hello into b, which holds at least helloLen bytes.
func putHello(b []byte, addr uint64, key, size, recvs uint32, flags uint8) hello {
	h := hello(b[:helloLen])
	copy(h[helloMagic:], helloMagicBytes[:])
	h[helloVersion] = helloVersion1
	h[helloFlags] = flags
	h[helloReserved], h[helloReserved+1] = 0, 0
	binary.BigEndian.PutUint64(h[helloRingAddr:], addr)
	binary.BigEndian.PutUint32(h[helloRingKey:], key)
	binary.BigEndian.PutUint32(h[helloRingSize:], size)
	binary.BigEndian.PutUint32(h[helloRecvs:], recvs)
	return h
}

// parseHello checks b and returns it as a hello. Any length, version,
// flag, ring size or receive count outside what this package sends is an
// error: a hello never makes the receiver trust more than it checked.
func parseHello(b []byte) (hello, error) {
	if len(b) < helloLen {
		return nil, fmt.Errorf("%w: %d bytes, want %d", errHello, len(b), helloLen)
	}
	h := hello(b[:helloLen])
	if [4]byte(h[helloMagic:helloMagic+4]) != helloMagicBytes {
		return nil, fmt.Errorf("%w: bad magic %q", errHello, h[helloMagic:helloMagic+4])
	}
	if h[helloVersion] != helloVersion1 {
		return nil, fmt.Errorf("%w: version %d, this side speaks %d", errHello, h[helloVersion], helloVersion1)
	}
	if h.flags()&^helloKnownFlags != 0 || h[helloReserved] != 0 || h[helloReserved+1] != 0 {
		return nil, fmt.Errorf("%w: unknown flags %#x", errHello, h.flags())
	}
	if s := h.ringSize(); s < MinRingSize || s > MaxRingSize {
		return nil, fmt.Errorf("%w: ring of %d bytes, outside %d to %d", errHello, s, MinRingSize, MaxRingSize)
	}
	if r := h.recvs(); r < 2 || r > maxAcks {
		return nil, fmt.Errorf("%w: %d receives, outside 2 to %d", errHello, r, maxAcks)
	}
	return h, nil
}

// ctrl is a control message: 4 bytes, carried as the immediate data of an
// RDMA Write with immediate or as the payload of a Send. See the package
// documentation for the layout.
type ctrl []byte

// Offsets and size of ctrl's fields.
const (
	ctrlOpAcks = 0 // 1 byte: op in the top 2 bits, acks in the low 6
	ctrlCount  = 1 // 3 bytes: byte count, big-endian
	ctrlLen    = 4
)

// Control message ops.
const (
	opCredit = 0 // count ring bytes the sender has consumed and frees
	opData   = 1 // count bytes were written into the receiver's ring
	opFin    = 2 // the sender writes no more (count is 0)
	opBad    = 3 // never sent
)

const (
	maxAcks  = 1<<6 - 1  // acks field
	maxCount = 1<<24 - 1 // count field
)

// Receive buffers: ctrlLen bytes, or inlineSlot on a side that takes
// inline data messages, whose bytes follow the control message in the
// Send.
const (
	inlineSlot = 128
	inlineMax  = inlineSlot - ctrlLen
)

func (m ctrl) op() uint8 { return m[ctrlOpAcks] >> 6 }
func (m ctrl) acks() int { return int(m[ctrlOpAcks] & maxAcks) }
func (m ctrl) count() uint32 {
	return uint32(m[ctrlCount])<<16 | uint32(m[ctrlCount+1])<<8 | uint32(m[ctrlCount+2])
}
func (m ctrl) word() uint32 { return binary.BigEndian.Uint32(m) }
func ctrlWord(w uint32, b *[ctrlLen]byte) ctrl {
	binary.BigEndian.PutUint32(b[:], w)
	return ctrl(b[:])
}

// makeCtrl returns the control message as its 32-bit word (the immediate
// data, or the Send payload's big-endian bytes). acks ≤ maxAcks and
// count ≤ maxCount.
func makeCtrl(op uint8, acks int, count uint32) uint32 {
	return uint32(op)<<30 | uint32(acks)<<24 | count
}

// errCtrl is wrapped by every error about a malformed control message.
var errCtrl = errors.New("rsock: the peer sent a malformed control message")

// parseCtrl checks a control message's form (not whether the peer had the
// credit for it: the connection's state decides that).
func parseCtrl(b []byte) (ctrl, error) {
	if len(b) != ctrlLen {
		return nil, fmt.Errorf("%w: %d bytes, want %d", errCtrl, len(b), ctrlLen)
	}
	m := ctrl(b)
	switch m.op() {
	case opData:
		if m.count() == 0 {
			return nil, fmt.Errorf("%w: data message of 0 bytes", errCtrl)
		}
	case opFin:
		if m.count() != 0 {
			return nil, fmt.Errorf("%w: end-of-stream message with a count of %d", errCtrl, m.count())
		}
	case opCredit:
	default:
		return nil, fmt.Errorf("%w: op %d", errCtrl, m.op())
	}
	return m, nil
}

// parseSend checks the payload of a Send: a control message, followed,
// where inline is set (the receiver takes inline data messages), by the
// bytes of a data message that announces exactly that many, at most
// inlineMax. The control message is copied into word (the receive
// buffer is posted again before the message is acted on); data is a
// view on b.
func parseSend(b []byte, inline bool, word *[ctrlLen]byte) (m ctrl, data []byte, err error) {
	if len(b) > ctrlLen && (!inline || len(b) > ctrlLen+inlineMax) {
		return nil, nil, fmt.Errorf("%w: a Send of %d bytes", errCtrl, len(b))
	}
	n := copy(word[:], b)
	if m, err = parseCtrl(word[:n]); err != nil {
		return nil, nil, err
	}
	data = b[n:]
	if len(data) > 0 && (m.op() != opData || int(m.count()) != len(data)) {
		return nil, nil, fmt.Errorf("%w: %d bytes after a control message of op %d, count %d", errCtrl, len(data), m.op(), m.count())
	}
	return m, data, nil
}
