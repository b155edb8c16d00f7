package shm

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goverbs/goverbs/internal/atomicrel"
	"github.com/goverbs/goverbs/internal/soft"
	"github.com/goverbs/goverbs/internal/spin"
	"github.com/goverbs/goverbs/internal/swq"
	"github.com/goverbs/goverbs/verbs/driver"
)

// cq is a completion queue: its receive completions are in the rings of
// its QPs, which their peers write (takeRecv), its send completions in a
// private ring; its shared segment is the arming and futex word peers
// notify it with, and the doorbells they ring for its QPs (doorbell.go).
type cq struct {
	ctx     *devCtx
	userCtx any
	seg     *segment
	ring    *cqRing  // the shared header: arming, futex word (notifyRing)
	event   *cqEvent // the socket notifications wake the owner through (event.go)
	// sleeping counts this process's threads in Sleep, which touches the
	// shared header: Destroy waits for them before it unmaps it.
	sleeping atomic.Int32
	local    *localRing // send completions of this process's QPs
	n        int

	mu      spin.Lock // serialises consumers
	overrun atomic.Bool
	// recvQPs: the QPs that complete receives here, and what tells
	// whether each has one waiting (recvWatch); recvNext, where takeRecv
	// looks first. Guarded by mu.
	recvQPs   []*qp
	recvWatch []recvWatch
	recvNext  int
	// ownOnly: no QP completes receives here (recvWatch is empty) and
	// the CQ is not destroyed, so that Poll takes its send completions
	// alone, in line. Guarded by mu.
	ownOnly bool
	// bells: the doorbells in the CQ's segment, which say which QPs
	// have receive completions waiting; rb, the QPs they stand for and
	// those queued for Poll (doorbell.go). rb is guarded by mu.
	bells doorbells
	rb    recvBells

	// The QPs that complete sends here produce into local. While one
	// QP has ever done so, its lock serialises every produce and local
	// takes no compare-and-swap; from the second on (shared), all take
	// one (addSender). A CQ stays shared once it is, even after QPs go,
	// and firstSender keeps its QP's struct (not its shared memory)
	// until the CQ goes: a destroyed QP is not known never to produce
	// again, so its place is not handed on.
	// firstSender is written once, before its QP can produce; the
	// poller reads it for the completions of a CQ not yet shared,
	// whose ring does not name their QP (localRing.produce).
	sendersMu   sync.Mutex
	firstSender *qp
	firstSQ     *swq.Queue // firstSender's send queue, for Poll
	shared      atomic.Bool

	notifyOnce sync.Once
	notify     chan struct{}
	// armings counts ReqNotify calls: the waiter sends a token only for
	// a wake-up after one, not for those that Arm asked for (CQ.Wait's
	// own sleep, woken on the same word). Between the token for one and
	// the next, it waits for nudge rather than on the word, so that
	// those wake-ups do not wake its thread too.
	armings   atomic.Uint64
	solicited atomic.Bool // the last ReqNotify asked for solicited completions only
	nudge     chan struct{}
	stop      atomic.Bool
	waiter    sync.WaitGroup
	destroyed atomic.Bool
	// notOwn is set with destroyed and with shared: a producer that
	// finds it clear may use produceOwn, which one load tells.
	notOwn atomic.Bool
}

func (c *devCtx) CreateCQ(n int, userCtx any) (driver.CQ, error) {
	n = pow2(n)
	seg, err := newSegment("cq", cqSegSize)
	if err != nil {
		return nil, err
	}
	ev, err := newCQEvent()
	if err != nil {
		seg.close()
		return nil, err
	}
	q := &cq{ctx: c, userCtx: userCtx, seg: seg, ring: notifyRing(seg.mem), event: ev, bells: viewDoorbells(seg.mem), local: newLocalRing(n), n: n,
		notify: make(chan struct{}, 1), nudge: make(chan struct{}, 1), ownOnly: true}
	q.ring.notifier = ev.self()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := soft.Admit(c.closed, len(c.cqs), deviceAttr.MaxCQ); err != nil {
		seg.close()
		ev.close()
		return nil, err
	}
	if c.cqs == nil {
		c.cqs = map[*cq]bool{}
	}
	c.cqs[q] = true
	return q, nil
}

