package iwarp

import (
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/goverbs/goverbs/internal/atomicrel"
	"github.com/goverbs/goverbs/verbs/driver"
)

// Receiving is a resumable state machine over a non-blocking socket, run
// by whoever holds rxMu: the connection's receive goroutine, which waits
// for the socket to become readable, or an application goroutine polling
// one of the QP's CQs (cq.Poll), which reads what has arrived without
// waiting. A busy-polling application thus takes its completions from
// the socket itself, with no goroutine switch on the way (the progress
// model of UCX and libfabric), and one that waits relies on the
// goroutine.

// rxLoop is the receive goroutine: it receives whenever the socket is
// readable and no poller is receiving, until the stream ends.
func (c *conn) rxLoop() {
	defer c.wg.Done()
	defer c.running.Add(-1)
	defer c.finish()
	c.joinReady()
	err := c.rxRun()
	c.rxEnded.Store(true)
	c.rxMu.Lock()
	if c.rx.err == nil {
		c.rx.err = err
	}
	held := c.rx.held
	c.rx.held = false
	c.rxMu.Unlock()
	if held {
		c.releaseRecv()
	}
	debugf("QP %d: stream ended: %v", c.q.num, err)
	if err == io.EOF && !c.ext {
		c.creditOrderlyEnd()
	}
	var te *termError
	if errors.As(err, &te) {
		if te.event == driver.EventQPAccessErr && c.guard != nil {
			c.guard.Fail(c.peer)
		}
		c.protocolError(te)
	}
	// The socket closes first (abort waits for a writev in progress), so
	// that a Dereg that no longer finds the connection live has nothing
	// of its region still going out (revokeRead).
	c.abort()
	c.q.live.CompareAndSwap(c, nil)
	c.leaveReady()
	c.rxMu.Lock()
	c.sk.release()
	c.rxMu.Unlock()
}

// pollGrace is how long the receive goroutine stays off the socket
// after it has seen an application poll: while one polls, the goroutine
// waking at every FPDU would only take processor time from it (two
// busy-polling processes fill a two-core machine) and contend for the
// socket. An application that goes to sleep on the CQ (ReqNotify) hands
// receiving back at once. Tests set it (SetPollGrace) while timers of
// receivers gone with an earlier test may still read it: an atomic.
func pollGrace() time.Duration { return time.Duration(pollGraceNS.Load()) }

var pollGraceNS atomic.Int64

func init() { pollGraceNS.Store(int64(time.Millisecond)) }

// rxSpin is how long the receive goroutine keeps reading after it last
// found an FPDU, before it waits for the socket: a responder serving a
// stream of requests (RDMA Reads of a passive peer, say) then answers
// each without the thread wake-up that waiting costs, which is several
// times the work of the request itself; the price is up to rxSpin of a
// processor after each FPDU that finds no other.
//
// The goroutine spins only after an FPDU that came within rxSpinGap of
// the one before it (spinsAfter). A connection that receives seldom, one
// of many an application's Writes go round in turn, say, waits for its
// socket at once: were each of a thousand such goroutines to spin after
// every FPDU, they would spend rxSpin of a processor on each, for
// nothing, and take it from the applications.
const rxSpin = 50 * time.Microsecond

// rxSpinGap is the longest gap between FPDUs after which the receive
// goroutine still spins. It is many times rxSpin: in a ping-pong whose
// ends both wait on their CQs, each gap holds the peer's wake-up as well
// when the peer did not spin either, so a bound of rxSpin would keep both
// from spinning for good once one wake-up made a gap longer than it;
// within rxSpinGap they spin again and the gaps shrink back.
const rxSpinGap = time.Millisecond

// spinsAfter reports whether the receive goroutine spins (rxSpin) after
// it found FPDUs at now, the previous ones at last (the zero time:
// none): only if the gap between them was shorter than rxSpinGap.
func spinsAfter(last, now time.Time) bool {
	return !last.IsZero() && now.Sub(last) < rxSpinGap
}

// spin is how a receiver keeps reading for a while after it found FPDUs
// before it waits (rxSpin, spinsAfter): the receive goroutine's, and a
// CQ's receiver's (ready.go).
type spin struct{ until, last time.Time }

// found notes FPDUs found at now.
func (s *spin) found(now time.Time) {
	s.until = time.Time{}
	if spinsAfter(s.last, now) {
		s.until = now.Add(rxSpin)
	}
	s.last = now
}

// stop ends a spin, for a receiver that stands aside.
func (s *spin) stop() { s.until = time.Time{} }

// on reports whether the spin goes on; past its end it stops.
func (s *spin) on() bool {
	if s.until.IsZero() {
		return false
	}
	if time.Now().Before(s.until) {
		return true
	}
	s.until = time.Time{}
	return false
}

