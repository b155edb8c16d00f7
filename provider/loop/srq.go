package loop

import (
	"github.com/goverbs/goverbs/internal/recvq"
	"github.com/goverbs/goverbs/verbs/driver"
)

// srq is a shared receive queue: a ring of receives several QPs consume.
// Fields are guarded by fab.mu.
type srq struct {
	ctx       *devCtx
	userCtx   any
	ring      *recvq.Queue
	maxSGE    uint32
	destroyed bool
}

func (p *pd) CreateSRQ(a driver.SRQInitAttr) (driver.SRQ, error) {
	if a.MaxSGE > maxSGE {
		return nil, driver.ErrInvalidArg
	}
	s := &srq{ctx: p.ctx, userCtx: a.UserCtx, ring: recvq.New(int(a.MaxWR), a.MaxSGE), maxSGE: a.MaxSGE}
	s.ring.Limit = a.Limit
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
		if s.destroyed {
			return i, driver.ErrClosed
		}
		if err := s.ring.Post(&wrs[i]); err != nil {
			return i, err
		}
	}
	return len(wrs), nil
}

func (s *srq) peek() *rwqe {
	if s.destroyed {
		return nil
	}
	return s.ring.Peek()
}

// consume takes the receive peek returned and raises the limit event when
// fewer than the armed limit remain.
func (s *srq) consume() {
	if s.ring.Pop() {
		s.ctx.Event(driver.EventSRQLimitReached, s.userCtx)
	}
}

func (s *srq) Modify(a driver.SRQAttr, mask driver.SRQAttrMask) error {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	if s.destroyed {
		return driver.ErrClosed
	}
	limit, set, err := driver.SRQLimit(a, mask, uint32(s.ring.Cap()), "loop")
	if set {
		s.ring.Limit = limit
	}
	return err
}

func (s *srq) Query() (driver.SRQAttr, error) {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	if s.destroyed {
		return driver.SRQAttr{}, driver.ErrClosed
	}
	return driver.SRQAttr{MaxWR: uint32(s.ring.Cap()), MaxSGE: s.maxSGE, Limit: s.ring.Limit}, nil
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
