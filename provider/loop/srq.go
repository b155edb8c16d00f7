package loop

import (
	"github.com/goverbs/goverbs/verbs/driver"
)

// srq is a shared receive queue: a ring of receives several QPs consume.
// Fields are guarded by fab.mu.
type srq struct {
	ctx        *devCtx
	userCtx    any
	ring       []rwqe
	head, tail uint64
	maxSGE     uint32
	limit      uint32
	destroyed  bool
}

func (p *pd) CreateSRQ(a driver.SRQInitAttr) (driver.SRQ, error) {
	if a.MaxSGE > maxSGE {
		return nil, driver.ErrInvalidArg
	}
	s := &srq{ctx: p.ctx, userCtx: a.UserCtx, ring: make([]rwqe, a.MaxWR), maxSGE: a.MaxSGE, limit: a.Limit}
	for i := range s.ring {
		s.ring[i].sge = make([]driver.SGE, 0, a.MaxSGE)
	}
	fab.mu.Lock()
	defer fab.mu.Unlock()
	if p.ctx.closed || p.released {
		return nil, driver.ErrClosed
	}
	if p.ctx.srqs >= deviceAttr.MaxSRQ {
		return nil, driver.ErrNoResources
	}
	p.ctx.srqs++
	return s, nil
}

func (s *srq) PostRecv(wrs []driver.RecvWR) (int, error) {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	for i := range wrs {
		wr := &wrs[i]
		switch {
		case s.destroyed:
			return i, driver.ErrClosed
		case s.tail-s.head == uint64(len(s.ring)):
			return i, driver.ErrQueueFull
		}
		if err := driver.CheckRecvWR(wr, s.maxSGE); err != nil {
			return i, err
		}
		r := &s.ring[s.tail%uint64(len(s.ring))]
		r.wrid = wr.WRID
		r.sge = append(r.sge[:0], wr.SGList...)
		s.tail++
	}
	return len(wrs), nil
}

func (s *srq) peek() *rwqe {
	if s.head == s.tail || s.destroyed {
		return nil
	}
	return &s.ring[s.head%uint64(len(s.ring))]
}

// consume takes the receive peek returned and raises the limit event when
// fewer than the armed limit remain.
func (s *srq) consume() {
	s.head++
	if s.limit > 0 && s.tail-s.head < uint64(s.limit) {
		s.limit = 0
		s.ctx.Event(driver.EventSRQLimitReached, s.userCtx)
	}
}

func (s *srq) Modify(a driver.SRQAttr, mask driver.SRQAttrMask) error {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	if s.destroyed {
		return driver.ErrClosed
	}
	limit, set, err := driver.SRQLimit(a, mask, uint32(len(s.ring)), "loop")
	if set {
		s.limit = limit
	}
	return err
}

func (s *srq) Query() (driver.SRQAttr, error) {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	if s.destroyed {
		return driver.SRQAttr{}, driver.ErrClosed
	}
	return driver.SRQAttr{MaxWR: uint32(len(s.ring)), MaxSGE: s.maxSGE, Limit: s.limit}, nil
}

func (s *srq) Destroy() error {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	if s.destroyed {
		return driver.ErrClosed
	}
	s.destroyed = true
	s.ctx.srqs--
	return nil
}
