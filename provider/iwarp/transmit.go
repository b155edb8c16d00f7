package iwarp

import (
	"net"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/provider/iwarp/wire"
)

// The transmitter: whoever holds txMu builds a batch of frames under q.mu
// (the RTR, the responses owed, the send queue's WRs, a Terminate) and
// writes it with one writev without q.mu: the transmit goroutine, which
// may wait for room, or, without ever waiting, a goroutine that posts or
// that received requests to answer.

// txLoop is the transmitter.
func (c *conn) txLoop() {
	defer c.wg.Done()
	defer c.running.Add(-1)
	defer close(c.txDone)
	for range c.wake {
		c.txMu.Lock()
		for {
			more, stop := c.txRound(false)
			if stop {
				c.txStopped = true
				c.unpin()
				c.lendBack()
				c.txMu.Unlock()
				return
			}
			if !more {
				break
			}
		}
		c.lendBack()
		c.txMu.Unlock()
	}
}

// transmit does a transmit round in the calling goroutine (one posting
// WRs, or one that received requests to answer), when the transmitter
// is not in one, to spare a goroutine switch on the way to the socket.
// The round never blocks: what the socket does not take at once, and
// anything when the transmitter is busy, is left to the transmit
// goroutine. q.mu must not be held.
func (c *conn) transmit() {
	if !c.txMu.TryLock() {
		c.wakeTx()
		return
	}
	c.transmitHeld()
}

// transmitHeld is transmit for a caller that holds c.txMu, which it
// releases.
func (c *conn) transmitHeld() {
	more, stop := false, c.txStopped
	if !stop {
		more, stop = c.txRound(true)
	}
	c.endTransmit(more, stop)
}

// batch returns the batch c's transmitter builds into, borrowing one if
// c holds none. c.txMu is held.
func (c *conn) batch() *txBatch {
	if c.tb == nil {
		c.tb = borrowBatch()
	}
	return c.tb
}

// txLeft reports whether some of c's batch is left for the socket to
// take. c.txMu is held.
func (c *conn) txLeft() bool { return c.tb != nil && len(c.tb.bufs) > 0 }

// lendBack returns c's batch once nothing of it is left to write and no
// region is pinned for it, or once the transmitter has stopped. c.txMu
// is held.
func (c *conn) lendBack() {
	if b := c.tb; b != nil && (c.txStopped || len(b.bufs) == 0 && !c.pinned) {
		c.tb = nil
		returnBatch(b)
	}
}

// endTransmit ends a non-blocking round: the transmitter is done (stop)
// or has more to do (more), which the transmit goroutine takes up.
// c.txMu is held, and released.
func (c *conn) endTransmit(more, stop bool) {
	if stop && !c.txStopped {
		c.txStopped = true
		c.unpin()
	}
	c.lendBack()
	c.txMu.Unlock()
	if more || stop {
		c.wakeTx()
	}
}

