package rsock

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// Errors a connection's operations return, inside a *net.OpError; test
// them with errors.Is.
var (
	// ErrReset: the peer closed the connection without ending its stream
	// first, or died, or the connection broke. It wraps
	// syscall.ECONNRESET.
	ErrReset = fmt.Errorf("rsock: connection reset: the peer is gone: %w", syscall.ECONNRESET)
	// ErrAborted: this side ended the connection, not the peer: its own
	// device refused an operation — a post to a full send queue, a QP or
	// CQ in a state that takes none — and the error wraps the device's
	// error too; or one of its work requests completed with a local
	// error (a region of its own refused it); or a zero-copy
	// Write ended (its deadline passed, or Close came) before the device
	// had read its buffer. It wraps syscall.ECONNABORTED.
	ErrAborted = fmt.Errorf("rsock: connection aborted by this side: %w", syscall.ECONNABORTED)
	// ErrWriteClosed: Write after CloseWrite. It wraps syscall.EPIPE.
	ErrWriteClosed = fmt.Errorf("rsock: write after CloseWrite: %w", syscall.EPIPE)
	// ErrProtocol: the peer broke the protocol (wrote past its credits,
	// sent a malformed control message or a false completion); the
	// connection is closed.
	ErrProtocol = errors.New("rsock: the peer broke the rsock protocol; the connection was dropped")
)

// recvTag marks the work request IDs of receives; a send's ID is the
// number of send queue slots it holds.
const recvTag = 1 << 63

// Conn is a byte stream over an RDMA connection. It implements net.Conn;
// its methods are safe for concurrent use.
type Conn struct {
	dev        *device
	pd         *verbs.PD // this connection's alone
	cmc        *cm.Conn
	qp         *verbs.QP
	cq         *verbs.CQ
	ring       *verbs.MR // this side's receive ring; the peer RDMA-Writes into it
	stageMR    *verbs.MR // staging for the peer's ring
	ctl        *verbs.MR // control buffers: one per receive, then the Send's
	laddr      Addr
	raddr      Addr
	spin       time.Duration
	spinGrowth int // a wait spins at most spinGrowth×spin (waitCtx.spinFor)
	onClose    func()

	stage   []byte // staging for the peer's ring: byte n of the stream is at stage[n%len]
	sendBuf []byte // the control buffer of a Send
	ringBuf []byte

	// The caller's buffer of the last zero-copy Write, registered for
	// the device to read it (writeMu guards them); zcMin is the least
	// Write that goes so, 0 for none.
	zcMR  *verbs.MR
	zcBuf []byte
	zcMin int

	useImm    bool   // the peer takes control messages as immediate data
	acceptImm bool   // this side told the peer to send them so
	peerAddr  uint64 // the peer's ring
	peerKey   uint32
	peerSize  uint64
	peerRecvs int // the peer's posted receives: our message credits at start
	recvs     int // our posted receives
	sqDepth   int

	// acceptInline: this side told the peer that its receives, of
	// recvSlot bytes, take inline data messages; inlineMax is the most
	// bytes this side sends so (0: none, the peer does not take them);
	// sendInline is the QP's MaxInlineData and the send buffer's size.
	acceptInline bool
	recvSlot     int
	inlineMax    int
	sendInline   int

	// helpable: spinning waits may poll for this connection while its
	// wait is parked (park.go); park is its park state, parkedAt when it
	// parked (since parkEpoch), parkIdx its place among the parked
	// connections.
	helpable bool
	park     atomic.Int32
	parkedAt atomic.Int64
	parkIdx  int

	readMu  sync.Mutex // one Read at a time
	writeMu sync.Mutex // one Write at a time, so writes are not interleaved
	pollMu  sync.Mutex // held by the goroutine that polls the CQ

	mu sync.Mutex // guards what follows
	// Receive side: the peer announced rxTail bytes, Read consumed
	// rxHead, and the peer has been told it may fill the ring up to
	// rxCredited+len(ring).
	rxHead, rxTail, rxCredited uint64
	rxFin                      bool
	// Send side: Write sent txSent bytes and the peer has freed txFreed.
	txSent, txFreed uint64
	credits         int    // control messages the peer can take now
	owed            int    // receives reposted and not yet acknowledged to the peer
	sendsOut        int    // send queue slots in use
	posted, retired uint64 // send queue slots posted, and retired by completions, in all
	unsignaled      int    // send queue slots posted since the last signaled work request
	finSent         bool
	err             error       // the connection is broken
	failed          atomic.Bool // err is set
	closed          bool
	// ending: the connection fails with ErrReset once the completions
	// the CQ holds are taken (take, settleEnd), so that a Read still
	// returns what the peer sent before: a completion came back
	// flushed, or the peer is gone (progress).
	ending atomic.Bool

	closing      chan struct{} // closed by Close
	rwake, wwake chan struct{} // a reader, a writer: something changed
	rdl, wdl     deadline
	rctx, wctx   waitCtx // CQ waits bounded by rdl, wdl
	disconnect   sync.Once

	wcs [32]verbs.WorkCompletion
	// The work requests of the next post (flush): swr[:nwr], each with
	// its SGE at the same index of sge, nctl of them Sends with their
	// control word in the send buffer; plan, the data messages it is to
	// carry (planData), at most maxList of them: listMax, or as many
	// control words as the send buffer holds when data messages are Sends.
	swr     [2 * listMax]verbs.SendWR
	sge     [2 * listMax]verbs.SGE
	nwr     int
	nctl    int
	plan    [listMax]chunk
	maxList int
	// segment: the device's most payload in one frame, to which data
	// messages are fitted (chunkMax); 0 where it does not matter.
	segment uint64
	rwr     [1]verbs.RecvWR
	rsge    [1]verbs.SGE
}

