package loop

import "github.com/goverbs/goverbs/verbs/driver"

// cqe is a completion with what polling it must retire: send queue slots
// up to and including retire of QP q (nil for receive completions).
type cqe struct {
	wc        driver.WorkCompletion
	q         *qp
	retire    uint64
	solicited bool
}

// cq is a completion queue: a ring of cqes. Fields are guarded by fab.mu.
type cq struct {
	ctx       *devCtx
	userCtx   any
	ring      []cqe
	head      int // oldest entry
	count     int
	overrun   bool
	armed     driver.Arm
	notify    chan struct{}
	destroyed bool
}

func (c *devCtx) CreateCQ(n int, userCtx any) (driver.CQ, error) {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	if c.closed {
		return nil, driver.ErrClosed
	}
	live := 0
	for _, q := range c.cqs {
		if !q.destroyed {
			live++
		}
	}
	if live >= deviceAttr.MaxCQ {
		return nil, driver.ErrNoResources
	}
	q := &cq{ctx: c, userCtx: userCtx, ring: make([]cqe, n), notify: make(chan struct{}, 1)}
	c.cqs = append(c.cqs, q)
	return q, nil
}

// push adds a completion. If the ring is full the completion is lost: the
// CQ records the overrun, raises EventCQErr, and push reports false so
// that the caller moves the QP to the error state.
func (c *cq) push(e cqe) bool {
	if c.destroyed {
		return false
	}
	if c.count == len(c.ring) {
		if !c.overrun {
			c.overrun = true
			c.ctx.Event(driver.EventCQErr, c.userCtx)
		}
		return false
	}
	c.ring[(c.head+c.count)%len(c.ring)] = e
	c.count++
	if c.armed.Fire(&e.wc, e.solicited) {
		select {
		case c.notify <- struct{}{}:
		default:
		}
	}
	return true
}

func (c *cq) Poll(wc []driver.WorkCompletion) int {
	fab.mu.Lock()
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
	fab.mu.Unlock()
	return n
}

func (c *cq) ReqNotify(solicitedOnly bool) error {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	if c.destroyed {
		return driver.ErrClosed
	}
	c.armed.Request(solicitedOnly)
	return nil
}

func (c *cq) Notify() <-chan struct{} { return c.notify }

func (c *cq) Err() error {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	if c.overrun {
		return driver.ErrCQOverrun
	}
	return nil
}

func (c *cq) Destroy() error {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	if c.destroyed {
		return driver.ErrClosed
	}
	c.destroyed = true
	for i, x := range c.ctx.cqs {
		if x == c {
			c.ctx.cqs = append(c.ctx.cqs[:i], c.ctx.cqs[i+1:]...)
			break
		}
	}
	return nil
}