// pushSend adds the completion of q's send slot seq — of the WR wrid,
// with st, op and n bytes (a send completion says nothing else) — to the
// private ring. A lost one (a full ring: the overrun is recorded and
// raised) moves q to the error state. q.mu is held.
func (c *cq) pushSend(q *qp, seq, wrid uint64, st driver.WCStatus, op driver.WCOpcode, n uint32) {
	if c.notOwn.Load() || !c.local.produceOwn(seq, wrid, st, op, n) {
		c.pushSendSlow(q, seq, wrid, st, op, n)
		return
	}
	c.ring.notify(false, st != driver.WCSuccess)
}

// pushSendSlow is pushSend for a CQ that is destroyed, shared or full.
func (c *cq) pushSendSlow(q *qp, seq, wrid uint64, st driver.WCStatus, op driver.WCOpcode, n uint32) {
	if c.destroyed.Load() {
		q.fail(driver.EventQPFatal)
		return
	}
	if !c.local.produce(q, seq, wrid, st, op, n, c.shared.Load()) {
		c.markOverrun()
		q.fail(driver.EventQPFatal)
		return
	}
	c.ring.notify(false, st != driver.WCSuccess)
}

// addSender records that q completes its sends in c, before q can post.
// The first such QP produces into c.local with plain stores, which its
// lock orders; once a second comes, c is shared for good, and the first
// QP's lock is taken and released so that a produce of its own under
// way, which did not see the change, has ended before the second QP can
// produce. The caller holds no QP's lock.
func (c *cq) addSender(q *qp) {
	c.sendersMu.Lock()
	defer c.sendersMu.Unlock()
	switch {
	case c.firstSender == nil:
		c.local.ownedBy(q.num)
		c.firstSender, c.firstSQ = q, q.sq
	case !c.shared.Load():
		c.shared.Store(true)
		c.notOwn.Store(true)
		c.firstSender.mu.Lock()
		c.firstSender.mu.Unlock()
	}
}

func (c *cq) notifyOrOverrun(wc *driver.WorkCompletion, ok bool) bool {
	if !ok {
		c.markOverrun()
		return false
	}
	c.ring.notify(wc.Flags&driver.WCSolicited != 0, wc.Status != driver.WCSuccess)
	return true
}

func (c *cq) markOverrun() {
	if !c.overrun.Swap(true) {
		c.ctx.Event(driver.EventCQErr, c.userCtx)
	}
}

func (c *cq) Poll(wc []driver.WorkCompletion) int {
	// The common case in line: the first completion of a CQ of one QP's
	// send completions only, whose completions name no QP
	// (localRing.produceOwn). Anything else, and the completions after
	// that first one, are pollLocked's, which takes them from wc[n] on;
	// the calls out of line are the last thing done, so that nothing need
	// be kept on the stack around them. The lock is swapped at once: one
	// found held is waited for (pollWait), whose Lock swaps at once too.
	if !c.mu.TrySwap() {
		return c.pollWait(wc)
	}
	if !c.ownOnly {
		return c.pollLocked(wc, 0)
	}
	if len(wc) == 0 {
		c.mu.Unlock()
		return 0
	}
	r := c.local
	pos := r.head
	s := r.at(pos)
	if s.seq.Load() != pos+1 {
		c.mu.Unlock()
		return 0
	}
	if s.q != nil {
		return c.pollLocked(wc, 0)
	}
	wc[0] = s.wc
	c.firstSQ.Retire(s.retire)
	atomicrel.StoreUint64(&s.seq, pos+r.mask+1)
	r.head = pos + 1
	if r.tail.Load() != pos+1 && len(wc) > 1 {
		// A further completion reserved (one load, not the next
		// slot's): pollLocked takes it and those after it.
		return c.pollLocked(wc, 1)
	}
	c.mu.Unlock()
	return 1
}

