package soft

import (
	"fmt"
	"sync"

	"github.com/goverbs/goverbs/internal/recvq"
	"github.com/goverbs/goverbs/verbs/driver"
)

// SRQ is a shared receive queue in process memory: a ring of receives
// that several QPs consume, with its limit event. Mu, set by Init, guards
// it: PostRecv, Modify and Query take it; the methods named Locked expect
// it held.
type SRQ struct {
	Mu      sync.Locker
	UserCtx any
	// Events receives EventSRQLimitReached.
	Events *EventQueue

	provider  string
	ring      *recvq.Queue
	maxSGE    uint32
	destroyed bool
}

// Init makes s an empty SRQ as a asks, of the provider named in errors,
// that takes receives of at most maxSGE entries; mu guards it.
func (s *SRQ) Init(a driver.SRQInitAttr, provider string, maxSGE uint32, mu sync.Locker, ev *EventQueue) error {
	if a.MaxSGE > maxSGE {
		return fmt.Errorf("%w: %d SGEs, the device takes %d", driver.ErrInvalidArg, a.MaxSGE, maxSGE)
	}
	*s = SRQ{Mu: mu, UserCtx: a.UserCtx, Events: ev, provider: provider, ring: recvq.New(int(a.MaxWR), a.MaxSGE), maxSGE: a.MaxSGE}
	s.ring.Limit = a.Limit
	return nil
}

// PostRecv posts wrs in order; it returns how many were posted, and why
// the next was not.
func (s *SRQ) PostRecv(wrs []driver.RecvWR) (int, error) {
	s.Mu.Lock()
	defer s.Mu.Unlock()
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

// PeekLocked is the receive the next message consumes, or nil.
func (s *SRQ) PeekLocked() *recvq.WR {
	if s.destroyed {
		return nil
	}
	return s.ring.Peek()
}

// PopLocked consumes the receive PeekLocked returned, raising the limit
// event when fewer than the armed limit remain.
func (s *SRQ) PopLocked() {
	if s.ring.Pop() {
		s.Events.Event(driver.EventSRQLimitReached, s.UserCtx)
	}
}

// Take removes the next receive into dst under Mu; false when none is
// posted. It raises the limit event, outside Mu, when fewer than the
// armed limit remain.
func (s *SRQ) Take(dst *recvq.WR) bool {
	s.Mu.Lock()
	ok, fire := false, false
	if !s.destroyed {
		ok, fire = s.ring.Take(dst)
	}
	s.Mu.Unlock()
	if fire {
		s.Events.Event(driver.EventSRQLimitReached, s.UserCtx)
	}
	return ok
}

// Modify arms the limit; an SRQ cannot be resized.
func (s *SRQ) Modify(a driver.SRQAttr, mask driver.SRQAttrMask) error {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	if s.destroyed {
		return driver.ErrClosed
	}
	limit, set, err := SRQLimit(a, mask, uint32(s.ring.Cap()), s.provider)
	if set {
		s.ring.Limit = limit
	}
	return err
}

// Query reports the SRQ's size, SGE limit and armed limit.
func (s *SRQ) Query() (driver.SRQAttr, error) {
	s.Mu.Lock()
	defer s.Mu.Unlock()
	if s.destroyed {
		return driver.SRQAttr{}, driver.ErrClosed
	}
	return driver.SRQAttr{MaxWR: uint32(s.ring.Cap()), MaxSGE: s.maxSGE, Limit: s.ring.Limit}, nil
}

// DestroyLocked marks the SRQ destroyed: it takes and yields no more
// receives. It reports false if it already was.
func (s *SRQ) DestroyLocked() bool {
	if s.destroyed {
		return false
	}
	s.destroyed = true
	return true
}