// rxRun receives until the stream ends, and returns why.
func (c *conn) rxRun() error {
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	seenPolls, seenArms := c.polls.Load(), c.arms.Load()
	// The polls of the CQs' ready sets at the last look (park): those
	// before the connection started are none of its concern.
	var seenCQPolls [2]uint64
	for i, q := range c.q.cqs() {
		if q != nil {
			seenCQPolls[i] = q.ready.polls.Load()
		}
	}
	var sp spin
	for {
		if c.rxStopped.Load() {
			// A disconnect stopped receiving: wait for its abort.
			for !c.aborted.Load() {
				<-c.rxWake
			}
			return net.ErrClosed
		}
		frames := c.rxFrames.Load()
		err := c.rxTry(byGoroutine)
		more := err == errBudget // more may be waiting
		if more {
			err = nil
		}
		if err != nil {
			return err
		}
		if c.rxFrames.Load() != frames {
			sp.found(time.Now())
		}
		if more {
			// What is left is the goroutine's, whether or not an
			// application polls: a CQ's ready set reports the socket
			// again only when more arrives (ready.go), and a poller
			// that used its own budget left the rest to this round.
			continue
		}
		// An application polls if it has polled since the last look
		// and not armed a CQ to sleep on since.
		polls, arms := c.polls.Load(), c.arms.Load()
		if arms == seenArms && c.parkOnCQ(&seenCQPolls) {
			seenPolls = c.polls.Load()
			sp.stop()
			continue
		}
		if polls != seenPolls && arms == seenArms {
			seenPolls = polls
			c.stayOff(t, &seenPolls, seenArms)
			continue
		}
		seenPolls, seenArms = polls, arms
		if sp.on() {
			c.sk.unwatchIn()
			runtime.Gosched()
			continue
		}
		c.onSocket.Store(true)
		err = c.sk.waitIn()
		c.onSocket.Store(false)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				// A poller kicked the goroutine (kickRx), or the CQ's
				// receiver did (receiveFor).
				c.sk.unkick()
				continue
			}
			c.rxMu.Lock()
			if c.rx.err == nil {
				c.rx.err = err
			}
			err = c.rx.err
			c.rxMu.Unlock()
			return err
		}
	}
}

// stayOff keeps the receive goroutine off the socket while the
// application goes on polling: it looks whether the application has
// polled since its last look (seenPolls) and has not armed a CQ to sleep
// on (arms still seenArms), and returns once one of them fails, the
// connection stops receiving, or a poller or ReqNotify wakes it
// (wakeRx). It looks pollGrace after the last poll it knows the time of
// (polledAt), so that it takes the socket back about pollGrace after the
// polls stop, and at most every pollGrace/4 (a poller too slow to stamp
// the time often). It takes neither rxMu nor the socket meanwhile: a
// round of its own would find a poller holding rxMu about half the time
// and sleep on it, to be woken by the poller's unlock, and each such
// wake-up puts a thread on a processor that two busy-polling processes
// already fill (staying off cuts the futex calls of a long send_lat by
// about a third).
func (c *conn) stayOff(t *time.Timer, seenPolls *uint64, seenArms uint64) {
	c.sk.unwatchIn()
	wait := pollGrace()
	for {
		t.Reset(wait)
		select {
		case <-t.C:
		case <-c.rxWake:
			t.Stop()
			return
		}
		polls := c.polls.Load()
		if polls == *seenPolls || c.arms.Load() != seenArms || c.rxStopped.Load() {
			return
		}
		*seenPolls = polls
		wait = max(pollGrace()-time.Duration(monotime()-int64(c.polledAt.Load())), pollGrace()/4)
	}
}

// parkOnCQ parks the receive goroutine on a CQ of the QP whose pollers
// read its socket from the CQ's ready set, if they have polled since
// the goroutine's last look (seen), until they stop (cq.park); it
// reports whether it parked.
func (c *conn) parkOnCQ(seen *[2]uint64) bool {
	for i, q := range c.q.cqs() {
		if q != nil && q.ready.watching.Load() && q.park(c, &seen[i]) {
			return true
		}
	}
	return false
}

// kickRx makes the receive goroutine run a round, for a poller that
// found the stream ended.
func (c *conn) kickRx() {
	c.sk.kick()
	c.wakeRx()
}

// rxUnlockUnread releases rxMu for a holder that did not receive: a
// poller or a CQ's receiver that found rxMu held meanwhile (rxMissed)
// left what had arrived to the holder, and the receive goroutine, which
// may be parked, is kicked to read it.
func (c *conn) rxUnlockUnread() {
	c.rxMu.Unlock()
	if c.rxMissed.Load() {
		c.kickRx()
	}
}

