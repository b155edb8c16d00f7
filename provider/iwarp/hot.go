package iwarp

import (
	"sync/atomic"
	"time"

	"github.com/goverbs/goverbs/internal/atomicrel"
)

// A CQ of many QPs keeps a hot list: the QPs that posted, or whose
// receive goroutine received something, recently. A poller that finds
// the CQ empty receives on the hot QPs' connections only (pollHot), not
// on every one: a read of an idle socket is a system call that finds
// nothing, and a connection the poller reads is one whose receive
// goroutine wakes on a timer to see whether the polls go on (stayOff).
// An idle connection thus costs the others nothing: its receive
// goroutine waits for the socket in the runtime's poller, receives what
// comes, which makes the QP hot, and the poller takes over.
//
// Each CQ looks at its hot list every pruneEvery empty polls, and lets
// go of a QP that has neither posted nor received anything for
// coldAfter, waking its receive goroutine, which then waits for the
// socket at once rather than for the polls to stop. Whatever the list
// says, completions are not lost: a QP's receive goroutine receives
// whenever no poller does.

// hotMinQPs: a CQ of at most this many QPs receives on each of them
// when empty; the hot list is for more.
const hotMinQPs = 4

// pruneEvery is how many empty polls of a CQ pass between looks at its
// hot list.
const pruneEvery = 64

// coldAfter is how long a QP stays in the hot list after its last post
// or receipt: as long as its receive goroutine stays off the socket
// after the last poll (pollGrace), so that a QP waiting for an answer
// that takes a while is still read by the poller when it comes.
const coldAfter = time.Millisecond

// hotQP is a QP in a CQ's hot list, with what the last look saw of it.
type hotQP struct {
	q      *qp
	in     *atomic.Bool // the QP's hotIn flag for this CQ
	act    uint64       // q.activity
	frames uint64       // its connection's rxFrames
	at     int64        // when the last look saw them change (monotime)
}

// warm marks the QP active, and puts it in its CQs' hot lists if it is
// not there. The caller holds no lock of the QP's or its connection's.
func (q *qp) warm() {
	// A load and a release store, not a locked addition: two posters at
	// once may count one, and the activity still changes.
	atomicrel.StoreUint64(&q.activity, q.activity.Load()+1)
	if !q.hotIn[0].Load() {
		q.sendCQ.addHot(q, &q.hotIn[0])
	}
	if q.recvCQ != q.sendCQ && !q.hotIn[1].Load() {
		q.recvCQ.addHot(q, &q.hotIn[1])
	}
}

// addHot adds q to the hot list, unless another caller does (in).
func (c *cq) addHot(q *qp, in *atomic.Bool) {
	if !in.CompareAndSwap(false, true) {
		return
	}
	c.hotMu.Lock()
	c.hot = append(c.hot, hotQP{q: q, in: in, act: q.activity.Load(), at: monotime()})
	c.hotMu.Unlock()
}

// pollHot receives on the connections of the hot QPs, and now and then
// lets go of those that have gone idle.
func (c *cq) pollHot() {
	c.hotMu.Lock()
	defer c.hotMu.Unlock()
	for i := range c.hot {
		if cn := c.hot[i].q.live.Load(); cn != nil {
			cn.pollRx()
		}
	}
	if c.hotPolls++; c.hotPolls%pruneEvery == 0 {
		c.pruneHot()
	}
}

// pruneHot drops from the hot list the QPs that have neither posted nor
// received for coldAfter, and those no longer connected. A QP that
// posts while it is dropped is kept, or added again by its poster.
// hotMu is held.
func (c *cq) pruneHot() {
	now := monotime()
	kept := c.hot[:0]
	for _, h := range c.hot {
		act, frames := h.q.activity.Load(), uint64(0)
		cn := h.q.live.Load()
		if cn != nil {
			frames = cn.rxFrames.Load()
			if act != h.act || frames != h.frames {
				h.act, h.frames, h.at = act, frames, now
			}
			if now-h.at <= int64(coldAfter) {
				kept = append(kept, h)
				continue
			}
		}
		h.in.Store(false)
		// A warm that saw the flag still set before the store has
		// changed the activity: keep the QP, unless a warm after the
		// store has taken the flag, and adds it again itself.
		if h.q.activity.Load() != act && h.in.CompareAndSwap(false, true) {
			h.act, h.at = h.q.activity.Load(), now
			kept = append(kept, h)
		} else if cn != nil {
			cn.wakeRx() // off its stay off the socket (stayOff)
		}
	}
	clear(c.hot[len(kept):])
	c.hot = kept
}

// dropHot removes q from the hot list, for a QP destroyed, and keeps it
// out: a post after Destroy finds its flags set. The caller holds no
// lock of q's.
func (c *cq) dropHot(q *qp) {
	c.hotMu.Lock()
	defer c.hotMu.Unlock()
	q.hotIn[0].Store(true)
	q.hotIn[1].Store(true)
	kept := c.hot[:0]
	for _, h := range c.hot {
		if h.q != q {
			kept = append(kept, h)
		}
	}
	clear(c.hot[len(kept):])
	c.hot = kept
}
