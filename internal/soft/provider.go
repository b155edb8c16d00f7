package soft

import (
	"fmt"
	"sync/atomic"

	"github.com/goverbs/goverbs/internal/swq"
	"github.com/goverbs/goverbs/verbs/driver"
)

// Open is the Open of a provider with one device, named device: it
// refuses any other name with ErrNoDevice and otherwise opens it with
// open.
func Open(name, device string, open func() (driver.Context, error)) (driver.Context, error) {
	if name != device {
		return nil, driver.ErrNoDevice
	}
	return open()
}

// Own returns x as the provider's own QP type T, or ErrInvalidArg when x
// is a QP of another provider.
func Own[T driver.QP](x driver.QP) (T, error) {
	q, ok := x.(T)
	if !ok {
		return q, fmt.Errorf("%w: QP of another provider", driver.ErrInvalidArg)
	}
	return q, nil
}

// QPNumbers hands out a provider's QP numbers: 24 bits, counting up
// from just above Base.
type QPNumbers struct {
	Base uint32
	n    atomic.Uint32
}

// Next is the next QP number.
func (q *QPNumbers) Next() uint32 { return (q.Base + q.n.Add(1)) & 0xffffff }

// PostSend is the skeleton of posting one send WR to sq, the send queue
// of a QP in state st whose registered memory is mem: a destroyed QP
// refuses it with ErrClosed, a QP not yet in RTS with ErrInvalidState.
func PostSend(sq *swq.Queue, mem swq.Memory, destroyed bool, st driver.QPState, wr *driver.SendWR) error {
	if destroyed {
		return driver.ErrClosed
	}
	if err := PostSendStateErr(st); err != nil {
		return err
	}
	return sq.Post(wr, mem)
}