// txRound writes what a non-blocking round left, then builds one batch
// under q.mu and writes it without. nb: the round must not block, and
// leaves to the transmit goroutine what it cannot write at once and the
// end of the stream. It reports whether to go round again at once, and
// whether the transmitter is done (after a Terminate, a write error or
// an abort). c.txMu is held.
func (c *conn) txRound(nb bool) (more, stop bool) {
	if c.txStopped {
		return false, true
	}
	q := c.q
	if c.txLeft() {
		b := c.tb
		left, err := c.writeBatch(b, nb)
		if err != nil {
			c.streamBroken(err)
			return false, true
		}
		if left {
			return true, false
		}
		if c.finishPending {
			c.sk.closeWrite()
			return false, true
		}
	}
	if c.pinned {
		c.unpin() // the batch is written
	}
	b := c.batch()
	b.reset()
	q.mu.Lock()
	if c.aborted.Load() || q.c != c {
		q.mu.Unlock()
		return false, true
	}
	if !c.gate.Load() || (nb && (c.term || c.closing)) {
		q.mu.Unlock()
		return nb, false
	}
	if c.rtrOut != 0 {
		// The RTR of peer-to-peer mode goes first (RFC 6581): a
		// zero-length RDMA Write, whose Tagged Offset tells a goverbs
		// peer this QP's number.
		to := uint64(0)
		if c.ext {
			to = wire.RTRQPNTag | uint64(q.num)
		}
		wire.Hdr(b.header(wire.TaggedLen)).SetTagged(wire.OpWrite, true, 1, to, 0)
		b.endFrame(nil, 0, 0)
		c.rtrOut = 0
	}
	if c.kickNow {
		wire.Hdr(b.header(wire.TaggedLen)).SetTagged(wire.OpWrite, true, 1, 0, 0)
		b.endFrame(nil, 0, 0)
		c.kickNow = false
	}
	// DDP sends the messages of a stream in order, each whole before
	// the next (RFC 5041 5.3; siw ends a stream that interleaves two
	// tagged ones): a requester's message begun in an earlier batch is
	// finished before the responses owed go out, and a Read Response
	// begun before is finished before the requester starts another.
	// (In SQD the requester finishes the message under way and starts
	// no other: see State.)
	if !q.req.cur.active {
		c.addResponses(b)
	}
	midResponse := c.irqHead != c.irqTail && c.irq[c.irqHead%uint64(len(c.irq))].off > 0
	yielded := false
	if c.irqHead == c.irqTail && c.lazyAt.Load() != 0 {
		// The timer stays armed: a poller may have armed it for an
		// answer queued after this round took the queue, and a timer
		// that finds nothing to send costs one empty round.
		c.lazyAt.Store(0)
	}
	finish := false
	if c.term && c.irqHead == c.irqTail && b.room(c.termLen, 0) {
		copy(b.header(c.termLen), c.termBuf[:c.termLen])
		b.endFrame(nil, 0, 0)
		finish = true
	} else if c.closing && !c.term {
		// A disconnect: the responses queued go out, then the FIN.
		finish = c.irqHead == c.irqTail
	} else if !c.term && q.drainingSQ() && !midResponse {
		if c.postsLeft.Load() {
			c.postsLeft.Store(false) // this round and those it leaves more to take them
		}
		q.sq.Progress(q)
		if q.responsesOwed() {
			// Progress stopped between two messages for the responses
			// owed (Stalled): they go out now, and the round after this
			// one takes the requester up again.
			c.addResponses(b)
			yielded = true
		}
		if q.req.failing {
			// A WR failed locally: the QP fails and the stream ends
			// without this batch.
			q.afterProgress()
			q.mu.Unlock()
			return false, true
		}
		c.executed(b)
	}
	more = b.full || yielded
	closing := c.closing
	q.mu.Unlock()
	if b.nframes > 0 {
		if finish && !closing {
			c.wdeadline = time.Now().Add(terminateTimeout)
		}
		left, stop := c.sendBatch(b, nb)
		if stop {
			return false, true
		}
		if left {
			c.finishPending = finish
			return true, false
		}
	}
	if finish {
		c.sk.closeWrite()
		return false, true
	}
	return more, false
}

// sendBatch writes the batch built in b: all of it, or with nb as much
// as the socket takes at once (left: the rest is in b.bufs); stop: the
// stream broke. c.txMu is held, q.mu is not.
func (c *conn) sendBatch(b *txBatch, nb bool) (left, stop bool) {
	if c.crc {
		b.computeCRCs()
	}
	if raceEnabled {
		c.sk.control(raceRelease)
	}
	b.bufs = b.iov[:b.niov]
	left, err := c.writeBatch(b, nb)
	if err != nil {
		c.streamBroken(err)
		return false, true
	}
	if !left && c.pinned {
		c.unpin() // the batch is written
	}
	return left, false
}

