package iwarp

import (
	"time"

	"golang.org/x/sys/unix"
)

// Liveness: the QP's Timeout and RetryCnt become the socket's
// TCP_USER_TIMEOUT (setUserTimeout), and a timer checks, while requests
// are outstanding, that the peer answers them (checkResponses).

// armResponseCheck starts the check that the peer answers the
// requests outstanding (Reads, atomics, and the zero-length Reads that
// confirm Sends and Writes). q.mu is held.
func (c *conn) armResponseCheck() {
	if c.ackTimeout > 0 && !c.respArmed && c.q.req.orqLen() > 0 {
		c.respArmed = true
		c.respFrames, c.respAnswers, c.respStalls = c.rxFrames.Load(), c.rxAnswers.Load(), 0
		c.respTimer.Reset(c.ackTimeout)
	}
}

// A peer that sends other traffic but no answer is taken for timed out
// once answerStalls checks since its last answer (each a QP timeout
// apart; those that found bytes in the socket do not count) have found
// no answer, and more than answerSlack bytes have come since the first:
// more than a healthy peer can have queued ahead of its answer (its
// socket's send buffer, 4 MiB by Linux's default, and its transmitter's
// batch, 2 MiB for goverbs), so that a slow path only delays.
const (
	answerStalls = 4
	answerSlack  = 32 << 20
)

// checkResponses is the response timer, every timeout while requests
// are outstanding. The oldest request has reached the peer once a check
// finds nothing of the connection's in flight (settled: the request has
// been taken by the peer's TCP, and no answer waits to be read), at the
// peer's last acknowledgement; it is due a timeout after that: a slow
// peer's TCP takes the last of a large message, and the request behind
// it, well before its application has read them. A due request with
// nothing at all come from the peer since the check before (its TCP may
// still acknowledge, as a stopped process's does), or without a Read or
// Atomic Response for answerStalls such checks while more than
// answerSlack bytes came (a peer that keeps sending but answers
// nothing), has timed out: the connection ends, and the WR that waited
// completes with WCRetryExcErr (finish). A request thus times out a
// timeout or a little more after it reached the peer, if nothing comes
// meanwhile, or some five timeouts of traffic without answers.
func (c *conn) checkResponses() {
	q := c.q
	q.mu.Lock()
	if q.c != c || c.aborted.Load() || c.ackTimeout == 0 || q.req.orqLen() == 0 {
		c.respArmed = false
		q.mu.Unlock()
		return
	}
	r := &q.req
	now, oldest := monotime(), r.orq[r.orqHead%maxRdAtomic].sent
	frames, answers, bytes := c.rxFrames.Load(), c.rxAnswers.Load(), c.rxBytes.Load()
	quiet, lastAck := c.settled(now)
	reachedNow := quiet && c.reachedAt < oldest
	if reachedNow {
		// The first check since the oldest request was sent to find
		// nothing in flight: the request reached the peer by the last
		// acknowledgement, and not before it was sent.
		c.reachedAt = max(oldest, lastAck)
	}
	wait := c.ackTimeout - time.Duration(now-c.reachedAt)
	due := quiet && c.reachedAt >= oldest && wait <= 0
	switch {
	case answers != c.respAnswers:
		c.respStalls = 0
	case due:
		if c.respStalls == 0 {
			c.stallBytes = bytes
		}
		c.respStalls++
	}
	slack := uint64(answerSlack)
	if c.peerMid.Load() {
		// A peer in the middle of a message answers after its end
		// (messages go out whole, each before the next): it may
		// send up to a whole message first.
		slack += uint64(deviceAttr.MaxMsgSize)
	}
	talkedPast := c.respStalls >= answerStalls && bytes-c.stallBytes > slack
	if due && (frames == c.respFrames || talkedPast) {
		c.timedOut.Store(true)
		q.mu.Unlock()
		c.abort()
		return
	}
	c.respAnswers = answers
	if reachedNow && wait > 0 {
		// The next check comes when the request is due, and the
		// peer's silence is counted from the check before this one:
		// the request reached the peer after it, or is due now.
		c.respTimer.Reset(wait)
		q.mu.Unlock()
		return
	}
	// Silence must last a whole period: the peer's frames are counted
	// from one check to the next.
	c.respFrames = frames
	c.respTimer.Reset(c.ackTimeout)
	q.mu.Unlock()
}

// settled reports whether nothing of the connection's is in flight:
// no batch being built or written, nothing in the socket either way,
// sent and not yet acknowledged, or not sent (the request may not have
// reached the peer yet, behind a large message on a slow path; a peer
// that stops taking them is TCP_USER_TIMEOUT's to end), or received and
// not yet read (the answer may be there, this side slow to read it).
// lastAck is, when quiet, the time (monotime, as of now) of the peer's
// last acknowledgement: its TCP had taken all that was sent by then.
// q.mu is held.
func (c *conn) settled(now int64) (quiet bool, lastAck int64) {
	if !c.txMu.TryLock() {
		return false, 0 // the transmitter is at work
	}
	pending := c.txLeft()
	c.txMu.Unlock()
	if pending {
		return false, 0 // some of a batch is left for the socket to take
	}
	c.sk.control(func(fd int) {
		out, err1 := unix.IoctlGetInt(fd, unix.SIOCOUTQ)
		in, err2 := unix.IoctlGetInt(fd, unix.SIOCINQ)
		info, err3 := unix.GetsockoptTCPInfo(fd, unix.IPPROTO_TCP, unix.TCP_INFO)
		if out == 0 && in == 0 && err1 == nil && err2 == nil && err3 == nil {
			quiet, lastAck = true, now-int64(time.Duration(info.Last_ack_recv)*time.Millisecond)
		}
	})
	return quiet, lastAck
}

// minUserTimeout is the least time tcp0 lets the peer leave data
// unacknowledged, or its window closed, before the connection times out:
// TCP's own retransmissions over a lossy path need that long, which is
// more than a QP's Timeout and RetryCnt allow by default (14 and 7:
// 0.55 s).
var minUserTimeout = 4 * time.Second

// userTimeout is the TCP_USER_TIMEOUT of a QP whose local ACK timeout is
// timeout (encoded: 4.096 µs × 2^timeout; 0 is infinite) and whose
// transport retry count is retries: the time IB gives a request before
// it completes with WCRetryExcErr, 4.096 µs × 2^timeout × (retries+1),
// and at least minUserTimeout; 0 for no timeout.
func userTimeout(timeout, retries uint8) time.Duration {
	if timeout == 0 {
		return 0
	}
	d := 4096 * time.Nanosecond << min(timeout, 31) * time.Duration(int(min(retries, 7))+1)
	return max(d, minUserTimeout)
}

// setUserTimeout makes the kernel end the connection when data sent
// stays unacknowledged, or the peer's window closed (a peer that stops
// reading but answers the probes), for d: the stream then fails with
// ETIMEDOUT, and the WR waiting on the peer with WCRetryExcErr. 0: never.
// A request the peer's TCP takes but that nothing answers for d (the
// peer's process is stopped) ends the connection the same way
// (checkResponses). q.mu is held.
func (c *conn) setUserTimeout(d time.Duration) {
	c.ackTimeout = d
	c.sk.control(func(fd int) {
		unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds()))
	})
}
