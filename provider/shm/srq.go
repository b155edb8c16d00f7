package shm

import (
	"sync"

	"github.com/goverbs/goverbs/internal/soft"
	"github.com/goverbs/goverbs/verbs/driver"
)

// srq is a shared receive queue in shared memory: the peers of every QP
// that uses it consume its receives with a CAS on its head.
type srq struct {
	ctx     *devCtx
	userCtx any
	seg     *segment
	ring    *recvRing
	n       int
	maxWR   uint32
	maxSGE  uint32

	// recvExposed: the regions receives of the SRQ were posted in
	// (exposeForRecv).
	recvExposed recvSet

	mu        sync.Mutex // serialises producers and Modify
	destroyed bool
	// armed: the limit is armed and its event has not been raised
	// since, which a peer's report (limitReached) then does once.
	// Guarded by mu.
	armed bool
}

func (p *pd) CreateSRQ(a driver.SRQInitAttr) (driver.SRQ, error) {
	if a.MaxSGE > maxSGE {
		return nil, driver.ErrInvalidArg
	}
	n := pow2(int(a.MaxWR))
	seg, err := newSegment("srq", ringSize(n, recvEntrySize(int(a.MaxSGE))))
	if err != nil {
		return nil, err
	}
	s := &srq{ctx: p.ctx, userCtx: a.UserCtx, seg: seg, ring: initRecvRing(seg.mem, n, int(a.MaxSGE), srqLogSize(n)), n: n, maxWR: a.MaxWR, maxSGE: a.MaxSGE}
	s.ring.h.state.Store(a.Limit)
	s.armed = a.Limit > 0
	p.ctx.mu.Lock()
	defer p.ctx.mu.Unlock()
	if err := soft.Admit(p.ctx.closed || p.Released(), len(p.ctx.srqs), deviceAttr.MaxSRQ); err != nil {
		seg.close()
		return nil, err
	}
	if p.ctx.srqs == nil {
		p.ctx.srqs = map[*srq]bool{}
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
		if err := driver.CheckRecvWR(&wrs[i], s.maxSGE); err != nil {
			return i, err
		}
		s.ctx.exposeForRecv(wrs[i].SGList, &s.recvExposed)
		if !s.ring.produce(&wrs[i], uint64(s.maxWR)) {
			return i, driver.ErrQueueFull
		}
	}
	return len(wrs), nil
}

// limitReached raises the limit event a peer reported: once per arming,
// and only once the shared limit word says the reporter disarmed it, so
// that a peer sending report after report cannot fill the context's
// event queue (and push out the events after them).
func (s *srq) limitReached() {
	s.mu.Lock()
	fire := s.armed && !s.destroyed && s.ring.h.state.Load() == 0
	if fire {
		s.armed = false
	}
	s.mu.Unlock()
	if fire {
		s.ctx.Event(driver.EventSRQLimitReached, s.userCtx)
	}
}

func (s *srq) Modify(a driver.SRQAttr, mask driver.SRQAttrMask) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return driver.ErrClosed
	}
	limit, set, err := soft.SRQLimit(a, mask, s.maxWR, "shm")
	if set {
		s.ring.h.state.Store(limit)
		s.armed = limit > 0
	}
	return err
}

func (s *srq) Query() (driver.SRQAttr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return driver.SRQAttr{}, driver.ErrClosed
	}
	return driver.SRQAttr{MaxWR: s.maxWR, MaxSGE: s.maxSGE, Limit: s.ring.h.state.Load()}, nil
}

func (s *srq) Destroy() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.destroyed {
		return driver.ErrClosed
	}
	s.destroyed = true
	s.ctx.mu.Lock()
	delete(s.ctx.srqs, s)
	s.ctx.mu.Unlock()
	s.ctx.forgetRecvs(&s.recvExposed)
	s.seg.close()
	return nil
}
