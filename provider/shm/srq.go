package shm

import (
	"fmt"
	"sync"
	"sync/atomic"

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
	// failed: the SRQ is in the error state (fail). Set under mu; read
	// without it by its QPs, which refuse to leave Reset once it is set.
	failed atomic.Bool
}

// errSRQFailed refuses receives posted to an SRQ in the error state, a
// QP created on it, and a QP of it leaving Reset.
var errSRQFailed = fmt.Errorf("%w: the SRQ failed (EventSRQErr): a peer wrote indices into its shared ring that no consumption explains, so its receives cannot be accounted for; destroy it and make another", driver.ErrInvalidState)

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
	n, failing, err := s.postRecv(wrs)
	s.mu.Unlock()
	if failing {
		s.fail()
	}
	return n, err
}

// postRecv posts wrs; failing reports that it found the ring's indices
// corrupt and moved the SRQ to the error state, which fail completes.
// s.mu is held.
func (s *srq) postRecv(wrs []driver.RecvWR) (n int, failing bool, err error) {
	for i := range wrs {
		switch {
		case s.destroyed:
			return i, false, driver.ErrClosed
		case s.failed.Load():
			return i, false, errSRQFailed
		}
		if err := driver.CheckRecvWR(&wrs[i], s.maxSGE); err != nil {
			return i, false, err
		}
		s.ctx.exposeForRecv(wrs[i].SGList, &s.recvExposed)
		if !s.ring.produce(&wrs[i], uint64(s.maxWR)) {
			if s.ring.headCorrupt() {
				s.failed.Store(true)
				return i, true, errSRQFailed
			}
			return i, false, driver.ErrQueueFull
		}
	}
	return len(wrs), false, nil
}

// fail completes the move of the SRQ to the error state, an SRQ
// catastrophic error of the IB specification: the consumers' head in
// its shared ring, which every peer of its QPs may write, says that more
// receives were consumed than were posted, or that a whole ring's worth
// more are outstanding than were, so the owner can no longer tell which
// receives are posted. It raises EventSRQErr, and moves every QP that
// takes its receives from the SRQ, and is not in Reset, to the error
// state with EventQPFatal: none of them can receive any more. A QP of
// the SRQ in Reset stays there (VetoModify), and CreateQP refuses the
// SRQ.
func (s *srq) fail() {
	s.ctx.Event(driver.EventSRQErr, s.userCtx)
	s.ctx.mu.Lock()
	var qps []*qp
	for q := range s.ctx.qps {
		if q.srq == s {
			qps = append(qps, q)
		}
	}
	s.ctx.mu.Unlock()
	for _, q := range qps {
		q.mu.Lock()
		if !q.destroyed && q.attr.State != driver.QPSReset {
			q.fail(driver.EventQPFatal)
		}
		q.mu.Unlock()
	}
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
