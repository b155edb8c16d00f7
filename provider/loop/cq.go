package loop

import (
	"github.com/goverbs/goverbs/internal/soft"
	"github.com/goverbs/goverbs/verbs/driver"
)

// cq is a completion queue: soft's ring, guarded by fab.mu.
type cq struct {
	soft.CQ // Poll, ReqNotify, Notify, Err
	ctx     *devCtx
}

func (c *devCtx) CreateCQ(n int, userCtx any) (driver.CQ, error) {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	if err := soft.Admit(c.closed, len(c.cqs), deviceAttr.MaxCQ); err != nil {
		return nil, err
	}
	q := &cq{ctx: c}
	q.Init(n, userCtx, &fab.mu, &c.EventQueue)
	c.cqs = append(c.cqs, q)
	return q, nil
}

func (c *cq) Destroy() error {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	if !c.DestroyLocked() {
		return driver.ErrClosed
	}
	for i, x := range c.ctx.cqs {
		if x == c {
			c.ctx.cqs = append(c.ctx.cqs[:i], c.ctx.cqs[i+1:]...)
			break
		}
	}
	return nil
}
