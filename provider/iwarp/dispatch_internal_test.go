package iwarp

import (
	"testing"

	"github.com/goverbs/goverbs/provider/iwarp/wire"
)

// TestEveryOpcodeIsDispatched: every opcode the wire table defines
// reaches a handler that does what its FPDU does (rxEnd), and one that
// carries a payload also one that says where the payload goes (rxBegin),
// so that no payload is dropped for want of a handler.
func TestEveryOpcodeIsDispatched(t *testing.T) {
	for op := range wire.Opcode(1 << 4) {
		if !op.Defined() {
			continue
		}
		h := rxHandlers[op.Msg()]
		if h.end == nil {
			t.Errorf("%v (message %d) has no handler", op, op.Msg())
		}
		if !op.Bare() && h.begin == nil {
			t.Errorf("%v carries a payload and has no handler to place it", op)
		}
	}
}
