package iwarp

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/goverbs/goverbs/internal/atomicrel"
	"github.com/goverbs/goverbs/verbs/driver"
)

// cqe is a completion with what polling it must retire: send queue slots
// up to and including retire of QP q (nil for receive completions).
type cqe struct {
	wc     driver.WorkCompletion
	q      *qp
	retire uint64
}

// cq is a completion queue: a ring of cqes behind a mutex. Completions
// are pushed by the connection goroutines and by posting goroutines that
// flush, and polled by the application.
type cq struct {
	ctx     *devCtx
	userCtx any
	notify  chan struct{}
	// qps are the QPs that complete here, whose connections a poller
	// that finds the CQ empty receives on (copy on write, under qpsMu).
	qps   atomic.Pointer[[]*qp]
	qpsMu sync.Mutex
	// empty counts the polls that found nothing. Pollers add to it with
	// a load and a release store rather than a locked addition (a locked
	// instruction is about 12 ns, a tenth of an empty poll's own work):
	// two pollers at once may count one poll, which only moves a yield.
	empty atomic.Uint32
	// held is count, stored under mu with a release store and loaded
	// without it: a poll that finds the ring empty takes no lock (a
	// completion pushed meanwhile is found by the next poll, as one
	// pushed just after a locked look would be).
	held atomic.Uint32

	mu        sync.Mutex // guards what follows
	ring      []cqe
	head      int
	count     int
	overrun   bool
	armed     driver.Arm
	destroyed bool
}

func (c *devCtx) CreateCQ(n int, userCtx any) (driver.CQ, error) {
	q := &cq{ctx: c, userCtx: userCtx, ring: make([]cqe, n), notify: make(chan struct{}, 1)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, driver.ErrClosed
	}
	if len(c.cqs) >= deviceAttr.MaxCQ {
		return nil, driver.ErrNoResources
	}
	c.cqs[q] = true
	return q, nil
}

// push adds a completion and reports whether it fired the notification
// of an armed CQ (woke). If the ring is full the completion is lost: the
// CQ records the overrun, raises EventCQErr, and push reports !ok so
// that the caller moves the QP to the error state.
func (c *cq) push(e cqe) (ok, woke bool) {
	c.mu.Lock()
	if c.destroyed {
		c.mu.Unlock()
		return false, false
	}
	if c.count == len(c.ring) {
		first := !c.overrun
		c.overrun = true
		c.mu.Unlock()
		if first {
			c.ctx.Event(driver.EventCQErr, c.userCtx)
		}
		return false, false
	}
	c.ring[(c.head+c.count)%len(c.ring)] = e
	c.count++
	atomicrel.StoreUint32(&c.held, uint32(c.count))
	wake := c.armed.Fire(&e.wc, e.wc.Flags&driver.WCSolicited != 0)
	c.mu.Unlock()
	if wake {
		select {
		case c.notify <- struct{}{}:
		default:
		}
	}
	return true, wake
}

// attach adds q to the QPs that complete in c.
func (c *cq) attach(q *qp) {
	c.qpsMu.Lock()
	defer c.qpsMu.Unlock()
	var qs []*qp
	if p := c.qps.Load(); p != nil {
		qs = append(qs, *p...)
	}
	qs = append(qs, q)
	c.qps.Store(&qs)
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
// connections itself.
func (c *cq) Poll(wc []driver.WorkCompletion) int {
	if n := c.poll(wc); n > 0 {
		return n
	}
	if p := c.qps.Load(); p != nil {
		for _, q := range *p {
			if cn := q.live.Load(); cn != nil {
				cn.pollRx()
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
	if c.held.Load() == 0 {
		return 0
	}
	c.mu.Lock()
	n := 0
	for n < len(wc) && c.count > 0 && !c.destroyed {
		e := &c.ring[c.head]
		wc[n] = e.wc
		if e.q != nil {
			e.q.sq.Retire(e.retire)
			e.q = nil
		}
		c.head = (c.head + 1) % len(c.ring)
		c.count--
		n++
	}
	atomicrel.StoreUint32(&c.held, uint32(c.count))
	c.mu.Unlock()
	return n
}

// ReqNotify arms the CQ; an application that arms it is about to sleep,
// so the receive goroutines of its QPs take over receiving at once.
func (c *cq) ReqNotify(solicitedOnly bool) error {
	if p := c.qps.Load(); p != nil {
		for _, q := range *p {
			if cn := q.live.Load(); cn != nil {
				cn.arms.Add(1)
				cn.wakeRx()
				cn.flushLazy()
			}
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.destroyed {
		return driver.ErrClosed
	}
	c.armed.Request(solicitedOnly)
	return nil
}

func (c *cq) Notify() <-chan struct{} { return c.notify }

func (c *cq) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.overrun {
		return driver.ErrCQOverrun
	}
	return nil
}

func (c *cq) Destroy() error {
	c.ctx.mu.Lock()
	defer c.ctx.mu.Unlock()
	if !c.ctx.cqs[c] {
		return driver.ErrClosed
	}
	c.destroyLocked()
	return nil
}

// destroyLocked marks the CQ destroyed; c.ctx.mu is held.
func (c *cq) destroyLocked() {
	c.mu.Lock()
	c.destroyed = true
	c.mu.Unlock()
	delete(c.ctx.cqs, c)
}
