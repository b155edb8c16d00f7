package loop

import (
	"github.com/goverbs/goverbs/internal/soft"
	"github.com/goverbs/goverbs/verbs/driver"
)

// srq is a shared receive queue: soft's ring, guarded by fab.mu.
type srq struct {
	soft.SRQ // PostRecv, Modify, Query
	ctx      *devCtx
}

func (p *pd) CreateSRQ(a driver.SRQInitAttr) (driver.SRQ, error) {
	s := &srq{ctx: p.ctx}
	if err := s.Init(a, "loop", maxSGE, &fab.mu, &p.ctx.EventQueue); err != nil {
		return nil, err
	}
	fab.mu.Lock()
	defer fab.mu.Unlock()
	if err := soft.Admit(p.ctx.closed || p.Released(), p.ctx.srqs, deviceAttr.MaxSRQ); err != nil {
		return nil, err
	}
	p.ctx.srqs++
	return s, nil
}

func (s *srq) Destroy() error {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	if !s.DestroyLocked() {
		return driver.ErrClosed
	}
	s.ctx.srqs--
	return nil
}