// wakeRx ends the receive goroutine's stay off the socket (pollGrace),
// for an application about to sleep on a CQ.
func (c *conn) wakeRx() {
	select {
	case c.rxWake <- struct{}{}:
	default:
	}
}

// receiver is who runs a round of receiving (rxTry).
type receiver int

const (
	byGoroutine receiver = iota // the connection's receive goroutine
	byPoller                    // an application polling a CQ of the QP
	byCQ                        // the receive CQ's receiver (ready.go)
)

// rxTry receives what has arrived. A poller, or a CQ's receiver, does
// not wait for someone else who is receiving: that one is told to look
// again before it stops, so that nothing that arrived is left unread. It
// returns the error that ended receiving, or, to the receive goroutine,
// errBudget when a round used up its budget.
//
// The responses the round queued go out at once, except the answers to
// zero-length Reads (the confirmations a peer asks for behind its Sends
// and Writes) when a poller received them, or when the receive
// goroutine's round, or the CQ receiver's, woke the application (a
// completion of the QP fired an armed CQ's notification): an application
// that polls, or has just been woken, usually posts soon, and its next
// batch carries them at no extra system call; pollRx and a timer send
// them anyway once lazyAge has passed, and so does an application that
// goes to sleep on a CQ (ReqNotify).
func (c *conn) rxTry(by receiver) error {
	poller := by != byGoroutine
	for {
		if !poller {
			// The receive goroutine waits for a poller's round to end:
			// were it to give up, it would find the socket that round is
			// about to read still readable and go round again at once,
			// spinning on it (50,000 times in a 20,000-message tcp0
			// send_lat) while the poller's thread waits for a processor.
			c.rxMu.Lock()
			c.rxRounds.Add(1)
		} else if !c.rxMu.TryLock() {
			c.rxMissed.Store(true)
			if !c.rxMu.TryLock() {
				return nil
			}
		}
		if c.rxMissed.Load() {
			// Only then: a store is a locked instruction.
			c.rxMissed.Store(false)
		}
		if c.rxStopped.Load() {
			c.rxMu.Unlock()
			return nil
		}
		budget := rxBudget
		if poller {
			budget = pollBudget
		}
		wakes := c.q.wakes.Load()
		err := c.rxDrain(budget)
		owe, lazy := c.rx.owe, c.rx.lazy
		c.rx.owe, c.rx.lazy = false, false
		// Whether the receive goroutine's round (or the CQ
		// receiver's) woke the application with a completion of this
		// QP (and the stream goes on, so that the application can
		// still post). Writing the answers itself cost a one-process
		// Send/Recv ping-pong in CQ.Wait an extra writev per message
		// and 15-20% of its latency.
		answers := by != byPoller
		woke := answers && err == nil && c.q.wakes.Load() != wakes
		c.rxMu.Unlock()
		switch {
		case owe || (lazy && answers && !woke):
			c.transmit()
		case lazy:
			if c.lazyAt.CompareAndSwap(0, monotime()) {
				// The backstop, for an application that stops polling
				// and neither posts nor sleeps on a CQ.
				c.lazyTimer.Reset(lazyAge)
			}
		}
		if err == errBudget {
			// More may be waiting. The receive goroutine goes round
			// again itself (rxRun), after letting rxMu go; a poller
			// leaves it to the receive goroutine, whether or not the
			// application polls again.
			if poller {
				c.kickRx()
				return nil
			}
			return errBudget
		}
		if err != nil {
			return err
		}
		if !c.rxMissed.Load() || (!poller && c.pollerGoesOn()) {
			return nil
		}
	}
}

// pollerGoesOn reports whether an application polls again within
// pollerWait, for the receive goroutine, which a poller's failed TryLock
// told to look again (rxMissed) once its round was over: a poll that
// begins after that round reads the socket itself, so the goroutine need
// not. Without this, an application that polls without pause could keep
// the goroutine going round after round, each telling it to look again,
// on a processor the application's peer may need.
func (c *conn) pollerGoesOn() bool {
	polls := c.polls.Load()
	for deadline := monotime() + int64(pollerWait); c.polls.Load() == polls; {
		if monotime() > deadline {
			return false
		}
	}
	return true
}

// pollerWait is how long the receive goroutine waits for an application
// to poll again before it looks at the socket itself (pollerGoesOn):
// a polling loop comes round in a few microseconds.
const pollerWait = 20 * time.Microsecond

// lazyAge bounds how long a poller (or a receive round that woke the
// application) leaves the answers to zero-length Reads for the
// application's next post to carry: the next poll after it sends them,
// and so does a timer (which may fire later, as the runtime's timers do
// when a process is idle: about 1 ms).
const lazyAge = 20 * time.Microsecond

