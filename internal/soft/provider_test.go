package soft

import (
	"errors"
	"testing"

	"github.com/goverbs/goverbs/internal/swq"
	"github.com/goverbs/goverbs/verbs/driver"
)

func TestOpenNamesTheOneDevice(t *testing.T) {
	opened := 0
	open := func() (driver.Context, error) { opened++; return nil, nil }
	if _, err := Open("other0", "dev0", open); !errors.Is(err, driver.ErrNoDevice) || opened != 0 {
		t.Fatalf("Open of another name: %v, opened %d times", err, opened)
	}
	if _, err := Open("dev0", "dev0", open); err != nil || opened != 1 {
		t.Fatalf("Open of the device: %v, opened %d times", err, opened)
	}
}

// ownQP is a provider's QP type; otherQP another provider's.
type ownQP struct{ driver.QP }
type otherQP struct{ driver.QP }

func TestOwnRefusesAnotherProvidersQP(t *testing.T) {
	if _, err := Own[*ownQP](&otherQP{}); !errors.Is(err, driver.ErrInvalidArg) {
		t.Fatalf("Own of a foreign QP: %v", err)
	}
	mine := &ownQP{}
	if q, err := Own[*ownQP](mine); err != nil || q != mine {
		t.Fatalf("Own of our QP: %v, %v", q, err)
	}
}

func TestQPNumbersCountFromBaseIn24Bits(t *testing.T) {
	n := QPNumbers{Base: 0xfffffe}
	if a, b, c := n.Next(), n.Next(), n.Next(); a != 0xffffff || b != 0 || c != 1 {
		t.Fatalf("numbers %#x %#x %#x, want 0xffffff 0 1", a, b, c)
	}
}

// noMemory is a QP with no registered memory.
type noMemory struct{}

func (noMemory) LocalSpan(*driver.SGE, driver.AccessFlags) ([]byte, bool) { return nil, false }

func TestPostSendChecksTheQPFirst(t *testing.T) {
	sq := swq.New(driver.QPCap{MaxSendWR: 1, MaxSendSGE: 1}, false)
	wr := &driver.SendWR{Opcode: driver.OpSend}
	if err := PostSend(sq, noMemory{}, true, driver.QPSRTS, wr); !errors.Is(err, driver.ErrClosed) {
		t.Fatalf("PostSend to a destroyed QP: %v", err)
	}
	if err := PostSend(sq, noMemory{}, false, driver.QPSRTR, wr); !errors.Is(err, driver.ErrInvalidState) {
		t.Fatalf("PostSend before RTS: %v", err)
	}
	if err := PostSend(sq, noMemory{}, false, driver.QPSRTS, wr); err != nil {
		t.Fatalf("PostSend in RTS: %v", err)
	}
	if err := PostSend(sq, noMemory{}, false, driver.QPSRTS, wr); !errors.Is(err, driver.ErrQueueFull) {
		t.Fatalf("PostSend into a full queue: %v", err)
	}
}
