package iwarp

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/internal/peerguard"
	"github.com/goverbs/goverbs/provider/iwarp/wire"
	"github.com/goverbs/goverbs/verbs/driver"
)

// A connection is one TCP connection in full MPA operation, owned by one
// QP. Receiving (rxloop.go) is done by whoever holds rxMu: a goroutine
// that waits for the socket, or an application goroutine polling a CQ.
// Transmitting is done by whoever holds txMu: a goroutine that may block
// on a full socket, or, without ever blocking, a goroutine posting WRs or
// one that has just received requests to answer; what such a one cannot
// write at once is left to the transmit goroutine. Nobody holds q.mu
// across socket I/O, and nobody but the transmit goroutine waits on a
// socket write, so that neither side of a connection can wait on the
// other in a cycle.

// maxPayload is the most payload one FPDU carries: large FPDUs cost
// fewer system calls, and this one (with its headers, pad and CRC) still
// fits one IPv4 packet, so that captures decode one FPDU per segment.
var maxPayload = 64512

// terminateTimeout bounds how long a connection that found an error
// waits for its Terminate to go out and for the peer to close.
const terminateTimeout = 2 * time.Second

// closeLinger bounds how long a disconnect waits for the responses
// already queued (the Read Responses that complete the peer's last Sends
// and Writes) to go out before the socket closes.
const closeLinger = 200 * time.Millisecond

// debug turns on a line on stderr for each connection that ends, and
// why (environment variable GOVERBS_IWARP_DEBUG=1).
var debug = os.Getenv("GOVERBS_IWARP_DEBUG") != ""

func debugf(format string, args ...any) {
	if debug {
		fmt.Fprintf(os.Stderr, "iwarp: "+format+"\n", args...)
	}
}

