package iwarp

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/goverbs/goverbs/internal/atomicrel"
	"github.com/goverbs/goverbs/internal/soft"
	"github.com/goverbs/goverbs/verbs/driver"
)

// cq is a completion queue: soft's ring behind a mutex. Completions are
// pushed by the connection goroutines and by posting goroutines that
// flush, and polled by the application.
type cq struct {
	soft.CQ // Notify, Err; guarded by mu
	ctx     *devCtx
	// qps are the QPs that complete here, whose connections a poller
	// that finds the CQ empty receives on (copy on write, under qpsMu).
	qps   atomic.Pointer[[]*qp]
	qpsMu sync.Mutex
	// empty counts the polls that found nothing. Pollers add to it with
	// a load and a release store rather than a locked addition (a locked
	// instruction is about 12 ns, a tenth of an empty poll's own work):
	// two pollers at once may count one poll, which only moves a yield.
	empty atomic.Uint32

	// ready holds the sockets of the QPs' connections that a poller
	// that finds the CQ empty reads when it has more than manyQPs QPs
	// (ready.go).
	ready readySet

	// postsLeft: a QP of the CQ left posted WRs in its send queue for
	// a poller to send (coalesce.go).
	postsLeft atomic.Bool
	// polls counts the application's Polls: posts are left for a later
	// writev only while the application polls (coalesce.go).
	polls atomic.Uint32

	mu sync.Mutex // guards the ring
}

func (c *devCtx) CreateCQ(n int, userCtx any) (driver.CQ, error) {
	q := &cq{ctx: c}
	q.Init(n, userCtx, &q.mu, &c.EventQueue)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := soft.Admit(c.closed, len(c.cqs), deviceAttr.MaxCQ); err != nil {
		return nil, err
	}
	c.cqs[q] = true
	return q, nil
}

// push adds a completion and reports whether it fired the notification
// of an armed CQ (woke); !ok when it was lost (soft.CQ.PushLocked), so
// that the caller moves the QP to the error state.
func (c *cq) push(e soft.Entry) (ok, woke bool) {
	c.mu.Lock()
	ok, woke = c.PushLocked(&e)
	c.mu.Unlock()
	return ok, woke
}

// attach adds q to the QPs that complete in c; the receive CQ of more
// than manyQPs of them gets a receiver (ready.go).
func (c *cq) attach(q *qp) {
	c.qpsMu.Lock()
	var qs []*qp
	if p := c.qps.Load(); p != nil {
		qs = append(qs, *p...)
	}
	qs = append(qs, q)
	c.qps.Store(&qs)
	c.qpsMu.Unlock()
	if c.ready.receiving.Load() {
		return
	}
	recvs := 0
	for _, x := range qs {
		if x.recvCQ == c {
			recvs++
		}
	}
	if recvs > manyQPs {
		if err := c.startReceiver(); err != nil {
			debugf("%v", err) // the receive goroutines read for it
		}
	}
}

// detach removes q from the QPs that complete in c.
func (c *cq) detach(q *qp) {
	c.qpsMu.Lock()
	defer c.qpsMu.Unlock()
	p := c.qps.Load()
	if p == nil {
		return
	}
	qs := make([]*qp, 0, len(*p))
	for _, x := range *p {
		if x != q {
			qs = append(qs, x)
		}
	}
	c.qps.Store(&qs)
}

// Poll takes completions from the ring; finding none, it receives what
// has arrived on the connections of the CQ's QPs (which may complete
// work) and looks again, so that a busy-polling application drives its
// connections itself. Of a CQ of many QPs, it receives on those that
// have something to read only (pollReady).
func (c *cq) Poll(wc []driver.WorkCompletion) int {
	c.polls.Add(1)
	if c.postsLeft.Load() {
		c.sendLeft()
	}
	if n := c.poll(wc); n > 0 {
		return n
	}
	if p := c.qps.Load(); p != nil {
		// A CQ that has had more than manyQPs keeps its ready set: its
		// receiver stands aside while the set is polled.
		if len(*p) > manyQPs || c.ready.watching.Load() {
			c.pollReady()
		} else {
			for _, q := range *p {
				if cn := q.live.Load(); cn != nil {
					cn.pollRx()
				}
			}
		}
		if n := c.poll(wc); n > 0 {
			return n
		}
	}
	// Completions also come from the connection goroutines (a receive
	// goroutine, a transmit goroutine finishing a large batch): a caller
	// that polls in a loop lets them run now and then rather than
	// holding its processor until preempted.
	empty := c.empty.Load() + 1
	atomicrel.StoreUint32(&c.empty, empty)
	if empty%yieldEvery == 0 {
		runtime.Gosched()
	}
	return 0
}

// yieldEvery is how many empty polls pass between yields of the
// processor. A yield is dear where another processor is idle: the runtime
// wakes a thread for the goroutine yielded, microseconds in all. A yield
// every 16th poll was about a third of an empty poll's time
// (BenchmarkPollEmpty), and a message arriving meanwhile waited for it.
const yieldEvery = 256

// poll takes completions from the ring.
func (c *cq) poll(wc []driver.WorkCompletion) int {
	if c.Held() == 0 {
		return 0
	}
	c.mu.Lock()
	n := c.PollLocked(wc)
	c.mu.Unlock()
	return n
}

// ReqNotify arms the CQ; an application that arms it is about to sleep,
// so the receive goroutines of its QPs take over receiving at once, or,
// of those whose receive CQ has a receiver, the receiver (ready.go).
func (c *cq) ReqNotify(solicitedOnly bool) error {
	if err := c.CQ.ReqNotify(solicitedOnly); err != nil {
		return err
	}
	if p := c.qps.Load(); p != nil {
		var woken *cq
		for _, q := range *p {
			if cn := q.live.Load(); cn != nil {
				if q.recvCQ.receives(q, cn) {
					if q.recvCQ != woken {
						woken = q.recvCQ
						woken.ready.wakeReceiver()
					}
				} else {
					cn.arms.Add(1)
					cn.wakeRx()
				}
				cn.flushLazy()
			}
		}
	}
	return nil
}

func (c *cq) Destroy() error {
	c.ctx.mu.Lock()
	if !c.ctx.cqs[c] {
		c.ctx.mu.Unlock()
		return driver.ErrClosed
	}
	c.destroyLocked()
	c.ctx.mu.Unlock()
	c.waitReceiver()
	return nil
}

// destroyLocked marks the CQ destroyed; c.ctx.mu is held.
func (c *cq) destroyLocked() {
	c.mu.Lock()
	c.DestroyLocked()
	c.mu.Unlock()
	c.closeReady()
	delete(c.ctx.cqs, c)
}
