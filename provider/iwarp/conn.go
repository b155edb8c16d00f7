package iwarp

import (
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/internal/peerguard"
	"github.com/goverbs/goverbs/internal/sglist"
	"github.com/goverbs/goverbs/provider/iwarp/wire"
	"github.com/goverbs/goverbs/verbs/driver"
)

// A connection is one TCP connection in full MPA operation, owned by one
// QP. Receiving (responder.go) is done by whoever holds rxMu: a goroutine
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

// Limits of one transmit batch (one writev).
const (
	batchBytes  = 2 << 20
	batchFrames = 128
	batchIovs   = 1024
	arenaLen    = batchFrames*(wire.MaxHeaderLen+3+wire.CRCLen) + inlineArena
)

// A payload of up to inlineMax bytes is copied into the arena behind its
// headers, as long as inlineArena has room, rather than sent from its
// buffer by an iovec of its own: a small frame is then one contiguous
// run of the arena, and a batch of small frames one buffer, which the
// kernel takes with write(2) at less cost than the iovecs of a writev
// (the copy of the payload, which the kernel makes anyway, costs less
// than the iovec). This is what verbs calls inline data, done for every
// small payload; larger ones go from the registered memory.
const (
	inlineMax   = 256
	inlineArena = 16 << 10
)

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

// conn is a connection and the state its goroutines keep.
type conn struct {
	q      *qp
	nc     *net.TCPConn
	crc    bool // MPA CRC32c in use
	ext    bool // RFC 7306 extensions negotiated
	ird    int  // Reads and atomics this side serves at once
	ord    int  // Reads and atomics this side may have outstanding
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
	rtrOut    wire.RTR
	gate      atomic.Bool
	rtrSeen   chan struct{}
	remoteQPN atomic.Uint32

	// Startup kick (initiator): see kickCheck.
	heard     atomic.Bool // an FPDU came from the peer
	kickMu    sync.Mutex  // guards the timers and the delay
	rtrTimer  *time.Timer // ends a connection whose RTR is overdue (watchRTR)
	gateTimer *time.Timer // opens the gate of a responder that speaks first (speakFirst)
	// kickRTR (initiator): the startup kick goes on while nothing has
	// come from the peer even when no response is awaited, since the
	// RTR may be stranded (kickCheck).
	kickRTR   bool
	kickTimer *time.Timer
	kickDelay time.Duration
	kickNow   bool // guarded by q.mu: send a zero-length Write

	// txMu makes one goroutine at a time the transmitter: the transmit
	// goroutine, or a posting goroutine in transmit. It guards tb and
	// txStopped.
	txMu      sync.Mutex
	txStopped bool

	wake   chan struct{} // wakes the transmitter
	txDone chan struct{} // closed when the transmitter has stopped
	done   chan struct{} // closed when the connection has ended
	wg     sync.WaitGroup
	// running counts the connection's goroutines not yet done (see
	// exited): 2 from the start, 0 once both have run and are done with
	// the QP.
	running atomic.Int32

	closeOnce sync.Once
	aborted   atomic.Bool
	// timedOut: the stream failed with ETIMEDOUT (setUserTimeout), seen
	// by the transmitter or the receiver, whichever fails the QP, or a
	// request went unanswered for ackTimeout (checkResponses).
	timedOut atomic.Bool
	// Guarded by q.mu: the QP's timeout (setUserTimeout), and the timer
	// that checks, while requests are outstanding, that the peer
	// answers; respFrames and respAnswers are rxFrames and rxAnswers at
	// the last check, respStalls counts the checks since the last answer
	// that found none though the peer could have given one, and
	// stallBytes is rxBytes at the first of them.
	ackTimeout  time.Duration
	respTimer   *time.Timer
	respArmed   bool
	respFrames  uint64
	respAnswers uint64
	respStalls  int
	stallBytes  uint64

	// Guarded by q.mu: the responses the receiver queued for the
	// transmitter, and the Terminate that ends the stream.
	irq     []irqEntry
	irqHead uint64
	irqTail uint64
	term    bool
	termBuf [wire.TerminateMaxLen]byte
	termLen int
	// closing: the application disconnects; the transmitter sends the
	// responses already queued, then half-closes the stream.
	closing bool

	tb txBatch // the transmitter's
	// pinMu guards pins: the regions whose memory the batch in tb sends
	// straight from (Read Responses without CRC), until the batch is
	// written or dropped; Dereg waits for its region to leave them
	// (revokeRead). pinned (guarded by txMu) says pins is not empty.
	pinMu  sync.Mutex
	pins   []*mr
	pinned bool
	// finishPending: the batch left in tb ends the stream.
	finishPending bool
	wdeadline     time.Time // the transmitter's writes fail after it (a Terminate's)

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
	polls     atomic.Uint64 // rounds of pollers: see pollGrace
	polledAt  atomic.Uint64 // monotime of a recent poll (pollRx)
	rxRounds  atomic.Uint64 // rounds of receiving the receive goroutine ran (rxTry)
	rxFrames  atomic.Uint64 // FPDUs received: see rxSpin
	rxAnswers atomic.Uint64 // of those, Read and Atomic Responses
	peerMid   atomic.Bool   // the peer's Send or Write being received is not whole yet (checkResponses)
	rxBytes   atomic.Uint64 // their payload bytes
	arms      atomic.Uint64 // ReqNotify calls on the QP's CQs
	lazyAt    atomic.Int64  // when responses were left for the next post (rxTry), or 0
	lazyTimer *time.Timer   // sends them if nothing else has
	// Unsignaled Sends and Writes left unconfirmed (needConfirm): a
	// poller (pollRx), or else the timer, makes the transmitter ask for
	// a confirmation. confirmSince is when they were first left so
	// (monotime), or 0.
	confirmTimer *time.Timer
	confirmArmed atomic.Bool
	confirmDue   atomic.Bool
	confirmSince atomic.Int64
	rxWake       chan struct{}
	rx           rxState // guarded by rxMu

	// sk is the socket, out of the runtime's poller (see sock); nc, the
	// net package's descriptor of it, is closed once the connection
	// starts.
	sk      *sock
	started bool // start has run (set and read by setup's goroutine)
}