// Addr is the address of one end of a connection: the URL of the
// listener (loop://name, shm:///path.sock, tcp://host:port), or for a
// dialler's own end, the scheme with its queue pair number.
type Addr struct {
	URL string
}

// Network returns "rsock".
func (a Addr) Network() string { return "rsock" }

// String returns the URL.
func (a Addr) String() string { return a.URL }

// LocalAddr returns the local end's address.
func (c *Conn) LocalAddr() net.Addr { return c.laddr }

// RemoteAddr returns the peer's address.
func (c *Conn) RemoteAddr() net.Addr { return c.raddr }

// RegisteredBytes is the registered memory the connection holds: its
// receive ring, the staging copy of the peer's ring, and the control
// buffers. Config.RingSize sets the first two.
func (c *Conn) RegisteredBytes() int { return c.ring.Len() + c.stageMR.Len() + c.ctl.Len() }

func (c *Conn) opError(op string, err error) error {
	return &net.OpError{Op: op, Net: "rsock", Source: c.laddr, Addr: c.raddr, Err: err}
}

// SetDeadline sets the read and write deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	c.rdl.set(t)
	c.wdl.set(t)
	return nil
}

// SetReadDeadline sets the deadline of Read calls, those blocked now
// included; a Read past it fails with an error for which
// errors.Is(err, os.ErrDeadlineExceeded) holds.
func (c *Conn) SetReadDeadline(t time.Time) error { c.rdl.set(t); return nil }

// SetWriteDeadline sets the deadline of Write calls, those blocked now
// included. A Write that times out may have sent part of its bytes: it
// returns how many.
func (c *Conn) SetWriteDeadline(t time.Time) error { c.wdl.set(t); return nil }

// Read reads up to len(b) bytes from the stream. It blocks, parking its
// goroutine, until bytes arrive, the peer ends its stream (io.EOF), the
// read deadline passes, the connection breaks or is closed.
func (c *Conn) Read(b []byte) (int, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	for {
		if c.rdl.passed() {
			if c.isClosed() {
				return 0, c.opError("read", net.ErrClosed)
			}
			return 0, c.opError("read", os.ErrDeadlineExceeded)
		}
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return 0, c.opError("read", net.ErrClosed)
		}
		if avail := c.rxTail - c.rxHead; avail > 0 && len(b) > 0 {
			// The bytes may run past the ring's end and on from its
			// start: one Read takes both parts.
			off := c.rxHead % uint64(len(c.ringBuf))
			n := min(avail, uint64(len(b)))
			c.mu.Unlock()
			k := copy(b[:n], c.ringBuf[off:])
			copy(b[k:n], c.ringBuf)
			c.mu.Lock()
			c.rxHead += n
			c.sendCredits(false)
			c.mu.Unlock()
			c.afterPost()
			return int(n), nil
		}
		switch {
		case len(b) == 0:
			c.mu.Unlock()
			return 0, nil
		case c.rxFin:
			c.mu.Unlock()
			return 0, io.EOF
		case c.err != nil:
			err := c.err
			c.mu.Unlock()
			return 0, c.opError("read", err)
		}
		c.mu.Unlock()
		c.wait(&c.rctx, c.rwake, c.wwake)
	}
}

// Write writes b to the stream. It blocks, parking its goroutine, while
// the peer's ring is full, until the write deadline passes, the
// connection breaks or is closed; it then returns how many bytes it sent.
//
// A Write of at least Config.ZeroCopyMin bytes is not copied: the device
// reads b itself, and Write returns once it has.
func (c *Conn) Write(b []byte) (int, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.progress()
	src := c.zeroCopySource(b)
	sent, last, err := c.write(b, src)
	if last != 0 {
		if werr := c.awaitRetired(last); err == nil {
			err = werr
		}
	}
	return sent, err
}

