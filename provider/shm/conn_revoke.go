package shm

import (
	"time"

	"github.com/goverbs/goverbs/verbs/driver"
)

// Revocations: a side that revokes a key, or ends the connection, has
// the peer confirm that none of its WRs still uses what was revoked.

// awaitRevokeAnswer answers the peer's msgRevoke once no WR of this
// side's is under way: at once if the QP's lock is free, else as soon as
// the WR that holds it is done (the requester answers then, between two
// WRs: answerRevoke). A WR checks a key's version once, before its copy,
// so the WRs after that point see the key revoked.
func (c *conn) awaitRevokeAnswer() {
	q := c.q
	var tick *time.Ticker
	for c.revokeWant.Load() != 0 {
		if q.mu.TryLock() {
			c.answerRevoke()
			q.mu.Unlock()
			break
		}
		if tick == nil {
			tick = time.NewTicker(50 * time.Microsecond)
			defer tick.Stop()
		}
		select {
		case <-c.gone:
			return
		case <-tick.C:
		}
	}
}

// answerRevoke answers a msgRevoke waiting for it. q.mu is held, and no
// WR is under way.
func (c *conn) answerRevoke() {
	c.clearHold(holdRevoke)
	if seq := c.revokeWant.Swap(0); seq != 0 {
		c.forgetKeys()
		c.sendCtrl(msgRevoked, seq, 0)
	}
}

// revokeTimeout bounds how long Dereg waits for a peer to confirm that no
// WR of its uses the region any more; a peer that does not is taken for
// dead (its connection ends).
const revokeTimeout = segWait + time.Second

// revokePeer asks the peer to confirm that none of its WRs still uses a
// key this side revoked, and waits for the answer, the connection's end,
// or revokeTimeout (which ends the connection). No lock is held: the
// peer's answer may wait for a WR of its that waits for this process.
func (c *conn) revokePeer() {
	c.revokeMu.Lock()
	defer c.revokeMu.Unlock()
	if c.ended.Load() {
		return
	}
	c.revokeSeq++
	seq := c.revokeSeq
	c.sendCtrl(msgRevoke, seq, 0)
	t := time.NewTimer(revokeTimeout)
	defer t.Stop()
	for {
		select {
		case got := <-c.revokeAck:
			if got == seq {
				return
			}
		case <-c.gone:
			return
		case <-c.done:
			return
		case <-t.C:
			c.sock.Close()
			return
		}
	}
}

// lastWQE raises EventQPLastWQEReached for the QP, on an SRQ, that has
// moved to the error state, once the peer has confirmed that none of its
// WRs is under way (revokePeer): a Send that took a receive of the SRQ
// before the state was published goes on placing into it until then. A
// connection that never started, or is closing, raises it at once. One
// that the QP has left meanwhile (Reset, Destroy) raises nothing. q.mu is
// held.
func (c *conn) lastWQE() {
	c.fenceMu.Lock()
	defer c.fenceMu.Unlock()
	q := c.q
	if !c.started.Load() || c.fenceClosed {
		q.ctx.Event(driver.EventQPLastWQEReached, q.userCtx)
		return
	}
	resets := q.resets
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.revokePeer()
		q.mu.Lock()
		if !q.destroyed && q.attr.State == driver.QPSErr && q.resets == resets {
			q.ctx.Event(driver.EventQPLastWQEReached, q.userCtx)
		}
		q.mu.Unlock()
	}()
}
