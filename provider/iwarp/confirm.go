package iwarp

import (
	"time"

	"github.com/goverbs/goverbs/provider/iwarp/wire"
)

// Confirmation: a Send or RDMA Write completes once the responder has
// placed it, which the requester learns from the response to a later
// Read or atomic; when none follows, it asks with a zero-length Read
// (needConfirm, addConfirm): at once for a signaled WR, after
// confirmDelay for unsignaled ones.

// confirmDelay is how long unsignaled Sends and Writes may wait for a
// confirmation to be asked for while the application polls: in a stream
// of them a later request or signaled WR usually covers them first, at
// no cost, and until it does they only keep their send queue slots
// (needConfirm asks anyway once half the queue waits). A poller marks
// the request due (pollRx) and the next post's batch carries it;
// confirmBackstop is the timer's delay, for an application that stops
// posting. Each confirmation costs both ends a frame, and each timer
// that fires wakes a thread, which on a busy machine takes a processor
// from the pollers: a short timer (tens of µs) makes a Send ping-pong
// measurably slower than these.
const (
	confirmDelay    = time.Millisecond
	confirmBackstop = 10 * time.Millisecond
)

// confirmNow is the confirmation timer: the transmitter asks for one.
func (c *conn) confirmNow() {
	c.confirmArmed.Store(false)
	c.confirmDue.Store(true)
	c.transmit()
}

// executed follows the execution of WRs into b: it completes what can
// complete, asks for a confirmation of the Sends and Writes when one is
// due, arms the timers that see to them, and the check that the peer
// answers. q.mu and c.txMu are held.
func (c *conn) executed(b *txBatch) {
	q := c.q
	q.completeInOrder()
	// A QP draining its send queue (SQD) asks at once.
	if !q.req.cur.active && q.req.needConfirm(int(q.cap.MaxSendWR), c.confirmDue.Load() || q.sqdPending) && q.req.addConfirm(b) {
		c.confirmDue.Store(false)
	}
	if q.req.unconfirmed() {
		if c.confirmSince.Load() == 0 {
			c.confirmSince.Store(monotime())
		}
		if !c.confirmArmed.Swap(true) {
			c.confirmTimer.Reset(confirmBackstop)
		}
	} else if c.confirmSince.Load() != 0 {
		// Asked for, or nothing left to confirm: a timer that fires
		// meanwhile has nothing to add.
		c.confirmSince.Store(0)
		c.confirmDue.Store(false)
	}
	c.armResponseCheck()
}

// confirmThreshold is how many bytes of Sends and Writes go out before
// the requester asks for a confirmation even though more follow.
const confirmThreshold = 512 << 10

// needConfirm reports whether the transmitter should add a zero-length
// Read to confirm the Sends and Writes sent since the last request, when
// there are some and a request slot is free: when many have piled up;
// else, when none is on its way, if one of them is signaled (its
// completion is awaited) or due says they have waited long enough. Only
// unsignaled WRs are left unconfirmed a while: the next request, a later
// signaled WR's confirmation, or, once they have waited confirmDelay, a
// poller's or the timer's request (due) covers them; their slots stay
// taken until it does.
func (r *requester) needConfirm(depth int, due bool) bool {
	if r.coverSeq >= r.execSeq || r.ord == 0 || r.orqLen() >= r.ord {
		return false
	}
	if r.uncovBytes >= confirmThreshold || r.execSeq-r.coverSeq >= uint64(max(depth/2, 1)) {
		return true
	}
	return !r.confirming() && (r.uncovSignaled || due)
}

// confirming reports whether a confirming Read is on its way.
func (r *requester) confirming() bool {
	for i := r.orqHead; i != r.orqTail; i++ {
		if r.orq[i%maxRdAtomic].kind == orqConfirm {
			return true
		}
	}
	return false
}

// unconfirmed reports whether executed Sends or Writes wait for a
// confirmation that nothing has asked for yet.
func (r *requester) unconfirmed() bool { return r.coverSeq < r.execSeq && r.ord > 0 && !r.confirming() }

// addConfirm builds a confirming zero-length Read Request into b.
func (r *requester) addConfirm(b *txBatch) bool {
	if !b.room(wire.ReadRequestLen, 0) {
		return false
	}
	e := r.pushORQ(orqConfirm)
	e.cover = r.execSeq
	r.msn[wire.QNRead]++
	wire.ReadRequest(b.header(wire.ReadRequestLen)).Set(r.msn[wire.QNRead], 0, 0, 0, 0, 0)
	b.endFrame(nil, 0, 0)
	r.coverSeq, r.uncovBytes, r.uncovSignaled = r.execSeq, 0, false
	return true
}