// write sends b, from src (b registered) or, when src is nil, through
// the staging buffer. last is the count of slots posted once the last
// work request that reads src was, 0 if none was: Write waits until it
// is retired, whether write sent all of b or stopped before. writeMu is
// held.
func (c *Conn) write(b []byte, src *verbs.MR) (sent int, last uint64, err error) {
	for {
		if c.wdl.passed() {
			if c.isClosed() {
				return sent, last, c.opError("write", net.ErrClosed)
			}
			return sent, last, c.opError("write", os.ErrDeadlineExceeded)
		}
		c.mu.Lock()
		switch {
		case c.closed:
			c.mu.Unlock()
			return sent, last, c.opError("write", net.ErrClosed)
		case c.finSent:
			c.mu.Unlock()
			return sent, last, c.opError("write", ErrWriteClosed)
		case c.err != nil:
			err := c.err
			c.mu.Unlock()
			return sent, last, c.opError("write", err)
		case c.ending.Load():
			c.mu.Unlock()
			return sent, last, c.opError("write", ErrReset)
		case sent == len(b):
			c.mu.Unlock()
			return sent, last, nil
		}
		k := c.planData(len(b) - sent)
		if k == 0 {
			c.mu.Unlock()
			c.wait(&c.wctx, c.wwake, c.rwake)
			continue
		}
		if src != nil {
			// The last work request reading src is signaled, so that
			// its completion says when the device is done with b. So is
			// the last of each post while a write deadline is set, so
			// that a Write whose deadline passes before its end, its
			// connection up, knows whether the device is done with what
			// it posted. Write waits for the last posted either way; if
			// it cannot know (a Write closed, or whose connection broke,
			// before its end), it ends the connection (awaitRetired).
			dl := c.wdl.at.Load() != 0
			at := sent
			for i, ch := range c.plan[:k] {
				end := at+int(ch.n) == len(b)
				c.queueData(src.SGE(at, int(ch.n)), ch.off, ch.n, end || dl && i == k-1)
				at += int(ch.n)
			}
			last = c.posted
			sent += c.flushData(k)
			c.mu.Unlock()
			c.afterPost()
			continue
		}
		if ch := c.plan[0]; k == 1 && int(ch.n) <= c.inlineMax {
			// One Send carries the bytes with their data message.
			if c.postInline(b[sent : sent+int(ch.n)]) {
				sent += int(ch.n)
			}
			c.mu.Unlock()
			c.afterPost()
			continue
		}
		c.mu.Unlock()
		// The staging bytes are free: the peer has consumed what was
		// there, so the RDMA Write that carried them is complete.
		at := sent
		for _, ch := range c.plan[:k] {
			copy(c.stage[ch.off:ch.off+ch.n], b[at:])
			at += int(ch.n)
		}
		if afterStage != nil {
			afterStage(c)
		}
		c.mu.Lock()
		// A Read may have spent a credit or send queue slots on a credit
		// message meanwhile: what no longer fits, a credit left besides
		// each data message's as planData leaves it, waits for the next
		// round.
		j := 0
		for _, ch := range c.plan[:k] {
			if c.err != nil || c.closed || c.credits < 2 || c.sendsOut+2 > c.sqDepth {
				break
			}
			c.queueData(c.stageMR.SGE(int(ch.off), int(ch.n)), ch.off, ch.n, false)
			j++
		}
		sent += c.flushData(j)
		c.mu.Unlock()
		c.afterPost()
	}
}

// afterStage, set by tests only, runs in write once it has copied a
// post's bytes into the staging buffer, before it takes mu again to post
// them: what a Read does meanwhile (a credit message) must not make the
// post spend credits or send queue slots it may not.
var afterStage func(*Conn)

// zeroCopySource returns b registered for the device to read, when the
// Write of b goes without a copy: at least zcMin bytes, and the device
// registers it. The last registration is kept for the next Write of the
// same buffer (a stream's writes usually reuse theirs), and released by
// the next Write of another and by Close. writeMu is held.
func (c *Conn) zeroCopySource(b []byte) *verbs.MR {
	if c.zcMin <= 0 || len(b) < c.zcMin {
		return nil
	}
	if c.zcMR != nil && &c.zcBuf[0] == &b[0] && len(b) <= len(c.zcBuf) {
		return c.zcMR
	}
	c.dropZeroCopy()
	mr, err := c.pd.RegMR(b, 0)
	if err != nil {
		return nil // out of regions, say: copy instead
	}
	c.zcMR, c.zcBuf = mr, b
	return mr
}

// dropZeroCopy releases the registration of a zero-copy Write's buffer;
// no work request reads it any more. writeMu is held.
func (c *Conn) dropZeroCopy() {
	if c.zcMR != nil {
		c.zcMR.Dereg()
		c.zcMR, c.zcBuf = nil, nil
	}
}

// awaitRetired waits until the send queue slots up to last have been
// retired: the device no longer reads the caller's buffer, which Write
// hands back. If the write deadline passes or the connection is closed
// first, the connection ends and the buffer's registration is released
// (the device reads no region after its Dereg), and the error says
// why. writeMu is held.
func (c *Conn) awaitRetired(last uint64) error {
	for {
		if c.pollMu.TryLock() {
			c.poll()
			c.pollMu.Unlock()
			nudge(c.rwake)
		}
		c.mu.Lock()
		done := c.retired >= last
		var err error
		switch {
		case done:
		case c.closed:
			err = net.ErrClosed
		case c.wdl.passed():
			err = os.ErrDeadlineExceeded
		case c.err != nil:
			err = c.err
		}
		if err != nil {
			c.fail(fmt.Errorf("%w: a zero-copy Write ended before the device had read its buffer", ErrAborted))
		}
		c.mu.Unlock()
		if done {
			return nil
		}
		if err != nil {
			c.afterPost()
			c.disconnect.Do(func() { c.cmc.Close() })
			c.dropZeroCopy()
			return c.opError("write", err)
		}
		c.wait(&c.wctx, c.wwake, c.rwake)
	}
}

