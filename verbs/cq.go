package verbs

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/goverbs/goverbs/verbs/driver"
)

// CQ is a completion queue.
type CQ struct {
	ctx       *Context
	d         driver.CQ
	sleeper   driver.Sleeper // d, if it can put the caller to sleep itself
	users     users
	destroyed atomic.Bool
	done      chan struct{} // closed by Destroy, for the goroutines in Wait
	waiters   atomic.Int32  // goroutines in Wait's Notify path
	pass      chan struct{} // a woken waiter wakes another (notifyWait)
	cqe       int
}

// CQE returns how many completions the CQ holds before it overruns: at
// least as many as CreateCQ asked for, more where the device rounds the
// size up (struct ibv_cq's cqe).
func (c *CQ) CQE() int { return c.cqe }

// Context returns the device context the CQ belongs to.
func (c *CQ) Context() *Context { return c.ctx }

// Poll moves up to len(wc) completions into wc and returns how many
// (ibv_poll_cq). It never blocks and never allocates. If the CQ overran,
// Poll still returns the completions it holds and Err reports the overrun.
// Poll of an empty wc takes no completion, but a provider that moves data
// in software (tcp0) still makes progress in it: a goroutine that waits
// on memory for a peer's RDMA Write polls so now and then, as UCX's
// applications call ucp_worker_progress.
func (c *CQ) Poll(wc []WorkCompletion) int { return c.d.Poll(wc) }

// Err returns ErrCQOverrun once the CQ has overrun: completions were lost
// and the QPs that lost them moved to the error state.
func (c *CQ) Err() error { return c.d.Err() }

// ReqNotify arms the completion channel (ibv_req_notify_cq): the next
// completion — with solicitedOnly, the next solicited or unsuccessful one —
// sends a token on Notify. Arm, then poll once more before waiting, so that
// a completion that arrived before arming is not missed.
func (c *CQ) ReqNotify(solicitedOnly bool) error { return c.d.ReqNotify(solicitedOnly) }

// Notify is the CQ's completion channel (ibv_get_cq_event): it receives a
// token when an armed CQ gets a completion. The channel holds one token.
func (c *CQ) Notify() <-chan struct{} { return c.d.Notify() }

// Wait blocks until at least one completion is available, then moves up to
// len(wc) of them into wc and returns how many. It sleeps while it waits
// (no busy polling) and returns early with ctx's error, or with
// ErrCQOverrun if the CQ overran. Wait uses ReqNotify and Notify itself, so
// do not mix it with your own use of them on the same CQ.
func (c *CQ) Wait(ctx context.Context, wc []WorkCompletion) (int, error) {
	if len(wc) == 0 {
		return 0, fmt.Errorf("verbs: CQ wait: %w: empty completion slice", ErrInvalidArg)
	}
	if s := c.sleeper; s != nil {
		if n, err := c.sleep(ctx, s, wc); n > 0 || err != nil {
			return n, err
		}
	}
	return c.notifyWait(ctx, wc)
}

// notifyWait is Wait through ReqNotify and the Notify channel.
//
// A notification disarms the CQ and sends one token: when goroutines
// wait together, the one the token wakes arms the CQ again before it
// returns, so that the next completion wakes another; and it wakes
// another itself (pass), since completions that came between the
// notification and that arming fired nothing, and one taking fewer
// completions than the CQ holds leaves them to the others.
func (c *CQ) notifyWait(ctx context.Context, wc []WorkCompletion) (n int, err error) {
	c.waiters.Add(1)
	woken := false
	defer func() {
		if c.waiters.Add(-1) > 0 && woken {
			c.d.ReqNotify(false)
			select {
			case c.pass <- struct{}{}:
			default:
			}
		}
	}()
	for {
		if n := c.d.Poll(wc); n > 0 {
			return n, nil
		}
		if err := c.d.Err(); err != nil {
			return 0, err
		}
		if err := c.d.ReqNotify(false); err != nil {
			return 0, err
		}
		if n := c.d.Poll(wc); n > 0 {
			return n, nil
		}
		select {
		case <-c.d.Notify():
			woken = true
		case <-c.pass:
			woken = true
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-c.done:
			return 0, fmt.Errorf("verbs: CQ wait: %w: the CQ was destroyed", ErrClosed)
		case <-c.ctx.closed:
			return 0, fmt.Errorf("verbs: CQ wait: %w: the device context was closed", ErrClosed)
		}
	}
}

// sleepFor is how long Wait sleeps in the calling thread, on a CQ that
// can (driver.Sleeper), before it waits through the Notify channel
// instead. A thread the CQ wakes itself runs the waiting goroutine at
// once, where the channel's hand-off from the CQ's waiter costs another
// thread's wake-up (microseconds, tens of them on a busy machine); but the
// sleeping thread cannot see ctx end, so its sleep is short: Wait sees
// ctx end within sleepFor, and an idle Wait wakes once. (Like any
// blocking system call, the sleep holds an OS thread: goroutines that
// start waiting together hold one each, for up to sleepFor.)
const sleepFor = time.Millisecond

// sleep is the first part of Wait on a CQ that puts the calling thread to
// sleep itself: it returns 0 and no error once sleepFor has passed.
func (c *CQ) sleep(ctx context.Context, s driver.Sleeper, wc []WorkCompletion) (int, error) {
	done := ctx.Done()
	end := time.Now().Add(sleepFor)
	for {
		if n := c.d.Poll(wc); n > 0 {
			return n, nil
		}
		if err := c.d.Err(); err != nil {
			return 0, err
		}
		if done != nil {
			if err := ctx.Err(); err != nil {
				return 0, err
			}
		}
		ticket, err := s.Arm()
		if err != nil {
			return 0, err
		}
		if n := c.d.Poll(wc); n > 0 {
			return n, nil
		}
		d := time.Until(end)
		if d <= 0 {
			return 0, nil
		}
		if dl, ok := ctx.Deadline(); ok {
			left := time.Until(dl)
			if left <= 0 {
				// Past the deadline, before ctx's own timer says so.
				return 0, context.DeadlineExceeded
			}
			d = min(d, left)
		}
		s.Sleep(ticket, d)
	}
}

// Destroy destroys the CQ (ibv_destroy_cq). It fails with ErrBusy while a
// QP uses it.
func (c *CQ) Destroy() error {
	c.ctx.life.RLock()
	defer c.ctx.life.RUnlock()
	if err := c.ctx.closedErr("destroy CQ"); err != nil {
		if !c.destroyed.Swap(true) {
			close(c.done)
		}
		return err
	}
	if err := c.users.check("CQ"); err != nil {
		return err
	}
	if c.destroyed.Swap(true) {
		return fmt.Errorf("verbs: destroy CQ: %w", ErrClosed)
	}
	close(c.done)
	return c.d.Destroy()
}

// Received returns the bytes that the receive completion wc says arrived
// in buf, the buffer its receive posted: buf[:wc.ByteLen]. It fails when
// the completion claims more than buf holds. A provider never reports
// that of a receive it completes itself, but on shm0 the peer writes the
// receive completions into the CQ's shared ring, and a hostile peer can
// write any byte count there: an application that faces untrusted peers
// slices its buffers with Received rather than by hand.
func Received(wc *WorkCompletion, buf []byte) ([]byte, error) {
	if uint64(wc.ByteLen) > uint64(len(buf)) {
		return nil, fmt.Errorf("verbs: the completion of receive %#x reports %d bytes, more than its %d-byte buffer holds: a peer wrote a false completion",
			wc.WRID, wc.ByteLen, len(buf))
	}
	return buf[:wc.ByteLen], nil
}
