package soft

import (
	"sync"
	"sync/atomic"

	"github.com/goverbs/goverbs/internal/atomicrel"
	"github.com/goverbs/goverbs/internal/swq"
	"github.com/goverbs/goverbs/verbs/driver"
)

// Entry is a completion in a CQ ring, with what polling it retires: the
// send queue slots up to and including Retire of SQ (nil for a receive
// completion).
type Entry struct {
	WC     driver.WorkCompletion
	SQ     *swq.Queue
	Retire uint64
}

// CQ is a completion queue in process memory: a ring of entries, its
// overrun, its notification arming and channel. Mu, set by Init, guards
// it: Poll, ReqNotify, Err and Destroy take it; the methods named Locked
// expect it held.
type CQ struct {
	Mu      sync.Locker
	UserCtx any
	// Events receives EventCQErr on the first overrun.
	Events *EventQueue

	ring  []Entry
	head  int // oldest entry
	count int
	// held is count, stored under Mu with a release store and loaded
	// without it (Held), so that a poll of an empty ring can skip the
	// lock. It is stored before an armed CQ is signalled: a waiter woken
	// by the notification finds the completion that fired it.
	held    atomic.Uint32
	overrun bool
	armed   Arm
	// armedNow is whether armed is set, stored under Mu and loaded
	// without it (Armed).
	armedNow  atomic.Bool
	notify    chan struct{}
	destroyed bool
}

// Init makes c an empty ring of n entries guarded by mu.
func (c *CQ) Init(n int, userCtx any, mu sync.Locker, ev *EventQueue) {
	*c = CQ{Mu: mu, UserCtx: userCtx, Events: ev, ring: make([]Entry, n), notify: make(chan struct{}, 1)}
}

// PushLocked adds a completion and reports whether it fired the
// notification of an armed CQ (woke). If the CQ is destroyed or its ring
// is full the completion is lost: a full CQ records the overrun and
// raises EventCQErr once, and PushLocked reports !ok so that the caller
// moves the QP to the error state.
func (c *CQ) PushLocked(e *Entry) (ok, woke bool) {
	if c.destroyed {
		return false, false
	}
	if c.count == len(c.ring) {
		if !c.overrun {
			c.overrun = true
			c.Events.Event(driver.EventCQErr, c.UserCtx)
		}
		return false, false
	}
	c.ring[(c.head+c.count)%len(c.ring)] = *e
	c.count++
	atomicrel.StoreUint32(&c.held, uint32(c.count))
	if c.armed.Fire(&e.WC, e.WC.Flags&driver.WCSolicited != 0) {
		c.armedNow.Store(false)
		select {
		case c.notify <- struct{}{}:
		default:
		}
		return true, true
	}
	return true, false
}

// Held is how many completions wait in the ring, read without Mu: a
// Held of 0 may miss a completion being pushed (the next look finds it),
// never one whose notification has been signalled.
func (c *CQ) Held() uint32 { return c.held.Load() }

// LenLocked is how many completions wait in the ring.
func (c *CQ) LenLocked() int { return c.count }

// PollLocked moves up to len(wc) completions into wc, oldest first,
// retiring the send queue slots they complete, and returns how many.
func (c *CQ) PollLocked(wc []driver.WorkCompletion) int {
	n := 0
	for n < len(wc) && c.count > 0 && !c.destroyed {
		e := &c.ring[c.head]
		wc[n] = e.WC
		if e.SQ != nil {
			e.SQ.Retire(e.Retire)
			e.SQ = nil
		}
		c.head = (c.head + 1) % len(c.ring)
		c.count--
		n++
	}
	atomicrel.StoreUint32(&c.held, uint32(c.count))
	return n
}

// Poll is PollLocked under Mu.
func (c *CQ) Poll(wc []driver.WorkCompletion) int {
	c.Mu.Lock()
	n := c.PollLocked(wc)
	c.Mu.Unlock()
	return n
}

// ReqNotify arms the CQ for its next completion or, with solicitedOnly,
// its next solicited or failed one.
func (c *CQ) ReqNotify(solicitedOnly bool) error {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	if c.destroyed {
		return driver.ErrClosed
	}
	c.armed.Request(solicitedOnly)
	c.armedNow.Store(true)
	return nil
}

// Armed reports whether the CQ is armed (ReqNotify) and no completion
// has fired it since: an application may be asleep on it. It takes no
// lock, so it may be a moment late either way.
func (c *CQ) Armed() bool { return c.armedNow.Load() }

// Notify is the channel an armed CQ signals.
func (c *CQ) Notify() <-chan struct{} { return c.notify }

// Err reports ErrCQOverrun once a completion was lost.
func (c *CQ) Err() error {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	if c.overrun {
		return driver.ErrCQOverrun
	}
	return nil
}

// DestroyedLocked reports whether the CQ is destroyed.
func (c *CQ) DestroyedLocked() bool { return c.destroyed }

// DestroyLocked marks the CQ destroyed: it takes and yields no more
// completions. It reports false if it already was.
func (c *CQ) DestroyLocked() bool {
	if c.destroyed {
		return false
	}
	c.destroyed = true
	return true
}