// pollWait is Poll once c.mu is found held: it waits for it.
func (c *cq) pollWait(wc []driver.WorkCompletion) int {
	c.mu.Lock()
	return c.pollLocked(wc, 0)
}

// pollLocked is Poll with c.mu held, the completions taken into wc[:n]
// already; it releases c.mu.
func (c *cq) pollLocked(wc []driver.WorkCompletion, n int) int {
	// Destroy sets destroyed before it takes c.mu to unmap the ring.
	if c.destroyed.Load() {
		// Nothing to take.
	} else if len(c.recvWatch) == 0 {
		// A CQ of send completions only: its private ring alone.
		r := c.local
		for n < len(wc) {
			q, seq, ok := r.take(&wc[n])
			if !ok {
				break
			}
			if q == nil {
				q = c.firstSender
			}
			q.sq.Retire(seq)
			n++
		}
	} else {
		for n < len(wc) {
			if q, seq, ok := c.local.take(&wc[n]); ok {
				if q == nil {
					q = c.firstSender
				}
				q.sq.Retire(seq)
			} else if !c.takeRecv(&wc[n]) {
				break
			}
			n++
		}
	}
	c.mu.Unlock()
	return n
}

func (c *cq) ReqNotify(solicitedOnly bool) error {
	if c.destroyed.Load() {
		return driver.ErrClosed
	}
	c.startWaiter()
	c.solicited.Store(solicitedOnly)
	c.armings.Add(1)
	c.nudgeWaiter()
	_, err := c.arm(solicitedOnly)
	return err
}

// notifyRecheck bounds the notification goroutine's wait for the CQ's
// notification socket. The arming, the futex word and eventWaiter live in
// the CQ's shared header, which peers map writable, and a peer can fill
// the socket: a peer that clears the arming or eventWaiter, puts the word
// back after a wake-up, or keeps the socket full when a notification's
// byte comes keeps the producers' notifications from waking the
// goroutine. Each time the wait runs out, the goroutine looks at the
// ring itself, so such a peer delays a notification by this much at
// most, and cannot keep the goroutine asleep through Destroy. It is long
// because each wake-up of the goroutine costs far more than the look: at
// 50 ms, an idle process used 0.36–1.04% of a CPU (against 0.05–0.44%
// with no recheck); at 1 s, 0.06–0.09% (0.10–0.14% under -race).
const notifyRecheck = time.Second

// awaited reports whether a completion the last ReqNotify asked for
// waits in the CQ, for the notification goroutine.
func (c *cq) awaited() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.destroyed.Load() {
		return false
	}
	so := c.solicited.Load()
	return c.local.pending(so) || c.recvPending(so)
}

// Arm implements driver.Sleeper. It starts the notification goroutine
// too, which CQ.Wait needs once a wait outlasts its own sleep: starting it
// at the first Wait, rather than at the first long one, keeps its one-time
// allocations out of whatever loop is running by then. (It waits for a
// ReqNotify, not on the futex, so Arm's sleepers do not wake it.)
func (c *cq) Arm() (uint32, error) {
	c.startWaiter()
	return c.arm(false)
}

// Sleep implements driver.Sleeper: a futex wait on the wake word, which
// every notification (and Destroy) changes, counted in the header's
// sleepers so that notifications wake it (fire). A concurrent Destroy
// changes the word, so that the wait returns at once, and unmaps the
// header only once no Sleep is under way (sleeping).
func (c *cq) Sleep(ticket uint32, d time.Duration) {
	c.sleeping.Add(1)
	defer c.sleeping.Add(-1)
	if c.destroyed.Load() {
		return
	}
	h := c.ring.h
	h.sleepers.Add(1)
	futexWaitFor(&h.wake, ticket, d)
	h.sleepers.Add(^uint32(0))
}

