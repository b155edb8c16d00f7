package iwarp

import (
	"time"

	"github.com/goverbs/goverbs/verbs/driver"
)

// Coalescing: a small WR posted alone to a QP whose send queue is deep
// (many WRs posted and not yet retired, as in a stream), while the
// application polls the QP's CQs, is left in the queue rather than
// written to the socket at once, so that the WRs posted one at a time in
// a stream go out several to a writev, and reach the peer several to a
// read: a system call costs more than building a small WR's frame many
// times over. What is left goes out with the post that makes coalesceMax
// of them, at the next Poll of either of the QP's CQs, when the
// application arms one (ReqNotify) to sleep, when the connection is
// closed, and else when the lazy timer fires. A QP with a shallow queue
// (a ping-pong, a request and its response), with a CQ armed already,
// whose application has not polled lately, or whose posts come further
// apart than leaveGap (a writer that posts now and then) writes each WR
// at once.
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
// coalesceMax-1 WRs are left already, neither of its CQs is armed
// (another goroutine may be asleep on it, waiting for the answer to this
// WR: nothing would send it but the timer), the application polled one
// of them within leaveWindow (its next poll sends it), and posted within
// leaveGap before (its next post sends it). Reads and
// atomics go at once: the responder's ORD slots, not the system calls,
// bound their rate, and a Read left behind leaves a slot idle. q.mu is
// held.
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
	if n > coalesceBytes {
		return false
	}
	// When the application last polled, as the posts see it: the first
	// post after a poll of either CQ notes the time.
	polls := q.sendCQ.polls.Load()
	if q.recvCQ != q.sendCQ {
		polls += q.recvCQ.polls.Load()
	}
	now := monotime()
	if polls != q.pollsSeen {
		q.pollsSeen, q.pollSeenAt = polls, now
	}
	prev := q.lastPostAt
	q.lastPostAt = now
	return now-q.pollSeenAt < int64(leaveWindow) && now-prev < int64(leaveGap)
}

// leaveGap is how soon after the previous post a post may be left: a
// stream posts again within microseconds, and its next post sends what
// was left; a writer that posts now and then would leave each post to
// the timer. A variable so that tests can widen it.
var leaveGap = lazyAge

// leaveWindow is how recently the application must have polled a CQ of
// the QP for a post to be left: an application that polls in a loop
// polls again within microseconds, and that poll sends what was left; a
// post from one that does not (a writer that posts and goes on with
// other work) goes out at once. A variable so that tests can widen it.
var leaveWindow = time.Millisecond

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
