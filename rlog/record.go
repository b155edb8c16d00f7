package rlog

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// A frame is one record as the log stores it in its segment files and as
// the primary pushes it into a replica's buffer, a []byte view:
//
//	0   crc32c u32   CRC-32C (Castagnoli) of bytes 4 to the end of the payload
//	4   length u32   payload bytes
//	8   seq u64      the record's sequence number, 1 for the first record
//	16  epoch u64    the epoch of the primary that appended it
//	24  payload, then zero padding to a multiple of 8 bytes
//
// The checksum covers the header fields after it as well as the payload, so
// a frame that was torn (half written), overwritten, or placed at the
// wrong sequence number fails its check; a buffer of zeros never passes.
type frame []byte

const (
	frameHeader = 24
	frameAlign  = 8
	// MaxRecordLimit is the largest record size any configuration accepts.
	MaxRecordLimit = 16 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// frameLen is the length of the frame of a payload of n bytes, padding
// included.
func frameLen(n int) int { return (frameHeader + n + frameAlign - 1) &^ (frameAlign - 1) }

func (f frame) crc() uint32     { return binary.LittleEndian.Uint32(f[0:]) }
func (f frame) length() int     { return int(binary.LittleEndian.Uint32(f[4:])) }
func (f frame) seq() uint64     { return binary.LittleEndian.Uint64(f[8:]) }
func (f frame) epoch() uint64   { return binary.LittleEndian.Uint64(f[16:]) }
func (f frame) payload() []byte { return f[frameHeader : frameHeader+f.length()] }
func (f frame) sum() uint32     { return crc32.Checksum(f[4:frameHeader+f.length()], castagnoli) }
func (f frame) size() int       { return frameLen(f.length()) }
func (f frame) record() Record  { return Record{Seq: f.seq(), Epoch: f.epoch(), Data: f.payload()} }

// String describes the frame for messages.
func (f frame) String() string {
	return fmt.Sprintf("record %d (epoch %d, %d bytes)", f.seq(), f.epoch(), f.length())
}
func (f frame) setCRC(sum uint32) { binary.LittleEndian.PutUint32(f[0:], sum) }

// putFrame lays out the frame of payload in dst, which must hold
// frameLen(len(payload)) bytes, and returns its length.
func putFrame(dst []byte, seq, epoch uint64, payload []byte) int {
	n := frameLen(len(payload))
	f := frame(dst[:n])
	binary.LittleEndian.PutUint32(f[4:], uint32(len(payload)))
	binary.LittleEndian.PutUint64(f[8:], seq)
	binary.LittleEndian.PutUint64(f[16:], epoch)
	copy(f[frameHeader:], payload)
	clear(f[frameHeader+len(payload):])
	f.setCRC(f.sum())
	return n
}

// Errors of frame parsing.
var (
	errFrameShort = errors.New("rlog: frame header or payload cut short")
	errFrameLen   = errors.New("rlog: frame length beyond the record limit")
	errFrameCRC   = errors.New("rlog: frame checksum mismatch")
)

// parseFrame checks the frame at the start of b — that its header fits,
// its payload is at most max bytes and lies within b, and its checksum
// matches — and returns it with its padded length. It neither copies nor
// allocates.
func parseFrame(b []byte, max int) (frame, int, error) {
	if len(b) < frameHeader {
		return nil, 0, errFrameShort
	}
	f := frame(b)
	n := f.length()
	if n > max || n > MaxRecordLimit {
		return nil, 0, errFrameLen
	}
	size := frameLen(n)
	if size > len(b) {
		return nil, 0, errFrameShort
	}
	f = f[:size]
	if f.crc() != f.sum() {
		return nil, 0, errFrameCRC
	}
	return f, size, nil
}

// Record is one record of the log.
type Record struct {
	// Seq is the record's sequence number: the first record is 1, and
	// every record is one more than the one before it.
	Seq uint64
	// Epoch is the epoch of the primary that appended the record.
	Epoch uint64
	// Data is the record's payload.
	Data []byte
}
