package iwarp

import (
	"sync"

	"github.com/goverbs/goverbs/internal/recvq"
	"github.com/goverbs/goverbs/internal/soft"
	"github.com/goverbs/goverbs/verbs/driver"
)

// rwqe is a posted receive.
type rwqe = recvq.WR

// srq is a shared receive queue: soft's ring, which the connection
// goroutines of several QPs consume (Take), behind a mutex.
type srq struct {
	soft.SRQ // PostRecv, Modify, Query, Take; guarded by mu
	ctx      *devCtx
	pd       *pd
	mu       sync.Mutex
}

func (p *pd) CreateSRQ(a driver.SRQInitAttr) (driver.SRQ, error) {
	s := &srq{ctx: p.ctx, pd: p}
	if err := s.Init(a, "iwarp", maxSGE, &s.mu, &p.ctx.EventQueue); err != nil {
		return nil, err
	}
	p.ctx.mu.Lock()
	defer p.ctx.mu.Unlock()
	if err := soft.Admit(p.ctx.closed || p.Released(), len(p.ctx.srqs), deviceAttr.MaxSRQ); err != nil {
		return nil, err
	}
	p.ctx.srqs[s] = true
	return s, nil
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
	s.DestroyLocked()
	s.mu.Unlock()
	delete(s.ctx.srqs, s)
}
