package iwarp

import "github.com/goverbs/goverbs/verbs/driver"

// Coalescing: a small WR posted alone to a QP whose send queue is deep (many
// WRs posted and not yet retired, as in a stream) is left in the queue
// rather than written to the socket at once, so that the WRs posted one
// at a time in a stream go out several to a writev, and reach the peer
// several to a read: a system call costs more than building a small
// WR's frame many times over. What is left goes out with the post that
// makes coalesceMax of them, at the next Poll of either of the QP's CQs,
// when the application arms one (ReqNotify) to sleep, and else when the
// lazy timer fires. A QP with a shallow queue (a ping-pong, a request
// and its response), or with a CQ armed already, writes each WR at once.
const (
	// coalesceDepth is how many WRs the send queue holds (posted and not
	// retired) from which a post may be left for the next.
	coalesceDepth = 16
	// coalesceMax is how many WRs left in the queue make a post write
	// them all.
	coalesceMax = 16
	// coalesceBytes is the largest WR left: a larger one's copies cost
	// more than a system call saved.
	coalesceBytes = 4 << 10
)

// mayLeave reports whether wr, posted alone, may be left in the send
// queue for a later writev: it is a Send or an RDMA Write of up to
// coalesceBytes, the QP sends, its queue is deep, fewer than
// coalesceMax-1 WRs are left already, and neither of its CQs is armed
// (another goroutine may be asleep on it, waiting for the answer to this
// WR: nothing would send it but the timer). Reads and atomics go at
// once: the responder's ORD slots, not the system calls, bound their
// rate, and a Read left behind leaves a slot idle. q.mu is held.
func (q *qp) mayLeave(wr *driver.SendWR) bool {
	switch wr.Opcode {
	case driver.OpSend, driver.OpSendWithImm, driver.OpRDMAWrite, driver.OpRDMAWriteWithImm:
	default:
		return false
	}
	if q.c == nil || q.attr.State != driver.QPSRTS || q.sq.Depth() < coalesceDepth || q.sq.Queued()+1 >= coalesceMax ||
		q.sendCQ.Armed() || q.recvCQ.Armed() {
		return false
	}
	n := uint64(0)
	for i := range wr.SGList {
		n += uint64(wr.SGList[i].Length)
	}
	return n <= coalesceBytes
}

// leftPost notes that a WR was left in the send queue: the connection's
// and its CQs' marks tell pollers to send it, and the lazy timer is the
// backstop. q.mu is held.
func (q *qp) leftPost() {
	c := q.c
	if c.postsLeft.Load() {
		// Marked already, and not yet sent: the round that clears the
		// mark (txRound, under q.mu) takes this WR too.
		return
	}
	c.postsLeft.Store(true)
	q.sendCQ.postsLeft.Store(true)
	if q.recvCQ != q.sendCQ {
		q.recvCQ.postsLeft.Store(true)
	}
	c.lazyTimer.Reset(leftBackstop)
}

// leftBackstop is how long the lazy timer gives a WR left in the send
// queue: lazyAge, a variable so that tests can see the other ways
// without it.
var leftBackstop = lazyAge

// sendLeft sends the WRs left in the send queues of the CQ's QPs, for a
// poller. The CQ's mark is cleared before the connections' are looked
// at: a QP that leaves a WR after its connection was looked at marks
// the CQ again.
func (c *cq) sendLeft() {
	c.postsLeft.Store(false)
	if p := c.qps.Load(); p != nil {
		for _, q := range *p {
			if cn := q.live.Load(); cn != nil && cn.postsLeft.Load() {
				cn.transmit()
			}
		}
	}
}