// maxChunk bounds one RDMA Write, so that a long Write keeps the ring's
// credits flowing back while it goes on.
func maxChunk(ring uint64) uint64 { return max(ring/4, 1) }

// iwarpSegment is the most payload tcp0 puts in one FPDU (maxPayload in
// provider/iwarp; MPA's 16-bit length caps an FPDU below 64 KiB). On
// iWARP a data message is a whole number of them where it can be: a
// 64 KiB RDMA Write would be an FPDU of 63 KiB and one of 1 KiB, and the
// receiver reads each FPDU with a system call of its own.
const iwarpSegment = 63 << 10

// chunkMax bounds one data message to the peer's ring: maxChunk, rounded
// down to a whole number of the device's segments (c.segment) when it
// holds one.
func (c *Conn) chunkMax() uint64 {
	n := maxChunk(c.peerSize)
	if c.segment > 0 && n > c.segment {
		n -= n % c.segment
	}
	return n
}

// CloseWrite ends the stream this side sends: the peer's Read returns
// io.EOF after the bytes sent before, and Write fails with
// ErrWriteClosed. Reading goes on.
func (c *Conn) CloseWrite() error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.progress()
	for {
		c.mu.Lock()
		switch {
		case c.closed:
			c.mu.Unlock()
			return c.opError("close", net.ErrClosed)
		case c.finSent:
			c.mu.Unlock()
			return nil
		case c.err != nil:
			err := c.err
			c.mu.Unlock()
			return c.opError("close", err)
		case c.ending.Load():
			c.mu.Unlock()
			return c.opError("close", ErrReset)
		}
		// The end of the stream may take the last credit, as a credit
		// message may; a data message never does (planData). That
		// stalls nothing. The end of the stream carries every
		// acknowledgement this side owes, and no data follows it: what
		// this side sends after it, credit messages as it reads, waits
		// only for the peer's acknowledgements. And these come: a side
		// without a credit has used all of the peer's receives, and
		// once its messages have arrived the peer owes it all of them,
		// at least half, which it returns at once (sendCredits) unless
		// it has no credit either. For both sides to be without one, every
		// message delivered, each side's last messages — as many as
		// the other side's receives — must have crossed the other's
		// with no acknowledgement in them; that holds only of each
		// side's first messages, sent before it received anything, and
		// the last of these, which took the last credit, can then only
		// be an end of stream (a credit message needs something
		// received to free or acknowledge). Both streams are then over,
		// and neither side has anything left to send.
		// (TestEndOfStreamTakesTheLastCredit.)
		if c.credits >= 1 && c.sendsOut+2 <= c.sqDepth {
			c.postCtrl(opFin, 0)
			c.finSent = true
			c.mu.Unlock()
			c.afterPost()
			return nil
		}
		c.mu.Unlock()
		if c.wdl.passed() {
			return c.opError("close", os.ErrDeadlineExceeded)
		}
		c.wait(&c.wctx, c.wwake, c.rwake)
	}
}

// closeLinger bounds how long Close waits for the end of the stream to
// leave.
const closeLinger = time.Second

// Close closes the connection: the peer reads the bytes sent before and
// then io.EOF. Blocked Reads and Writes return net.ErrClosed. Close
// releases the connection's memory and queues before it returns.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return c.opError("close", net.ErrClosed)
	}
	c.closed = true
	close(c.closing)
	c.mu.Unlock()
	// Wake the calls that wait: a CQ wait ends at its deadline.
	c.rdl.seal()
	c.wdl.seal()
	c.readMu.Lock()
	c.writeMu.Lock()
	c.pollMu.Lock()
	c.linger()
	c.disconnect.Do(func() { c.cmc.Close() })
	c.destroy()
	c.pollMu.Unlock()
	c.writeMu.Unlock()
	c.readMu.Unlock()
	if c.onClose != nil {
		c.onClose()
	}
	return nil
}

// linger ends the stream and waits, up to closeLinger, until every send
// has left, so that the disconnect flushes none of them. The end of the
// stream needs a receive credit and a slot of the send queue: while it
// has neither (the data before it took them), linger polls for the
// credits the reading peer returns, and sends it then. pollMu is held.
func (c *Conn) linger() {
	var ctx context.Context
	for {
		c.mu.Lock()
		ending := c.ending.Load() // no peer to take the end of the stream
		// On the last credit if need be, as in CloseWrite.
		if c.err == nil && !ending && !c.finSent && c.credits >= 1 && c.sendsOut+2 <= c.sqDepth {
			c.postCtrl(opFin, 0)
			c.finSent = true
		}
		// The end of the stream is signaled: its completion retires
		// every slot before it.
		done := c.err != nil || ending || c.finSent && c.sendsOut == c.unsignaled
		c.mu.Unlock()
		if done {
			return
		}
		if ctx == nil {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(context.Background(), closeLinger)
			defer cancel()
		}
		n, err := c.cq.Wait(ctx, c.wcs[:])
		if err != nil {
			return
		}
		if c.complete(n) {
			c.settleEnd() // Close takes nothing more
		}
	}
}

