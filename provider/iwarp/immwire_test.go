package iwarp_test

import (
	"encoding/binary"
	"testing"

	"github.com/goverbs/goverbs/provider/iwarp/wire"
)

// TestImmediateOnWire: the immediate data of a Send with immediate and
// of a Write with immediate travels in network byte order, as ibverbs'
// imm_data and siw put it. The value is read from the raw bytes of the
// recorded stream, the first four of the eight bytes of immediate data
// of each RFC 7306 Immediate Data FPDU, not through the provider's
// decoder.
func TestImmediateOnWire(t *testing.T) {
	rec := recordSession(t)
	var stream []byte
	for _, c := range rec.chunks {
		if c.fromInitiator {
			stream = append(stream, c.data...)
		}
	}
	// The MPA Request: 20 bytes and its private data.
	if len(stream) < 20 {
		t.Fatalf("the initiator sent %d bytes", len(stream))
	}
	b := stream[20+int(binary.BigEndian.Uint16(stream[18:])):]
	var imms []uint32
	for len(b) >= 4 {
		n := wire.FPDULen(int(binary.BigEndian.Uint16(b)))
		if n > len(b) {
			t.Fatalf("an FPDU of %d bytes with %d left in the stream", n, len(b))
		}
		// RDMAP opcode: the low four bits of the RDMAP control byte.
		if op := b[3] & 0x0f; op == 0x8 || op == 0x9 {
			imms = append(imms, binary.BigEndian.Uint32(b[wire.UntaggedLen:]))
		}
		b = b[n:]
	}
	want := []uint32{0x1234, 7} // recordSession's Send and Write with immediate
	if len(imms) != len(want) || imms[0] != want[0] || imms[1] != want[1] {
		t.Fatalf("immediates on the wire, read big-endian: %#x, want %#x", imms, want)
	}
}