// irqKind is the kind of a queued response.
type irqKind uint8

const (
	irqRead   irqKind = iota // a Read Response
	irqAtomic                // an Atomic Response
)

// irqEntry is a response the transmitter owes the peer.
type irqEntry struct {
	kind     irqKind
	sinkSTag uint32
	sinkTO   uint64
	src      []byte // the memory read
	mr       *mr    // the region of src
	// req is the Read Request's headers, which a Terminate that cuts the
	// response short names (revokeRead).
	req   [wire.ReadRequestLen]byte
	off   int    // bytes of it sent
	id    uint32 // atomic request identifier
	value uint64 // atomic original value
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

// watchRTR ends the connection (a responder's in peer-to-peer mode) if
// the initiator's RTR has not arrived within d: the QP moves to the error
// state and its WRs are flushed, as when the stream breaks.
func (c *conn) watchRTR(d time.Duration) {
	c.kickMu.Lock()
	defer c.kickMu.Unlock()
	c.rtrTimer = time.AfterFunc(d, func() {
		select {
		case <-c.rtrSeen:
		default:
			debugf("QP %d: no RTR from the initiator within %v", c.q.num, d)
			c.streamBroken(errNoRTR)
		}
	})
}

// errNoRTR ends a connection whose initiator did not send its RTR.
var errNoRTR = fmt.Errorf("%w: no RTR from the initiator in time after the MPA Reply", driver.ErrDisconnected)

// speakFirst opens the gate of a responder whose initiator did not ask
// for peer-to-peer mode d after the MPA Reply, if the initiator's first
// FPDU has not opened it before. RFC 5044 lets a responder send only
// once the initiator's first FPDU has arrived; an initiator without
// peer-to-peer mode sends first only if its application does, and Linux
// siw's never asks for that mode, so a server whose protocol speaks first
// (librdmacm's cmatose, rdma_server-style services) would wait forever.
// siw's own responder sends as soon as its Reply is out. The wait gives
// the initiator time to read the Reply first: siw's initiator reads the
// Reply's private data with a receive of 4 bytes more, and fails the
// connection if FPDU bytes already follow it in the socket.
func (c *conn) speakFirst(d time.Duration) {
	c.kickMu.Lock()
	defer c.kickMu.Unlock()
	c.gateTimer = time.AfterFunc(d, func() {
		if !c.aborted.Load() && !c.gate.Load() {
			debugf("QP %d: the initiator has sent nothing %v after the MPA Reply: sending first", c.q.num, d)
			c.openGate()
		}
	})
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

// The first kick and the last wait of the startup kick.
const (
	kickFirst = 5 * time.Millisecond
	kickLast  = time.Second
)

// kickCheck works around a race in Linux siw's connection setup (6.1 and
// later): siw sends its MPA Reply before it hooks the socket's data
// callback for RDMA mode, so FPDUs that arrive in between sit in its
// socket unread until more data comes. An initiator that has heard
// nothing from the peer sends a zero-length RDMA Write (a no-op any
// iWARP responder takes), a few times with growing waits, which makes
// siw read what was stranded: while it waits for a response, and, with
// a peer other than goverbs in peer-to-peer mode, from the start, since
// siw's responder completes its side of the connection (rdma_accept's
// ESTABLISHED event) only once it has read the RTR. A responder left
// without it keeps the connection half set up, and Linux's iWARP
// connection manager has been seen to hit a BUG when such connections
// are closed. A goverbs responder has no such race and is not kicked
// but while a response is awaited.
func (c *conn) kickCheck() {
	if c.heard.Load() || c.aborted.Load() {
		return
	}
	q := c.q
	q.mu.Lock()
	if q.c == c && (q.req.orqLen() > 0 || c.kickRTR) {
		c.kickNow = true
		c.wakeTx()
	}
	q.mu.Unlock()
	c.kickMu.Lock()
	if c.kickDelay *= 2; c.kickDelay <= kickLast && !c.aborted.Load() {
		c.kickTimer.Reset(c.kickDelay)
	}
	c.kickMu.Unlock()
}

// confirmDelay is how long unsignaled Sends and Writes may wait for a
// confirmation to be asked for while the application polls: in a stream
// of them a later request or signaled WR usually covers them first, at
// no cost, and until it does they only keep their send queue slots
// (needConfirm asks anyway once half the queue waits). A poller marks
// the request due (pollRx) and the next post's batch carries it;
// confirmBackstop is the timer's delay, for an application that stops
// posting. Each confirmation costs both ends a frame, and each timer
// that fires wakes a thread, which on a busy machine takes a processor
// from the pollers: a short timer (tens of µs) makes a Send ping-pong
// measurably slower than these.
const (
	confirmDelay    = time.Millisecond
	confirmBackstop = 10 * time.Millisecond
)

// confirmNow is the confirmation timer: the transmitter asks for one.
func (c *conn) confirmNow() {
	c.confirmArmed.Store(false)
	c.confirmDue.Store(true)
	c.transmit()
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

// terminate queues a Terminate for the transmitter, which sends it after
// the responses already queued and then half-closes the stream. The
// headers hdr of the offending segment are copied into it. q.mu is held.
func (c *conn) terminate(layer wire.Layer, etype, ecode uint8, hdr wire.Hdr) {
	if c.term {
		return
	}
	c.term = true
	c.termLen = wire.SetTerminate(c.termBuf[:], 1, layer, etype, ecode, hdr)
	c.wakeTx()
}

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
				c.txMu.Unlock()
				return
			}
			if !more {
				break
			}
		}
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

// endTransmit ends a non-blocking round: the transmitter is done (stop)
// or has more to do (more), which the transmit goroutine takes up.
// c.txMu is held, and released.
func (c *conn) endTransmit(more, stop bool) {
	if stop && !c.txStopped {
		c.txStopped = true
		c.unpin()
	}
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
	b := &c.tb
	if len(b.bufs) > 0 {
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

// executed follows the execution of WRs into b: it completes what can
// complete, asks for a confirmation of the Sends and Writes when one is
// due, arms the timers that see to them, and the check that the peer
// answers. q.mu and c.txMu are held.
func (c *conn) executed(b *txBatch) {
	q := c.q
	q.completeInOrder()
	// A QP draining its send queue (SQD) asks at once.
	if !q.req.cur.active && q.req.needConfirm(int(q.cap.MaxSendWR), c.confirmDue.Load() || q.sqdPending) && q.req.addConfirm(b) {
		c.confirmDue.Store(false)
	}
	if q.req.unconfirmed() {
		if c.confirmSince.Load() == 0 {
			c.confirmSince.Store(monotime())
		}
		if !c.confirmArmed.Swap(true) {
			c.confirmTimer.Reset(confirmBackstop)
		}
	} else if c.confirmSince.Load() != 0 {
		// Asked for, or nothing left to confirm: a timer that fires
		// meanwhile has nothing to add.
		c.confirmSince.Store(0)
		c.confirmDue.Store(false)
	}
	c.armResponseCheck()
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
	n, e := c.nbWrite(uintptr(c.sk.fd))
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

// nbWrite is one writev of the batch that does not wait for the socket.
func (c *conn) nbWrite(fd uintptr) (int, unix.Errno) {
	b := &c.tb
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

// addResponses builds the queued Read and Atomic Responses into b, in
// order, as far as the batch takes them. q.mu is held.
func (c *conn) addResponses(b *txBatch) {
	var src sglist.List
	for c.irqHead != c.irqTail {
		e := &c.irq[c.irqHead%uint64(len(c.irq))]
		switch e.kind {
		case irqAtomic:
			if !b.room(wire.AtomicRespLen, 0) {
				return
			}
			c.q.req.msn[wire.QNAtomic]++
			wire.AtomicResponse(b.header(wire.AtomicRespLen)).Set(c.q.req.msn[wire.QNAtomic], e.id, e.value)
			b.endFrame(nil, 0, 0)
		case irqRead:
			if e.mr != nil {
				// Pinned first, then checked: a Dereg that revokes
				// the region after the check finds it pinned.
				if !c.crc {
					c.pin(e.mr)
				}
				if e.mr.revoked.Load() {
					// Dereg ends the stream (revokeRead): nothing
					// more of the region goes out.
					return
				}
			}
			src.One(e.src)
			for first := true; first || e.off < len(e.src); first = false {
				n := min(len(e.src)-e.off, maxPayload)
				if !b.room(wire.TaggedLen, n) {
					return
				}
				last := e.off+n == len(e.src)
				wire.Hdr(b.header(wire.TaggedLen)).SetTagged(wire.OpReadResponse, last, e.sinkSTag, e.sinkTO+uint64(e.off), n)
				if c.crc && !b.inlines(n) {
					// The memory read may be written while the frame
					// goes out (a Read of it then returns torn data, as
					// on any device); its CRC must cover the bytes
					// sent, so they are copied first (an inline payload
					// is a copy already).
					var snap sglist.List
					snap.One(b.snapshot(e.src[e.off : e.off+n]))
					b.endFrame(&snap, 0, n)
				} else {
					b.endFrame(&src, uint64(e.off), n)
				}
				e.off += n
			}
		}
		*e = irqEntry{}
		c.irqHead++
	}
}

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
	c.rxMu.Unlock()
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

// raceRelease gives the race detector the happens-before edge a socket
// write carries to the reads of the data it wrote: the runtime annotates
// write(2) and read(2) for the race detector but not writev(2), so with
// both ends in one process the detector would otherwise not see that a
// receiver's completion follows what the sender's goroutines did. A
// write of nothing to the socket, just before the writev, is a
// write(2) of nothing.
func raceRelease(fd int) { syscall.Write(fd, nil) }

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
// are outstanding. The oldest request is older than the QP's timeout, and
// nothing of the connection's is in the socket either way (the request
// has reached the peer, and no answer waits to be read): if nothing at
// all has come from the peer since the last check (its TCP may still
// acknowledge, as a stopped process's does), or no Read or Atomic
// Response has for answerStalls such checks while more than
// answerSlack bytes came (a peer that keeps sending but answers
// nothing), the connection has timed out: it ends, and the WR that
// waited completes with WCRetryExcErr (finish). A request thus times out
// after one to two timeouts of silence, or some five of traffic without
// answers.
func (c *conn) checkResponses() {
	q := c.q
	q.mu.Lock()
	if q.c != c || c.aborted.Load() || c.ackTimeout == 0 || q.req.orqLen() == 0 {
		c.respArmed = false
		q.mu.Unlock()
		return
	}
	r := &q.req
	age := time.Duration(monotime() - r.orq[r.orqHead%maxRdAtomic].sent)
	frames, answers, bytes := c.rxFrames.Load(), c.rxAnswers.Load(), c.rxBytes.Load()
	due := age >= c.ackTimeout && !c.bytesInFlight()
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
	// Silence must last a whole period: the peer's frames are counted
	// from one check to the next.
	c.respFrames, c.respAnswers = frames, answers
	c.respTimer.Reset(c.ackTimeout)
	q.mu.Unlock()
}

// bytesInFlight reports whether the socket holds bytes either way: sent
// and not yet acknowledged, or not sent (the request may not have reached
// the peer yet, behind a large message on a slow path; a peer that
// stops taking them is TCP_USER_TIMEOUT's to end), or received and not
// yet read (the answer may be there, this side slow to read it).
func (c *conn) bytesInFlight() bool {
	busy := false
	c.sk.control(func(fd int) {
		out, err1 := unix.IoctlGetInt(fd, unix.SIOCOUTQ)
		in, err2 := unix.IoctlGetInt(fd, unix.SIOCINQ)
		busy = out > 0 || in > 0 || err1 != nil || err2 != nil
	})
	return busy
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

// txBatch is one writev: the headers and trailers in an arena, the
// registered memory in place, and where each frame's CRC goes.
type txBatch struct {
	arena   [arenaLen]byte
	na      int
	iov     [batchIovs][]byte
	niov    int
	bufs    net.Buffers // what is left to write
	wiov    [batchIovs]unix.Iovec
	frames  [batchFrames]frameRef
	nframes int
	bytes   int
	full    bool // a frame did not fit: go round again
	hstart  int  // arena offset of the frame being built
	// The last arena iovec (-1: none), where it starts and ends.
	arenaIov, arenaStart, arenaEnd int
	// snap[:nsnap]: copies of memory sent under CRC (snapshot).
	snap  []byte
	nsnap int
}

// frameRef locates a frame in the batch for its CRC: its headers in the
// arena, its payload's iovecs, and the arena offset of its pad and CRC.
type frameRef struct {
	hstart, hlen int
	p0, p1       int
	padOff, pad  int
}

// snapshot copies p into the batch's own memory (allocated the first
// time) and returns the copy: Read Responses under CRC send what their
// CRC was computed over. room keeps a batch's bytes within batchBytes.
func (b *txBatch) snapshot(p []byte) []byte {
	if b.snap == nil {
		b.snap = make([]byte, batchBytes)
	}
	s := b.snap[b.nsnap : b.nsnap+len(p)]
	if raceEnabled {
		copyUnwatched(s, p)
	} else {
		copy(s, p)
	}
	b.nsnap += len(p)
	return s
}

// copyUnwatched copies src into dst out of the race detector's sight: the
// memory an RDMA Read reads may be written meanwhile by its owner, which
// RDMA allows (the reader gets torn data), and the detector does not
// watch the writev that sends such memory without CRC either. (copy's
// runtime.slicecopy reports to the detector whoever calls it.)
//
//go:norace
func copyUnwatched(dst, src []byte) int {
	n := min(len(dst), len(src))
	i := 0
	for ; i+8 <= n; i += 8 {
		*(*uint64)(unsafe.Pointer(&dst[i])) = *(*uint64)(unsafe.Pointer(&src[i]))
	}
	for ; i < n; i++ {
		dst[i] = src[i]
	}
	return n
}

// consume drops the first n bytes written from b.bufs.
func (b *txBatch) consume(n int) {
	for n > 0 && len(b.bufs) > 0 {
		if n < len(b.bufs[0]) {
			b.bufs[0] = b.bufs[0][n:]
			return
		}
		n -= len(b.bufs[0])
		b.bufs[0] = nil
		b.bufs = b.bufs[1:]
	}
	for len(b.bufs) > 0 && len(b.bufs[0]) == 0 {
		b.bufs = b.bufs[1:]
	}
}

func (b *txBatch) reset() {
	clear(b.iov[:b.niov])
	b.bufs = nil
	b.na, b.niov, b.nframes, b.bytes, b.full, b.nsnap = 0, 0, 0, 0, false, 0
	b.arenaIov = -1
}

// room reports whether a frame with hlen bytes of headers and n bytes of
// payload fits; if not, the batch is marked full.
func (b *txBatch) room(hlen, n int) bool {
	ok := b.nframes < batchFrames && b.na+hlen+3+wire.CRCLen <= arenaLen &&
		b.niov+maxSGE+2 <= batchIovs && (b.bytes == 0 || b.bytes+hlen+n <= batchBytes)
	if !ok {
		b.full = true
	}
	return ok
}

// header reserves hlen bytes of the arena for the headers of the next
// frame and returns them.
func (b *txBatch) header(hlen int) []byte {
	b.hstart = b.na
	b.na += hlen
	return b.arena[b.hstart:b.na]
}

// addArena adds arena[start:end] to the iovecs, extending the last one
// when it ends where this begins: the headers and trailers of frames
// without payload between them go out as one iovec, which the kernel
// takes faster than many small ones.
func (b *txBatch) addArena(start, end int) {
	if b.arenaIov == b.niov-1 && b.niov > 0 && b.arenaEnd == start {
		b.iov[b.niov-1] = b.arena[b.arenaStart:end]
	} else {
		b.iov[b.niov] = b.arena[start:end]
		b.arenaIov, b.arenaStart = b.niov, start
		b.niov++
	}
	b.arenaEnd = end
}

// endFrame completes the frame whose headers header returned: n bytes of
// payload from src at offset off (none if src is nil), then pad and
// CRC. The ULPDU length in the headers must already be right.
func (b *txBatch) endFrame(src *sglist.List, off uint64, n int) {
	f := &b.frames[b.nframes]
	b.nframes++
	pad := b.framePad()
	if src == nil {
		n = 0
	}
	inline := b.inlines(n)
	if inline {
		b.addPayload(src, off, n, true)
	}
	f.hstart, f.hlen = b.hstart, b.na-b.hstart
	b.addArena(b.hstart, b.na)
	f.p0 = b.niov
	if !inline {
		b.addPayload(src, off, n, false)
	}
	f.p1 = b.niov
	clear(b.arena[b.na : b.na+pad+wire.CRCLen])
	f.padOff, f.pad = b.na, pad
	b.addArena(b.na, b.na+pad+wire.CRCLen)
	b.na += pad + wire.CRCLen
	b.bytes += f.hlen + pad + wire.CRCLen
	if !inline {
		b.bytes += n
	}
}

// framePad is the pad of the frame whose headers header returned.
func (b *txBatch) framePad() int { return wire.Pad(wire.Hdr(b.arena[b.hstart:b.na]).ULPDULen()) }

// inlines reports whether endFrame copies n bytes of payload of the frame
// whose headers header returned into the arena (see inlineMax).
func (b *txBatch) inlines(n int) bool {
	return n <= inlineMax && b.na+n+b.framePad()+wire.CRCLen <= arenaLen
}

// addPayload adds n bytes of src from offset off to the frame being
// built: copied into the arena behind its headers (inline, see
// inlineMax), or as iovecs of the memory itself. The memory may be a
// region a peer's Read reads while its owner writes it, which RDMA
// allows: under the race detector the copy is out of its sight, as the
// writev that sends it otherwise is.
func (b *txBatch) addPayload(src *sglist.List, off uint64, n int, inline bool) {
	for i := 0; n > 0 && i < src.N(); i++ {
		s := src.Seg(i)
		if off >= uint64(len(s)) {
			off -= uint64(len(s))
			continue
		}
		s = s[off:min(uint64(len(s)), off+uint64(n))]
		off = 0
		n -= len(s)
		if !inline {
			b.iov[b.niov] = s
			b.niov++
		} else if raceEnabled {
			b.na += copyUnwatched(b.arena[b.na:], s)
		} else {
			b.na += copy(b.arena[b.na:], s)
		}
	}
}

// computeCRCs fills the CRC of every frame: CRC32c over the length
// field, the ULPDU and the pad.
func (b *txBatch) computeCRCs() {
	for i := range b.nframes {
		f := &b.frames[i]
		crc := crc32.Update(0, wire.Castagnoli, b.arena[f.hstart:f.hstart+f.hlen])
		for _, s := range b.iov[f.p0:f.p1] {
			crc = crc32.Update(crc, wire.Castagnoli, s)
		}
		crc = crc32.Update(crc, wire.Castagnoli, b.arena[f.padOff:f.padOff+f.pad])
		wire.PutCRC(b.arena[f.padOff+f.pad:], crc)
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