func (c *Conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// wait blocks until something may have changed for the caller: a
// completion, a wake-up on mine, the deadline of ctx, or Close (which
// makes the deadline pass). One waiter at a time polls the completion
// queue, the others wait on their wake channel; the poller, when it
// leaves, wakes the other side (other) so that it takes over.
func (c *Conn) wait(ctx *waitCtx, mine, other chan struct{}) {
	dl := ctx.dl
	if !c.pollMu.TryLock() {
		select {
		case <-mine:
		case <-dl.wait():
		case <-c.closing:
		}
		return
	}
	defer func() {
		c.pollMu.Unlock()
		nudge(other)
	}()
	if c.poll() > 0 {
		ctx.learn(0)
		return
	}
	// Spin a little before parking: a reply that comes within the spin
	// costs no wake-up.
	start, done := c.spinWait(ctx, dl, ctx.spinFor(c.spin, c.spinGrowth))
	if done {
		return
	}
	// Park on the completion channel. (Not CQ.Wait: on shm0 it first
	// sleeps in the thread, which keeps the goroutine's P from the
	// others for a while, and an application that serves a connection
	// with several goroutines, as gRPC does, waits for it.)
	if err := c.cq.ReqNotify(false); err != nil {
		c.mu.Lock()
		c.fail(aborted("arm the completion queue", err))
		c.mu.Unlock()
		c.afterPost()
		return
	}
	if c.poll() > 0 {
		return
	}
	c.parkStart()
	notified := false
	select {
	case <-c.cq.Notify():
		notified = true
	case <-mine:
	case <-dl.wait():
	case <-c.closing:
	}
	c.unpark()
	if notified && c.poll() > 0 && !start.IsZero() {
		ctx.learn(time.Since(start))
	}
}

// spinners counts the waits of the process that spin now: more of them
// than there are processors to run them (GOMAXPROCS) would only take
// processor time from the goroutines that answer them.
var spinners atomic.Int32

// spinWait polls for up to d, yielding the processor between polls,
// unless as many waits as there are processors spin already: done when
// it found something to act on, or the deadline passed or the connection
// failed; start is when it began (zero if it did not). pollMu is held.
func (c *Conn) spinWait(ctx *waitCtx, dl *deadline, d time.Duration) (start time.Time, done bool) {
	if d <= 0 {
		return start, false
	}
	if spinners.Add(1) > int32(runtime.GOMAXPROCS(0)) {
		spinners.Add(-1)
		return start, false
	}
	defer spinners.Add(-1)
	start = time.Now()
	end := start.Add(d)
	now := start.Sub(parkEpoch)
	for i := 1; ; i++ {
		if i&7 == 0 {
			t := time.Now()
			if !t.Before(end) {
				return start, false
			}
			now = t.Sub(parkEpoch)
		}
		runtime.Gosched()
		if c.poll() > 0 {
			ctx.learn(time.Since(start))
			return start, true
		}
		helpParked(c, now)
		if dl.passed() || c.failed.Load() {
			return start, true
		}
	}
}

// progress notices a peer that is gone, so that a Write that need not
// wait still sees it. The connection ends (ending): it fails once the
// completions of what the peer sent before it went are taken, here if
// no wait polls the CQ now, else by the wait that does, which it wakes.
// (Otherwise it does not poll the completion queue: on tcp0 a poll reads
// the socket, a system call that a Write with room in the ring would pay
// each time.)
func (c *Conn) progress() {
	select {
	case <-c.closing:
		return // the caller reports net.ErrClosed
	case <-c.cmc.Done():
	default:
		return
	}
	c.ending.Store(true)
	if c.pollMu.TryLock() {
		c.poll()
		c.pollMu.Unlock()
	}
	nudge(c.rwake)
	nudge(c.wwake)
}

func nudge(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// poll takes the completions the CQ holds and acts on them, and
// disconnects the connection if they broke it. pollMu is held.
func (c *Conn) poll() int {
	n := c.take()
	c.afterPost()
	return n
}

// take takes the completions the CQ holds and acts on them, waking the
// connection's waits, but leaves the disconnect of a connection they
// broke to the caller: a spinning wait that polls for another
// connection (helpParked) must not pay that connection's disconnect,
// which may last the provider's linger. It returns how many it took (1
// for a CQ that failed). pollMu is held, or the caller is that helper.
func (c *Conn) take() int {
	// Whether the connection was ending before the poll: set after it
	// (progress), it may follow completions the poll did not see yet.
	// Set before, it follows every completion the peer's end left in
	// the CQ (cm's Done closes once the QP is in the error state).
	ending := c.ending.Load()
	n := c.cq.Poll(c.wcs[:])
	if n == 0 {
		if err := c.cq.Err(); err != nil {
			c.mu.Lock()
			c.fail(fmt.Errorf("%w: %w", ErrProtocol, err))
			c.mu.Unlock()
			nudge(c.rwake)
			nudge(c.wwake)
			return 1
		}
		if afterEmptyPoll != nil {
			afterEmptyPoll(c)
		}
		if ending && !c.failed.Load() {
			c.settleEnd()
			return 1
		}
		return 0
	}
	for pending := c.complete(n); pending; {
		// Take what is left before the connection fails.
		k := c.cq.Poll(c.wcs[:])
		if k == 0 {
			c.settleEnd()
			break
		}
		pending = c.complete(k)
		n += k
	}
	return n
}

// afterEmptyPoll, set by tests only, runs in take after a poll found
// the CQ empty: what happens there (the peer's last messages, its end)
// must not cost a Read what the CQ holds.
var afterEmptyPoll func(*Conn)

// settleEnd fails a connection that is ending, once the completions
// before its end are taken, and wakes its waits.
func (c *Conn) settleEnd() {
	c.mu.Lock()
	if c.ending.Load() {
		c.fail(ErrReset)
	}
	c.mu.Unlock()
	nudge(c.rwake)
	nudge(c.wwake)
}

// complete acts on the first n completions of wcs and wakes the
// connection's waits; it does not disconnect a connection they broke
// (afterPost). endPending: the connection is ending and has not failed
// yet (settleEnd). pollMu is held.
func (c *Conn) complete(n int) (endPending bool) {
	c.mu.Lock()
	for i := range c.wcs[:n] {
		c.completeOne(&c.wcs[i])
	}
	c.sendCredits(false)
	endPending = c.ending.Load() && c.err == nil
	c.mu.Unlock()
	nudge(c.rwake)
	nudge(c.wwake)
	return endPending
}

// completeOne acts on one completion. mu is held.
func (c *Conn) completeOne(wc *verbs.WorkCompletion) {
	if wc.Status != verbs.WCSuccess {
		switch wc.Status {
		case verbs.WCWRFlushErr:
			// The QP is in the error state; what the peer delivered
			// before it went may still be in the CQ (a send's flush can
			// come before the receive of its end of stream): the
			// connection fails once those are taken (settleEnd).
			c.ending.Store(true)
		case verbs.WCRetryExcErr, verbs.WCRNRRetryExcErr, verbs.WCRespTimeoutErr, verbs.WCFatalErr, verbs.WCGeneralErr, verbs.WCLocQPOpErr:
			// (The kernel's devices, siw and rxe, complete a send whose
			// transmission failed, the connection or path gone, with a
			// local QP operation error; rsock posts no WR that a QP
			// refuses so otherwise.)
			c.fail(fmt.Errorf("%w (completion status %v)", ErrReset, wc.Status))
		case verbs.WCLocLenErr, verbs.WCLocEECOpErr, verbs.WCLocProtErr, verbs.WCLocAccessErr, verbs.WCMWBindErr:
			if wc.WRID&recvTag == 0 {
				// This side's own work request failed on this side:
				// one of its regions refused it.
				c.fail(fmt.Errorf("%w: this side's work request failed (completion status %v)", ErrAborted, wc.Status))
				break
			}
			// A receive: a message longer than a control message.
			c.fail(fmt.Errorf("%w (completion status %v)", ErrProtocol, wc.Status))
		default:
			// A message longer than a control message, a ring the peer
			// advertised that refuses our writes, ...
			c.fail(fmt.Errorf("%w (completion status %v)", ErrProtocol, wc.Status))
		}
		if wc.WRID&recvTag == 0 {
			slots := min(int(wc.WRID), c.sendsOut)
			c.sendsOut -= slots
			c.retired += uint64(slots)
		}
		return
	}
	if wc.WRID&recvTag == 0 {
		slots := int(wc.WRID)
		if wc.Opcode == verbs.WCRecv || wc.Opcode == verbs.WCRecvRDMAWithImm || slots < 1 || slots > c.sendsOut {
			c.fail(fmt.Errorf("%w: a completion for a send that was not posted", ErrProtocol))
			return
		}
		c.sendsOut -= slots
		c.retired += uint64(slots)
		return
	}
	idx := wc.WRID &^ recvTag
	if idx >= uint64(c.recvs) {
		c.fail(fmt.Errorf("%w: a completion for a receive that was not posted", ErrProtocol))
		return
	}
	var word [ctrlLen]byte
	var m ctrl
	var err error
	buf := c.ctl.Bytes()[int(idx)*c.recvSlot : (int(idx)+1)*c.recvSlot]
	switch {
	case wc.Opcode == verbs.WCRecvRDMAWithImm && wc.Flags&verbs.WCWithImm != 0 && c.acceptImm:
		if wc.ByteLen != 0 && uint64(wc.ByteLen) > c.peerSize {
			err = fmt.Errorf("%w: a write of %d bytes", errCtrl, wc.ByteLen)
			break
		}
		m, err = parseCtrl(ctrlWord(wc.Imm, &word))
	case wc.Opcode == verbs.WCRecv && wc.Flags&verbs.WCWithImm == 0:
		var b, data []byte
		if b, err = verbs.Received(wc, buf); err == nil {
			if m, data, err = parseSend(b, c.acceptInline, &word); err == nil && len(data) > 0 {
				err = c.takeInline(data)
			}
		}
	default:
		err = fmt.Errorf("%w: a completion of kind %v", errCtrl, wc.Opcode)
	}
	if err != nil {
		c.fail(fmt.Errorf("%w: %w", ErrProtocol, err))
		return
	}
	c.postRecv(idx)
	if c.err == nil {
		c.owed++
	}
	c.apply(m)
}

// takeInline copies the bytes of an inline data message into the ring,
// where an RDMA Write would have put them, if they are within the
// credits this side gave (apply then counts them). mu is held.
func (c *Conn) takeInline(data []byte) error {
	size := uint64(len(c.ringBuf))
	n := uint64(len(data))
	if c.rxTail+n > c.rxCredited+size {
		return fmt.Errorf("it sent %d bytes past its credits", c.rxTail+n-c.rxCredited-size)
	}
	off := c.rxTail % size
	k := copy(c.ringBuf[off:], data)
	copy(c.ringBuf, data[k:])
	return nil
}

// apply acts on a control message, after checking that the peer had the
// credit for it. mu is held.
func (c *Conn) apply(m ctrl) {
	if c.err != nil {
		return
	}
	c.credits += m.acks()
	if c.credits > c.peerRecvs {
		c.fail(fmt.Errorf("%w: it acknowledged more receives than it has", ErrProtocol))
		return
	}
	n := uint64(m.count())
	switch m.op() {
	case opData:
		if c.rxFin {
			c.fail(fmt.Errorf("%w: data after the end of its stream", ErrProtocol))
			return
		}
		if c.rxTail+n > c.rxCredited+uint64(len(c.ringBuf)) {
			c.fail(fmt.Errorf("%w: it wrote %d bytes past its credits", ErrProtocol, c.rxTail+n-c.rxCredited-uint64(len(c.ringBuf))))
			return
		}
		c.rxTail += n
	case opCredit:
		if c.txFreed+n > c.txSent {
			c.fail(fmt.Errorf("%w: it freed %d bytes it was not sent", ErrProtocol, c.txFreed+n-c.txSent))
			return
		}
		c.txFreed += n
	case opFin:
		c.rxFin = true
	}
}

// fail marks the connection broken with err, unless it is already; the
// first failure disconnects (afterPost, outside mu). mu is held.
func (c *Conn) fail(err error) {
	if c.err == nil {
		c.err = err
		c.failed.Store(true)
	}
}

// afterPost disconnects a connection that failed. mu is not held.
func (c *Conn) afterPost() {
	if c.failed.Load() {
		c.disconnect.Do(func() { c.cmc.Close() })
		nudge(c.rwake)
		nudge(c.wwake)
	}
}

// sendCredits tells the peer what this side has freed: ring bytes once
// half the ring is consumed and not yet credited, receives once half of
// them are owed (or force). mu is held.
func (c *Conn) sendCredits(force bool) {
	if c.err != nil || c.closed || c.credits < 1 || c.sendsOut+2 > c.sqDepth {
		// (A closed connection reads no more: its last credit is
		// the end of stream's, which carries the acknowledgements.)
		return
	}
	free := c.rxHead - c.rxCredited
	if free >= uint64(len(c.ringBuf))/2 || c.owed >= c.recvs/2 || (force && (free > 0 || c.owed > 0)) {
		c.rxCredited = c.rxHead
		c.postCtrl(opCredit, uint32(free))
	}
}

// chunk is one data message a post carries: n bytes at offset off of
// the peer's ring.
type chunk struct{ off, n uint64 }

// listMax bounds the data messages one post carries: the chunks of a
// window go to the device as one list of work requests, which the
// provider writes with one system call on tcp0, where each would
// otherwise be a post and a write of its own.
const listMax = 8

// planData plans in c.plan the data messages of the next post, for rest
// bytes still to send: chunks of chunkMax, up to the free ring window,
// while a credit is left besides each one's and the send queue holds
// it. It returns how many (0: the Write must wait). mu is held.
func (c *Conn) planData(rest int) int {
	k := 0
	sent, credits, slots := c.txSent, c.credits, c.sendsOut
	per := 1
	if !c.useImm {
		per = 2
	}
	for k < c.maxList && rest > 0 && credits >= 2 && slots+2 <= c.sqDepth {
		window := c.peerSize - (sent - c.txFreed)
		if window == 0 {
			break
		}
		off := sent % c.peerSize
		n := min(window, uint64(rest), c.peerSize-off, c.chunkMax())
		c.plan[k] = chunk{off, n}
		k++
		sent += n
		rest -= int(n)
		credits--
		slots += per
	}
	return k
}

// queueData queues the work requests that send the n bytes of src to
// offset off of the peer's ring with their data message, signaled if
// signal; flush posts them. mu is held; the caller checked the credits.
func (c *Conn) queueData(src verbs.SGE, off, n uint64, signal bool) {
	acks := c.takeAcks()
	w := makeCtrl(opData, acks, uint32(n))
	i := c.nwr
	c.sge[i] = src
	if c.useImm {
		c.swr[i] = verbs.SendWR{Opcode: verbs.OpRDMAWriteWithImm, SGList: c.sge[i : i+1],
			Imm: w, RemoteAddr: c.peerAddr + off, RKey: c.peerKey}
		c.queue(1, signal)
	} else {
		c.swr[i] = verbs.SendWR{Opcode: verbs.OpRDMAWrite, SGList: c.sge[i : i+1], RemoteAddr: c.peerAddr + off, RKey: c.peerKey}
		c.swr[i+1] = c.sendWR(w, nil, i+1)
		c.queue(2, signal)
	}
	c.txSent += n
}

// postCtrl sends a control message without data. mu is held; the caller
// checked the credit.
func (c *Conn) postCtrl(op uint8, count uint32) {
	w := makeCtrl(op, c.takeAcks(), count)
	if c.useImm {
		c.swr[0] = verbs.SendWR{Opcode: verbs.OpRDMAWriteWithImm, Imm: w, RemoteAddr: c.peerAddr, RKey: c.peerKey}
	} else {
		c.swr[0] = c.sendWR(w, nil, 0)
	}
	// The end of the stream is signaled, so that Close can wait for
	// every send before it.
	c.queue(1, op == opFin)
	c.flush()
}

// sendWR is the inline Send of control word w followed by data, work
// request i of the next post, its SGE sge[i]. The Sends of one post each have
// their control word in a slot of the send buffer of their own; one with
// data is posted alone.
func (c *Conn) sendWR(w uint32, data []byte, i int) verbs.SendWR {
	var b [ctrlLen]byte
	ctrlWord(w, &b)
	at := c.nctl * ctrlLen
	c.nctl++
	copy(c.sendBuf[at:], b[:])
	copy(c.sendBuf[at+ctrlLen:], data)
	c.sge[i] = c.ctl.SGE(c.recvs*c.recvSlot+at, ctrlLen+len(data))
	return verbs.SendWR{Opcode: verbs.OpSend, SGList: c.sge[i : i+1], Flags: verbs.SendInline}
}

// postInline sends data, at most inlineMax bytes, inside the Send of
// its data message, and reports whether the device took it. mu is held;
// the caller checked the credits.
func (c *Conn) postInline(data []byte) bool {
	c.swr[0] = c.sendWR(makeCtrl(opData, c.takeAcks(), uint32(len(data))), data, 0)
	c.queue(1, false)
	c.txSent += uint64(len(data))
	return c.flush() == 1
}

func (c *Conn) takeAcks() int {
	a := min(c.owed, maxAcks)
	c.owed -= a
	c.credits--
	return a
}

// signalEvery is how many send queue slots may be posted unsignaled
// before one work request is signaled, which retires them all. Each
// signaled work request costs a completion and, on iWARP, where a Send
// or RDMA Write completes only once the peer confirms it, a zero-length
// Read and its response; a send queue of sqDepth holds two rounds of
// signalEvery slots and the slots of a data message, so a Write need
// not wait for a completion while the previous round's is on its way.
const signalEvery = 32

// queue adds the n work requests of a message, from swr[c.nwr], to the
// next post, signaling the last if signal or if signalEvery slots have
// gone unsignaled; a signaled work request's ID is the number of slots
// its completion retires. mu is held.
func (c *Conn) queue(n int, signal bool) {
	c.unsignaled += n
	c.nwr += n
	if signal || c.unsignaled >= signalEvery {
		c.swr[c.nwr-1].Flags |= verbs.SendSignaled
		c.swr[c.nwr-1].WRID = uint64(c.unsignaled)
		c.unsignaled = 0
	}
	c.sendsOut += n
	c.posted += uint64(n)
}

// flush posts the work requests queued and returns how many the device
// took: all of them, unless it refused one, which breaks the connection.
// mu is held.
func (c *Conn) flush() int {
	n := c.nwr
	c.nwr, c.nctl = 0, 0
	if n == 0 {
		return 0
	}
	took, err := c.qp.PostSend(c.swr[:n])
	if err != nil {
		c.fail(aborted("post a send", err))
	}
	clear(c.swr[:n])
	return took
}

// flushData posts the k data messages queued, the first k chunks of
// plan, and returns how many bytes they carry that the device took: the
// bytes of the messages it took whole (a Write returns no more than it
// sent when the device refused the rest of the list). mu is held.
func (c *Conn) flushData(k int) int {
	per := 2
	if c.useImm {
		per = 1
	}
	took := c.flush() / per
	n := 0
	for _, ch := range c.plan[:min(k, took)] {
		n += int(ch.n)
	}
	return n
}

// postRecv posts receive idx. mu is held.
func (c *Conn) postRecv(idx uint64) {
	c.rsge[0] = c.ctl.SGE(int(idx)*c.recvSlot, c.recvSlot)
	c.rwr[0] = verbs.RecvWR{WRID: recvTag | idx, SGList: c.rsge[:]}
	if _, err := c.qp.PostRecv(c.rwr[:]); err != nil {
		c.fail(aborted("post a receive", err))
	}
}

// aborted is the error of a connection that this side dropped because
// its device refused op with err: ErrAborted, wrapping err. (A QP the
// peer's end moved to the error state still takes work requests, which
// complete flushed: a refusal is this side's own failure.)
func aborted(op string, err error) error {
	return fmt.Errorf("%w: the device refused to %s: %w", ErrAborted, op, err)
}