// conn is a connection and the state its goroutines keep. What setup,
// timers and teardown use comes first; what every FPDU sent or received
// touches comes last, in a few cache lines next to the receiver's own
// (rx), so that a connection that has not run for a while (round-robin
// over many) costs few cache misses.
type conn struct {
	nc     *net.TCPConn
	remote driver.ConnParam
	// guard, of the listener that accepted the connection (nil for a
	// dialled one), counts the peer's failed remote accesses against
	// peer, its IP address.
	guard *peerguard.Guard
	peer  string

	// Connection setup: the initiator sends an RTR first (rtrOut); the
	// responder sends nothing until the first FPDU arrives (gate), and
	// with peer-to-peer mode that FPDU is the RTR it expects (wantRTR),
	// whose arrival rtrSeen signals.
	initiator bool
	wantRTR   wire.RTR
	rtrSeen   chan struct{}
	remoteQPN atomic.Uint32
	started   bool // start has run (set and read by setup's goroutine)

	// Startup kick (initiator): see kickCheck; heard and kickNow, below.
	kickMu    sync.Mutex  // guards the timers and the delay
	rtrTimer  *time.Timer // ends a connection whose RTR is overdue (watchRTR)
	gateTimer *time.Timer // opens the gate of a responder that speaks first (speakFirst)
	// kickRTR (initiator): the startup kick goes on while nothing has
	// come from the peer even when no response is awaited, since the
	// RTR may be stranded (kickCheck).
	kickRTR   bool
	kickTimer *time.Timer
	kickDelay time.Duration

	txDone chan struct{} // closed when the transmitter has stopped
	done   chan struct{} // closed when the connection has ended
	wg     sync.WaitGroup
	// running counts the connection's goroutines not yet done (see
	// exited): 2 from the start, 0 once both have run and are done with
	// the QP.
	running   atomic.Int32
	closeOnce sync.Once
	// timedOut: the stream failed with ETIMEDOUT (setUserTimeout), seen
	// by the transmitter or the receiver, whichever fails the QP, or a
	// request went unanswered for ackTimeout (checkResponses).
	timedOut atomic.Bool

	// Guarded by q.mu: the timer that checks, while requests are
	// outstanding, that the peer answers (ackTimeout, respArmed and
	// reachedAt below); respFrames and respAnswers are rxFrames and
	// rxAnswers at the last check, respStalls counts the checks since
	// the last answer that found none though the peer could have given
	// one, and stallBytes is rxBytes at the first of them.
	respTimer   *time.Timer
	respFrames  uint64
	respAnswers uint64
	respStalls  int
	stallBytes  uint64

	// Guarded by q.mu: the Terminate that ends the stream (term, below).
	termBuf [wire.TerminateMaxLen]byte
	termLen int

	// pinMu guards pins: the regions whose memory the batch in tb sends
	// straight from (Read Responses without CRC), until the batch is
	// written or dropped; Dereg waits for its region to leave them
	// (revokeRead). pinned (guarded by txMu) says pins is not empty.
	pinMu     sync.Mutex
	pins      []*mr
	wdeadline time.Time // guarded by txMu: the transmitter's writes fail after it (a Terminate's)

	lazyTimer    *time.Timer // sends the responses left (lazyAt), and the WRs left (postsLeft), if nothing else has
	confirmTimer *time.Timer // asks for a confirmation of the WRs left unconfirmed (confirmSince)
	rxWake       chan struct{}

	// What every FPDU touches.

	q *qp
	// sk is the socket, out of the runtime's poller (see sock); nc, the
	// net package's descriptor of it, is closed once the connection
	// starts.
	sk  *sock
	crc bool // MPA CRC32c in use
	ext bool // RFC 7306 extensions negotiated
	ird int  // Reads and atomics this side serves at once
	ord int  // Reads and atomics this side may have outstanding

	rtrOut  wire.RTR    // the RTR to send first (initiator)
	gate    atomic.Bool // the responder may send: the peer's first FPDU came
	heard   atomic.Bool // an FPDU came from the peer (the startup kick)
	kickNow bool        // guarded by q.mu: send a zero-length Write (the startup kick)
	aborted atomic.Bool

	// Guarded by q.mu: the QP's timeout (setUserTimeout), whether the
	// response check is armed (respTimer), and when the oldest
	// outstanding request reached the peer (checkResponses; monotime,
	// older than its sending while no check has found it).
	ackTimeout time.Duration
	respArmed  bool
	reachedAt  int64

	// Guarded by q.mu: the responses the receiver queued for the
	// transmitter; term: a Terminate (termBuf) ends the stream.
	irq     []irqEntry
	irqHead uint64
	irqTail uint64
	term    bool
	// closing: the application disconnects; the transmitter sends the
	// responses already queued, then half-closes the stream.
	closing bool

	// txMu makes one goroutine at a time the transmitter: the transmit
	// goroutine, or a posting goroutine in transmit. It guards tb,
	// txStopped, pinned and finishPending.
	txMu      sync.Mutex
	txStopped bool
	pinned    bool
	// finishPending: the batch left in tb ends the stream.
	finishPending bool
	wake          chan struct{} // wakes the transmitter
	// tb is the transmitter's batch, lent (borrowBatch) while it builds
	// and writes one, nil otherwise (batch, lendBack).
	tb *txBatch

	// lazyAt: when responses were left for the next post (rxTry), or 0;
	// lazyTimer sends them if nothing else has.
	lazyAt atomic.Int64
	// postsLeft: WRs posted were left in the send queue for a later
	// writev (coalesce.go); set under q.mu, cleared under q.mu by the
	// transmit round that takes them.
	postsLeft atomic.Bool
	// Unsignaled Sends and Writes left unconfirmed (needConfirm): a
	// poller (pollRx), or else confirmTimer, makes the transmitter ask
	// for a confirmation. confirmSince is when they were first left so
	// (monotime), or 0.
	confirmArmed atomic.Bool
	confirmDue   atomic.Bool
	confirmSince atomic.Int64

	// readyNum is the socket's registration number in the ready set of
	// the QP's send CQ ([0]) and receive CQ ([1]) (ready.go), plus one;
	// 0 when it is not in that set. Set under the CQ's ready.mu.
	readyNum  [2]atomic.Uint32
	readyLeft atomic.Bool // the socket has left the ready sets for good
	onSocket  atomic.Bool // the receive goroutine waits for its socket (waitIn)

	// Receiving: rxMu makes one goroutine at a time the receiver;
	// rxMissed tells the holder that another wanted to receive; rxBusy
	// counts read system calls and placements in progress (abort waits
	// for them); rxEnded: the receive goroutine has stopped
	// receiving; rxStopped (set under rxMu): a disconnect stopped
	// receiving, so that nothing is placed once it has flushed the
	// receives and Reads.
	rxMu      sync.Mutex
	rxMissed  atomic.Bool
	rxBusy    atomic.Int32
	rxEnded   atomic.Bool
	rxStopped atomic.Bool
	peerMid   atomic.Bool   // the peer's Send or Write being received is not whole yet (checkResponses)
	polls     atomic.Uint64 // rounds of pollers: see pollGrace
	polledAt  atomic.Uint64 // monotime of a recent poll (pollRx)
	rxRounds  atomic.Uint64 // rounds of receiving the receive goroutine ran (rxTry)
	rxFrames  atomic.Uint64 // FPDUs received: see rxSpin
	rxAnswers atomic.Uint64 // of those, Read and Atomic Responses
	rxBytes   atomic.Uint64 // their payload bytes
	arms      atomic.Uint64 // ReqNotify calls on the QP's CQs
	rx        rxState       // guarded by rxMu
}