// writeBatch writes b.bufs: all of it, or with nb as much as the socket
// takes at once (left: some is left in b.bufs).
func (c *conn) writeBatch(b *txBatch, nb bool) (left bool, err error) {
	for {
		left, err = c.writeOnce(b)
		if nb || !left || err != nil {
			return left, err
		}
		// The socket is full: wait for room.
		if err := c.sk.waitOut(c.wdeadline); err != nil {
			return false, err
		}
	}
}

// writeOnce is one writev of b.bufs that does not wait.
func (c *conn) writeOnce(b *txBatch) (left bool, err error) {
	if !c.sk.enter() {
		return false, net.ErrClosed
	}
	n, e := nbWrite(b, uintptr(c.sk.fd))
	c.sk.exit()
	switch e {
	case 0, unix.EAGAIN, unix.EINTR:
	default:
		c.noteErr(e)
		return false, e
	}
	b.consume(n)
	return len(b.bufs) > 0, nil
}

// nbWrite is one writev of b.bufs that does not wait for the socket.
func nbWrite(b *txBatch, fd uintptr) (int, unix.Errno) {
	n := min(len(b.bufs), len(b.wiov))
	k := 0
	for _, s := range b.bufs[:n] {
		if len(s) == 0 {
			continue
		}
		b.wiov[k].Base = &s[0]
		b.wiov[k].SetLen(len(s))
		k++
	}
	if k == 0 {
		return 0, 0
	}
	r, e := sockIO(unix.SYS_WRITEV, fd, b.wiov[:k])
	clear(b.wiov[:k])
	if e != 0 {
		return 0, e
	}
	return int(r), 0
}

// rawIOMax is the most bytes sockIO moves with a raw system call.
const rawIOMax = 64 << 10

// sockIO is one readv or writev (trap) of iov on the non-blocking socket
// fd. Up to rawIOMax bytes it is a raw system call, which the runtime is
// not told of: on the non-blocking socket it cannot block, and entering
// and leaving a system call the runtime's way costs more than a small
// call's own overhead (BenchmarkSendRecvLatency64Poll shows it, both
// ends in one process). Larger calls,
// whose copies take long enough for the runtime to want the processor
// back (for another goroutine, or to stop the world), tell it.
//
// It is a variable so that a benchmark can move the bytes in memory
// instead (SocketsInMemory, in the tests), to measure goverbs' own work
// per message without the kernel's.
var sockIO = rawSockIO

// rawSockIO is sockIO on the socket itself.
func rawSockIO(trap, fd uintptr, iov []unix.Iovec) (uintptr, syscall.Errno) {
	n := uint64(0)
	for i := range iov {
		n += uint64(iov[i].Len)
	}
	p, k := uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov))
	if len(iov) == 1 {
		// One buffer: read(2) or write(2), which the kernel takes
		// without an iovec to import (that import and readv's and
		// writev's own layers are a visible part of a small message's
		// kernel time in perf of BenchmarkSendRecvPath64).
		p, k = uintptr(unsafe.Pointer(iov[0].Base)), uintptr(iov[0].Len)
		trap = singleTrap(trap)
	}
	if n <= rawIOMax {
		r, _, e := unix.RawSyscall(trap, fd, p, k)
		return r, e
	}
	r, _, e := unix.Syscall(trap, fd, p, k)
	return r, e
}

// singleTrap is the one-buffer system call of the vectored one trap.
func singleTrap(trap uintptr) uintptr {
	if trap == unix.SYS_WRITEV {
		return unix.SYS_WRITE
	}
	return unix.SYS_READ
}

// raceRelease gives the race detector the happens-before edge a socket
// write carries to the reads of the data it wrote: the runtime annotates
// write(2) and read(2) for the race detector but not writev(2), so with
// both ends in one process the detector would otherwise not see that a
// receiver's completion follows what the sender's goroutines did. A
// write of nothing to the socket, just before the writev, is a
// write(2) of nothing.
func raceRelease(fd int) { syscall.Write(fd, nil) }