// arm arms the CQ and returns the wake word's value from before: a
// notification for a completion after the arming changes it.
func (c *cq) arm(solicitedOnly bool) (uint32, error) {
	// Under the consumers' lock, which Destroy takes before it unmaps
	// the ring.
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.destroyed.Load() {
		return 0, driver.ErrClosed
	}
	ticket := c.ring.h.wake.Load()
	a := uint32(armedAny)
	if solicitedOnly {
		a = armedSolicited
		if !c.ring.h.armed.CompareAndSwap(unarmed, a) {
			return ticket, nil
		}
	} else {
		c.ring.h.armed.Store(a)
	}
	// A completion whose producer checked the arming before its release
	// store was visible is reserved already (see cqRing.pending): notify
	// for it now. (At worst the notification comes for a completion that
	// was there before the arming, which the caller's next poll takes.)
	// The private ring's producer publishes with a plain release store
	// and then loads the arming, which x86 may perform first: Fence makes
	// that producer either see the arming or have its store seen here.
	atomicrel.Fence()
	if c.local.pending(solicitedOnly) || c.recvPending(solicitedOnly) {
		c.ring.fire(a)
	}
	return ticket, nil
}

func (c *cq) Notify() <-chan struct{} {
	c.startWaiter()
	return c.notify
}

// startWaiter starts the goroutine that waits for the CQ's notification
// socket and turns each wake-up into a token on the notify channel.
func (c *cq) startWaiter() {
	c.notifyOnce.Do(func() {
		h := c.ring.h
		// Read the futex word before the CQ can be armed, so that the
		// first notification is seen even if it comes before the
		// goroutine runs.
		seen := h.wake.Load()
		c.waiter.Add(1)
		go func() {
			defer c.waiter.Done()
			var forwarded uint64
			for !c.stop.Load() {
				if c.armings.Load() == forwarded {
					// Every ReqNotify has had its token: wait for
					// the next, not for the futex word.
					<-c.nudge
					continue
				}
				h.eventWaiter.Store(1)
				if h.wake.Load() == seen {
					// A notification after the load sends to the
					// socket, having seen eventWaiter set (fire).
					// (The socket may also hold a wake-up from
					// before, which only makes this round a spurious
					// one.)
					byByte := c.event.wait(notifyRecheck)
					if h.wake.Load() == seen && !c.stop.Load() && !c.awaited() {
						if byByte {
							c.event.found(false)
						}
						continue
					}
					c.event.found(true)
					// Woken, stopping, or the completion is there
					// without a notification (notifyRecheck).
				}
				h.eventWaiter.Store(0)
				seen = h.wake.Load()
				if c.stop.Load() {
					return
				}
				// A wake-up since the last token, for this arming or
				// (at worst a spurious token) for Arm's sleepers
				// before it.
				forwarded = c.armings.Load()
				select {
				case c.notify <- struct{}{}:
					// The token readied the goroutine waiting for it
					// onto this processor: let it run now.
					runtime.Gosched()
				default:
				}
			}
		}()
	})
}

// nudgeWaiter tells the notification goroutine that a ReqNotify (or
// Destroy) came; the channel holds one nudge, which is enough.
func (c *cq) nudgeWaiter() {
	select {
	case c.nudge <- struct{}{}:
	default:
	}
}

func (c *cq) Err() error {
	if c.overrun.Load() {
		return driver.ErrCQOverrun
	}
	return nil
}

func (c *cq) Destroy() error {
	if c.destroyed.Swap(true) {
		return driver.ErrClosed
	}
	c.notOwn.Store(true)
	c.stop.Store(true)
	// No waiter starts from now on, and one starting now has been added
	// to c.waiter once this returns.
	c.notifyOnce.Do(func() {})
	c.nudgeWaiter()
	c.ring.h.wake.Add(1)
	futexWake(&c.ring.h.wake)
	c.ring.notifier.send()
	c.waiter.Wait()
	// A Sleep that began before destroyed was set sleeps on a ticket
	// from before the bump: its wait returns at once, and the thread
	// leaves the shared header alone before it is unmapped.
	for c.sleeping.Load() != 0 {
		futexWake(&c.ring.h.wake)
		runtime.Gosched()
	}
	c.ctx.mu.Lock()
	delete(c.ctx.cqs, c)
	c.ctx.mu.Unlock()
	c.mu.Lock()
	c.ownOnly = false
	c.seg.close()
	c.event.close()
	c.mu.Unlock()
	return nil
}
