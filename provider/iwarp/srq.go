package iwarp

import (
	"fmt"
	"sync"

	"github.com/goverbs/goverbs/verbs/driver"
)

// rwqe is a posted receive.
type rwqe struct {
	wrid uint64
	sge  []driver.SGE
}

// srq is a shared receive queue: a ring of receives that the connection
// goroutines of several QPs consume.
type srq struct {
	ctx     *devCtx
	pd      *pd
	userCtx any
	maxSGE  uint32

	mu         sync.Mutex // guards what follows
	ring       []rwqe
	head, tail uint64
	limit      uint32
	destroyed  bool
}

func (p *pd) CreateSRQ(a driver.SRQInitAttr) (driver.SRQ, error) {
	if a.MaxSGE > maxSGE {
		return nil, fmt.Errorf("%w: %d SGEs, the device takes %d", driver.ErrInvalidArg, a.MaxSGE, maxSGE)
	}
	s := &srq{ctx: p.ctx, pd: p, userCtx: a.UserCtx, ring: make([]rwqe, a.MaxWR), maxSGE: a.MaxSGE, limit: a.Limit}
	for i := range s.ring {
		s.ring[i].sge = make([]driver.SGE, 0, a.MaxSGE)
	}
	p.ctx.mu.Lock()
	defer p.ctx.mu.Unlock()
	if p.ctx.closed || p.released {
		return nil, driver.ErrClosed
	}
	if len(p.ctx.srqs) >= deviceAttr.MaxSRQ {
		return nil, driver.ErrNoResources
	}
	p.ctx.srqs[s] = true
	return s, nil
}

func (s *srq) PostRecv(wrs []driver.RecvWR) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
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

// take removes the next receive and copies it into dst; false when none
// is posted. It raises the limit event when fewer than the armed limit
// remain.
func (s *srq) take(dst *rwqe) bool {
	s.mu.Lock()
	if s.head == s.tail || s.destroyed {
		s.mu.Unlock()
		return false
	}
	r := &s.ring[s.head%uint64(len(s.ring))]
	dst.wrid = r.wrid
	dst.sge = append(dst.sge[:0], r.sge...)
	s.head++
	fire := s.limit > 0 && s.tail-s.head < uint64(s.limit)
	if fire {
		s.limit = 0
	}
	s.mu.Unlock()
	if fire {
		s.ctx.Event(driver.EventSRQLimitReached, s.userCtx)
	}
	return true
}

func (s *srq) Modify(a driver.SRQAttr, mask driver.SRQAttrMask) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return driver.ErrClosed
	}
	limit, set, err := driver.SRQLimit(a, mask, uint32(len(s.ring)), "iwarp")
	if set {
		s.limit = limit
	}
	return err
}

func (s *srq) Query() (driver.SRQAttr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return driver.SRQAttr{}, driver.ErrClosed
	}
	return driver.SRQAttr{MaxWR: uint32(len(s.ring)), MaxSGE: s.maxSGE, Limit: s.limit}, nil
}

func (s *srq) Destroy() error {
	s.ctx.mu.Lock()
	defer s.ctx.mu.Unlock()
	if !s.ctx.srqs[s] {
		return driver.ErrClosed
	}
	s.destroyLocked()
	return nil
}

// destroyLocked marks the SRQ destroyed; s.ctx.mu is held.
func (s *srq) destroyLocked() {
	s.mu.Lock()
	s.destroyed = true
	s.mu.Unlock()
	delete(s.ctx.srqs, s)
}
