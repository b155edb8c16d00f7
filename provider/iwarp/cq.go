package iwarp

import (
	"runtime"
	"sync"

	"github.com/goverbs/goverbs/verbs/driver"
)

// Notification arming of a CQ.
const (
	unarmed = iota
	armedAny
	armedSolicited
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

	mu        sync.Mutex // guards what follows
	ring      []cqe
	head      int
	count     int
	overrun   bool
	armed     int
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

// push adds a completion. If the ring is full the completion is lost: the
// CQ records the overrun, raises EventCQErr, and push reports false so
// that the caller moves the QP to the error state.
func (c *cq) push(e cqe) bool {
	c.mu.Lock()
	if c.destroyed {
		c.mu.Unlock()
		return false
	}
	if c.count == len(c.ring) {
		first := !c.overrun
		c.overrun = true
		c.mu.Unlock()
		if first {
			c.ctx.event(driver.EventCQErr, c.userCtx)
		}
		return false
	}
	c.ring[(c.head+c.count)%len(c.ring)] = e
	c.count++
	wake := c.armed == armedAny || (c.armed == armedSolicited && (e.wc.Flags&driver.WCSolicited != 0 || e.wc.Status != driver.WCSuccess))
	if wake {
		c.armed = unarmed
	}
	c.mu.Unlock()
	if wake {
		select {
		case c.notify <- struct{}{}:
		default:
		}
	}
	return true
}

func (c *cq) Poll(wc []driver.WorkCompletion) int {
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
	c.mu.Unlock()
	if n == 0 {
		// Completions come from the connection goroutines: a caller that
		// polls in a loop lets them run rather than holding its
		// processor until preempted.
		runtime.Gosched()
	}
	return n
}

func (c *cq) ReqNotify(solicitedOnly bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.destroyed {
		return driver.ErrClosed
	}
	if solicitedOnly {
		if c.armed != armedAny {
			c.armed = armedSolicited
		}
	} else {
		c.armed = armedAny
	}
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
