package iwarp

import (
	"fmt"
	"sync"

	"github.com/goverbs/goverbs/internal/recvq"
	"github.com/goverbs/goverbs/verbs/driver"
)

// rwqe is a posted receive.
type rwqe = recvq.WR

// srq is a shared receive queue: a ring of receives that the connection
// goroutines of several QPs consume.
type srq struct {
	ctx     *devCtx
	pd      *pd
	userCtx any
	maxSGE  uint32

	mu        sync.Mutex // guards what follows
	ring      *recvq.Queue
	destroyed bool
}

func (p *pd) CreateSRQ(a driver.SRQInitAttr) (driver.SRQ, error) {
	if a.MaxSGE > maxSGE {
		return nil, fmt.Errorf("%w: %d SGEs, the device takes %d", driver.ErrInvalidArg, a.MaxSGE, maxSGE)
	}
	s := &srq{ctx: p.ctx, pd: p, userCtx: a.UserCtx, ring: recvq.New(int(a.MaxWR), a.MaxSGE), maxSGE: a.MaxSGE}
	s.ring.Limit = a.Limit
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
		if s.destroyed {
			return i, driver.ErrClosed
		}
		if err := s.ring.Post(&wrs[i]); err != nil {
			return i, err
		}
	}
	return len(wrs), nil
}

// take removes the next receive and copies it into dst; false when none
// is posted. It raises the limit event when fewer than the armed limit
// remain.
func (s *srq) take(dst *rwqe) bool {
	s.mu.Lock()
	ok, fire := false, false
	if !s.destroyed {
		ok, fire = s.ring.Take(dst)
	}
	s.mu.Unlock()
	if fire {
		s.ctx.Event(driver.EventSRQLimitReached, s.userCtx)
	}
	return ok
}

func (s *srq) Modify(a driver.SRQAttr, mask driver.SRQAttrMask) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return driver.ErrClosed
	}
	limit, set, err := driver.SRQLimit(a, mask, uint32(s.ring.Cap()), "iwarp")
	if set {
		s.ring.Limit = limit
	}
	return err
}

func (s *srq) Query() (driver.SRQAttr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return driver.SRQAttr{}, driver.ErrClosed
	}
	return driver.SRQAttr{MaxWR: uint32(s.ring.Cap()), MaxSGE: s.maxSGE, Limit: s.ring.Limit}, nil
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