// newConn makes the connection of q over nc with what MPA negotiated.
// Until start, the caller disposes of it with discard.
func newConn(q *qp, nc *net.TCPConn, crc, ext bool, ird, ord int) (*conn, error) {
	sk, err := newSock(nc)
	if err != nil {
		return nil, err
	}
	c := &conn{sk: sk, q: q, nc: nc, crc: crc, ext: ext, ird: min(ird, maxRdAtomic), ord: min(ord, maxRdAtomic),
		rtrSeen: make(chan struct{}), wake: make(chan struct{}, 1), txDone: make(chan struct{}), done: make(chan struct{})}
	c.running.Store(2) // rxLoop and txLoop, once start has run
	c.irq = make([]irqEntry, c.ird)
	c.pins = make([]*mr, 0, c.ird)
	c.rx.msn = [wire.NumQN]uint32{1, 1, 1, 1}
	c.rxWake = make(chan struct{}, 1)
	c.lazyTimer = time.AfterFunc(time.Hour, c.flushLazy)
	c.lazyTimer.Stop()
	c.confirmTimer = time.AfterFunc(time.Hour, c.confirmNow)
	c.confirmTimer.Stop()
	c.respTimer = time.AfterFunc(time.Hour, c.checkResponses)
	c.respTimer.Stop()
	nc.SetNoDelay(true)
	nc.SetKeepAlive(true)
	return c, nil
}

// discard disposes of a connection that setup gives up on: it aborts it
// and, once started, waits for its goroutines (the receive goroutine
// releases the socket); before, it releases the socket itself.
func (c *conn) discard() {
	c.abort()
	if c.started {
		c.wait()
		return
	}
	c.running.Store(0) // no goroutine was started: nothing to wait for
	c.sk.release()
}

// start runs the connection's goroutines, and lets pollers of the QP's
// CQs receive.
func (c *conn) start() {
	c.started = true
	c.closeOnce.Do(func() { c.nc.Close() }) // out of the runtime's poller
	c.q.live.Store(c)
	c.wg.Add(2)
	go c.rxLoop()
	go c.txLoop()
	if c.initiator {
		c.kickMu.Lock()
		c.kickDelay = kickFirst
		c.kickTimer = time.AfterFunc(c.kickDelay, c.kickCheck)
		c.kickMu.Unlock()
	}
}

// wakeTx makes the transmitter look for work.
func (c *conn) wakeTx() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// abort ends the connection at once, without a Terminate: the socket is
// shut to every later system call, and those in progress, reads and
// placements included, are waited for (none waits), so that nothing is
// placed or sent after abort returns; both goroutines stop, and the
// receive goroutine releases the descriptors as it ends. It may be
// called with q.mu held.
func (c *conn) abort() {
	c.aborted.Store(true)
	c.kickMu.Lock()
	if c.kickTimer != nil {
		c.kickTimer.Stop()
	}
	if c.rtrTimer != nil {
		c.rtrTimer.Stop()
	}
	if c.gateTimer != nil {
		c.gateTimer.Stop()
	}
	c.kickMu.Unlock()
	c.closeOnce.Do(func() { c.nc.Close() })
	c.sk.shutdown()
	c.lazyTimer.Stop()
	c.confirmTimer.Stop()
	c.respTimer.Stop()
	c.wakeTx()
	c.wakeRx()
	// A read in progress on c's own descriptor may still be placing
	// bytes: wait for it (it does not block).
	for c.rxBusy.Load() != 0 {
		runtime.Gosched()
	}
}