// epoch is the origin of monotime.
var epoch = time.Now()

// monotime is a monotonic clock in nanoseconds, never 0.
func monotime() int64 { return int64(time.Since(epoch)) + 1 }

// pollRx is a round of receiving for an application goroutine polling a
// CQ of the QP: it reads what has arrived and never waits.
func (c *conn) pollRx() { c.pollRound(byPoller) }

// receiveFor is pollRx for the QP's receive CQ's receiver, whose round
// sends the answers to zero-length Reads at once, as the receive
// goroutine's does (rxTry).
//
// The receiver, asleep in ppoll, is woken as soon as a connection
// receives, and often reads it before the runtime's poller gets to the
// receive goroutine that waits for the same socket (waitIn), which then
// finds nothing to report and leaves the goroutine waiting, registered,
// where every FPDU the socket receives runs the kernel's callbacks of
// two more epoll instances. The receiver kicks such a goroutine, which
// runs a round and parks on the CQ (park), once.
func (c *conn) receiveFor() {
	c.pollRound(byCQ)
	if c.onSocket.Load() {
		c.sk.kick()
	}
}

// pollRound is a round of receiving by a poller or a CQ's receiver.
func (c *conn) pollRound(by receiver) {
	// A load and a release store, not a locked addition: two pollers at
	// once may count one round, and the receive goroutine still sees
	// the count move (rxRun).
	polls := c.polls.Load() + 1
	atomicrel.StoreUint64(&c.polls, polls)
	if err := c.rxTry(by); err != nil && !c.rxEnded.Load() {
		c.kickRx()
	}
	if at := c.lazyAt.Load(); at != 0 && monotime()-at > int64(lazyAge) {
		c.transmit()
	}
	// The clock is read every clockEvery polls only (it costs about
	// 44 ns, a tenth of a poll): for the receive goroutine, which stays
	// off the socket until pollGrace has passed since then (stayOff),
	// and for unsignaled WRs that have waited confirmDelay, whose
	// confirmation the next transmit round then asks for. An
	// application that polls usually posts soon, and its batch carries
	// the request at no extra system call; if it does not, the timer
	// sends it (confirmBackstop).
	if polls%clockEvery == 0 {
		now := monotime()
		atomicrel.StoreUint64(&c.polledAt, uint64(now)) // a release store, not a locked instruction
		if since := c.confirmSince.Load(); since != 0 && now-since > int64(confirmDelay) && c.confirmSince.CompareAndSwap(since, 0) {
			c.confirmDue.Store(true)
		}
	}
}

// clockEvery is how many polls pass between pollRx's looks at the clock.
const clockEvery = 16

// flushLazy sends the answers to zero-length Reads left for the
// application's next post (rxTry), and the WRs left in the send queue
// (coalesce.go), for an application about to sleep, or as the lazy
// timer's backstop.
func (c *conn) flushLazy() {
	if c.lazyAt.Load() != 0 || c.postsLeft.Load() {
		c.transmit()
	}
}

// pollBudget bounds the FPDUs one poll receives, so that a peer that
// keeps sending cannot hold an application's Poll: the receive goroutine
// is kicked to take over what is left (kickRx).
const pollBudget = 64

// rxBudget bounds the FPDUs one round of the receive goroutine receives
// while holding rxMu: a peer that keeps the socket full must not keep
// the lock, which a disconnect (connHandle.Close) and a Dereg that cuts a
// Read Response (revokeRead) take to stop receiving.
const rxBudget = 1024

// errBudget ends a round that used up its budget.
var errBudget = errors.New("receive budget used up")

// rxDrain receives until nothing more has arrived (nil), receiving ends
// (the error, kept for every later call), or, for a poller, budget FPDUs
// are done (errBudget). rxMu is held.
func (c *conn) rxDrain(budget int) error {
	rx := &c.rx
	if rx.err != nil {
		return rx.err
	}
	rx.drained = false
	start := c.rxFrames.Load()
	for {
		if budget > 0 && c.rxFrames.Load()-start >= uint64(budget) {
			return errBudget
		}
		if c.aborted.Load() {
			rx.err = net.ErrClosed
			return rx.err
		}
		var err error
		if rx.planned {
			var done bool
			if done, err = c.rxRead(); err == nil && !done {
				return nil
			}
			if err == nil {
				rx.planned = false
				err = c.rxComplete()
			}
		} else {
			var idle bool
			if idle, err = c.rxNext(); err == nil && idle {
				return nil
			}
		}
		if err != nil {
			rx.err = err
			return err
		}
	}
}
