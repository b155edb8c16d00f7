package iwarp

import (
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/provider/iwarp/wire"
	"github.com/goverbs/goverbs/verbs/driver"
)

// Revocation: a region deregistered or invalidated while the connection
// sends from it. A Read Response from it still owed ends the stream with
// a Terminate, and bytes of it in the batch being written are waited for
// (revokeRead); placement into a revoked region stops at once
// (dstRevoked, in placement.go).

// pin records that the batch being built sends bytes straight from m.
// c.txMu is held.
func (c *conn) pin(m *mr) {
	c.pinMu.Lock()
	if n := len(c.pins); n == 0 || c.pins[n-1] != m {
		c.pins = append(c.pins, m)
	}
	c.pinned = true
	c.pinMu.Unlock()
}

// unpin empties pins: the batch is written, or will not be. c.txMu is
// held.
func (c *conn) unpin() {
	c.pinMu.Lock()
	clear(c.pins)
	c.pins = c.pins[:0]
	c.pinned = false
	c.pinMu.Unlock()
}

// pinning reports whether the batch being written sends bytes of m.
func (c *conn) pinning(m *mr) bool {
	c.pinMu.Lock()
	defer c.pinMu.Unlock()
	for _, p := range c.pins {
		if p == m {
			return true
		}
	}
	return false
}

// holds reports whether a Read Response from m is queued, or its bytes
// in the batch being written.
func (c *conn) holds(m *mr) bool {
	q := c.q
	q.mu.Lock()
	_, owed := c.owed(m)
	owed = owed && q.c == c && !q.destroyed
	q.mu.Unlock()
	return owed || c.pinning(m)
}

// owed finds the first Read Response from m queued, wholly or in part
// unsent: its position in the queue, and whether there is one. q.mu is
// held.
func (c *conn) owed(m *mr) (uint64, bool) {
	for i := c.irqHead; i != c.irqTail; i++ {
		if c.irq[i%uint64(len(c.irq))].mr == m {
			return i, true
		}
	}
	return 0, false
}

// revokeRead keeps the bytes of m, which Dereg has revoked, from going
// out once Dereg returns, although the peer's Reads of it are under
// way. A response still owed ends the stream instead, with the
// Terminate a Read Request naming m would now get, and the QP fails
// (receiving stops first, as for a disconnect, since the move to the
// error state flushes the receives). Bytes of m in the batch being
// written are waited for; if the peer does not take them (or the
// Terminate) within terminateTimeout, the connection is dropped. q.mu
// must not be held.
func (c *conn) revokeRead(m *mr) {
	q := c.q
	// Under both locks, receiving stops and a response still owed is cut
	// (the transmitter may have built the rest of it since holds looked:
	// then nothing is cut, and the pins below cover it).
	c.rxMu.Lock()
	q.mu.Lock()
	i, owed := c.owed(m)
	if owed = owed && q.c == c && !q.destroyed; owed {
		c.rxStopped.Store(true)
		// The Terminate names the Read Request, so that the peer fails
		// that Read, not the WR before it.
		c.terminate(wire.LayerRDMAP, wire.RDMAPRemoteProtect, rdmapCode(accessBadSTag), wire.Hdr(c.irq[i%uint64(len(c.irq))].req[:]))
		for j := i; j != c.irqTail; j++ {
			c.irq[j%uint64(len(c.irq))] = irqEntry{}
		}
		c.irqTail = i
		// The transmitter may have stopped at the entry cut (its region
		// revoked) with a Terminate queued already, which terminate
		// then did not queue again nor wake it for: wake it now.
		c.wakeTx()
		if q.attr.State != driver.QPSErr {
			q.ctx.Event(driver.EventQPAccessErr, q.userCtx)
			q.toErr()
		}
	}
	q.mu.Unlock()
	c.rxUnlockUnread()
	deadline := time.Now().Add(terminateTimeout)
	for d := 10 * time.Microsecond; c.pinning(m); d = min(2*d, time.Millisecond) {
		if time.Now().After(deadline) {
			c.abort()
			return
		}
		time.Sleep(d)
	}
	if !owed {
		return
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-c.txDone:
		// The Terminate is out and the stream half closed, and nothing
		// of m goes out any more. What the peer sends meanwhile is read
		// and dropped until it closes (a goverbs peer does at once), or
		// for closeLinger, so that closing with it unread does not
		// reset the stream and lose the Terminate (as in
		// protocolError).
		c.drainUntil(time.Now().Add(closeLinger))
		c.abort()
	case <-c.done:
	case <-t.C:
		c.abort()
	}
}

// drainUntil reads and drops what the peer sends until it closes its
// side, or until deadline, once receiving has stopped (rxStopped), with
// reads that do not wait and naps between them: not through the socket's
// input watch, whose one waiter and deadline are the receive goroutine's.
func (c *conn) drainUntil(deadline time.Time) {
	c.rxMu.Lock()
	defer c.rxMu.Unlock()
	var drain [4096]byte
	for nap := 10 * time.Microsecond; time.Now().Before(deadline); {
		n, err := c.sk.read(drain[:])
		switch {
		case err == unix.EAGAIN || err == unix.EINTR:
			time.Sleep(nap)
			nap = min(2*nap, time.Millisecond)
		case err != nil || n == 0:
			return
		default:
			nap = 10 * time.Microsecond
		}
	}
}