// wait waits for the connection's goroutines to end. q.mu must not be held.
func (c *conn) wait() { c.wg.Wait() }

// exited reports whether the connection's goroutines have been started
// and have done all they do with the QP: nothing is left of the
// connection to wait for.
func (c *conn) exited() bool { return c.running.Load() == 0 }

// streamBroken handles a failed write: the peer is gone or the stream
// was closed under the transmitter. The QP moves to the error state.
func (c *conn) streamBroken(err error) {
	c.noteErr(err)
	// The receive goroutine, which abort ends, fails the QP (finish):
	// by then it has noted its own error, which may be the one that
	// says why the stream ended (the kernel reports a timeout to one
	// system call, and EPIPE to the rest).
	c.abort()
}

// noteErr notes a socket error that says the connection timed out
// (setUserTimeout), whichever system call it came to.
func (c *conn) noteErr(err error) {
	if err != nil && errors.Is(err, unix.ETIMEDOUT) {
		c.timedOut.Store(true)
	}
}

// Connection end: the receiver ends the connection when the stream ends,
// breaks, or carries an error, and closes done once the QP is in the
// error state.

// finish records the end of the connection: the QP moves to the error
// state if it still uses this connection, and done closes.
func (c *conn) finish() {
	q := c.q
	c.rxMu.Lock()
	c.noteErr(c.rx.err)
	c.rxMu.Unlock()
	// The transmitter's error may say why the stream ended (the kernel
	// reports a timeout to one system call): it stops once aborted.
	c.abort()
	t := time.NewTimer(terminateTimeout)
	select {
	case <-c.txDone:
	case <-t.C:
	}
	t.Stop()
	q.mu.Lock()
	if q.c == c && !q.destroyed {
		if c.timedOut.Load() {
			q.req.timedOut()
		}
		q.toErr()
	}
	q.mu.Unlock()
	close(c.done)
}

// driver.Conn of a connection.

// connHandle is the driver.Conn cm hands out.
type connHandle struct {
	c      *conn
	remote driver.ConnParam
	// guard, of the listener that accepted the connection (nil for a
	// dialled one), counts the peer's failed remote accesses against
	// peer, its IP address.
	guard *peerguard.Guard
	peer  string
}

// RemoteParam is what the peer sent; a goverbs initiator in
// peer-to-peer mode tells its QP number in its RTR, which a responder's
// Accept does not wait for: 0 until it has come.
func (h *connHandle) RemoteParam() driver.ConnParam {
	r := h.remote
	if r.QPNum == 0 {
		r.QPNum = h.c.remoteQPN.Load()
	}
	return r
}

func (h *connHandle) Done() <-chan struct{} { return h.c.done }

// Close disconnects: the QP moves to the error state, the responses
// already queued for the peer go out (so that the Sends and Writes of
// the peer that this side received complete there as successes), the
// socket closes (the peer sees the stream end and fails its QP), and the
// goroutines are waited for.
func (h *connHandle) Close() error {
	c, q := h.c, h.c.q
	if c.postsLeft.Load() {
		// WRs left for a later writev (coalesce.go) were posted before
		// the disconnect: they go out, as they would have at their post.
		c.transmit()
	}
	// Receiving stops first: the move to the error state flushes the
	// receive a Send is filling and the outstanding Reads, whose buffers
	// are then the application's again, while the linger below may last
	// (a peer that does not read keeps the transmitter from finishing).
	// A round in progress ends before rxMu is free; none starts after.
	c.rxMu.Lock()
	c.rxStopped.Store(true)
	c.rxMu.Unlock()
	q.mu.Lock()
	linger := false
	if q.c == c && !q.destroyed {
		q.toErr()
		c.closing = true
		linger = !c.aborted.Load() && c.gate.Load()
	}
	q.mu.Unlock()
	if linger {
		c.wakeTx()
		t := time.NewTimer(closeLinger)
		select {
		case <-c.txDone:
		case <-c.done:
		case <-t.C:
		}
		t.Stop()
	}
	c.abort()
	c.wait()
	return nil
}
