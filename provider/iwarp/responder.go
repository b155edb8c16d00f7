package iwarp

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/internal/atomicrel"
	"github.com/goverbs/goverbs/provider/iwarp/wire"
	"github.com/goverbs/goverbs/verbs/driver"
)

// The receiver reads every FPDU, checks its headers, and places its
// payload in the memory it targets: the registered region of a Write
// (after checking STag, bounds and rights), the receive buffer a Send
// consumes, the local buffers of the Read a Read Response answers.
// CRC32c is computed over what was placed. A
// malformed or forbidden FPDU ends the stream with a Terminate: the QP
// moves to the error state and nothing more is placed.
//
// Receiving is a resumable state machine over a non-blocking socket, run
// by whoever holds rxMu: the connection's receive goroutine, which waits
// for the socket to become readable, or an application goroutine polling
// one of the QP's CQs (cq.Poll), which reads what has arrived without
// waiting. A busy-polling application thus takes its completions from
// the socket itself, with no goroutine switch on the way (the progress
// model of UCX and libfabric), and one that waits relies on the
// goroutine.
//
// A receiver that needs the next FPDU's headers reads what has arrived,
// up to stageLen bytes, into the stage, and takes FPDUs from there for as
// long as it holds them whole; the payload of an FPDU that runs past the
// stage is read straight from the socket into its target (one readv with
// the trailer). So a small message takes one read system call, as in a
// plain TCP ping-pong, and its payload is copied once from the stage —
// as many copies as a peek at its headers followed by a read into its
// target would make — while the bulk of a large one is never staged.

// stageLen is the most a receiver reads before it knows where the bytes
// go: the headers of the next FPDUs and small payloads.
const stageLen = 512

// rxState is the receiver's state; only the holder of rxMu touches it.
type rxState struct {
	// dstMR[:ndstMR]: the regions rx.dst lies in, whose revocation
	// (Dereg, invalidation) stops placement (dstRevoked).
	dstMR  [maxSGE]*mr
	ndstMR int
	// hdr holds the headers of the FPDU being handled (and a
	// Terminate's copy of the terminated headers).
	hdr [wire.MaxHeaderLen + wire.TerminateMaxLen]byte
	// The stage: stage[sOff:sEnd] is read and not yet taken; drained:
	// a read in this round found the socket empty (it read less than it
	// could), so the round ends instead of reading again.
	stage      [stageLen]byte
	stageIov   [1]unix.Iovec // need's read into the stage (not on need's stack, which sockIO, a variable, would move to the heap)
	sOff, sEnd int
	drained    bool
	// The FPDU whose headers were taken: its header, payload and
	// trailer lengths, and, while planned, the rest of it to read
	// straight: iovecs for one readv (want bytes in all, got of them
	// read), mirrored as slices.
	hlen, plen, tlen int
	planned          bool
	iov              [maxSGE + 3]unix.Iovec // and the stage, to read ahead
	segs             [maxSGE + 2][]byte
	nseg             int
	at               int // the segment the next read starts in
	atOff            int // bytes of it already read
	want             int
	got              int
	trailer          [3 + wire.CRCLen]byte
	// Where its payload goes (rxBegin): dst from offset skip; discard:
	// it is dropped (into drainBuf).
	dst      [maxSGE + 1][]byte
	ndst     int
	skip     uint64
	discard  bool
	drainBuf []byte // lazily: payload that is read and dropped

	msn [wire.NumQN]uint32 // the next MSN expected, per queue

	// The Send message being placed.
	send struct {
		active bool
		recv   rwqe
		segs   [maxSGE][]byte
		mrs    [maxSGE]*mr // the regions of segs
		nseg   int
		room   uint64
		placed uint64
	}
	// The immediate lent to the next Send (a Send with immediate).
	immNext    bool
	immNextVal uint32
	// Writes: the length of the Write message in progress, and of the
	// last one completed (the length a Write with immediate reports).
	writeLen     uint64
	lastWriteLen uint64
	// The Read Response being placed.
	resp struct {
		active   bool
		segs     [maxSGE][]byte
		nseg     int
		mrs      [maxSGE]*mr // the regions of segs
		nmr      int
		size     uint32
		placed   uint32
		sinkSTag uint32
		sinkTO   uint64
		// dropped: bytes of an answer to a zero-length Read dropped so
		// far (see oversizedAnswerMax).
		dropped uint64
	}
	// held: a receive completion waits in q.rxHeld for the next FPDU.
	held bool
	// nextRead: the next FPDU, already staged, is a Read Request.
	nextRead bool
	// owe: the round queued responses or freed request slots, which the
	// transmitter should send now; lazy: it queued answers to zero-length
	// Reads, which may wait a little (see rxTry).
	owe, lazy bool
	// err ends receiving: every round returns it at once.
	err error
}

// termError is a protocol error found in the stream: what the Terminate
// reports, and whether to copy the offending headers into it.
type termError struct {
	layer   wire.Layer
	etype   uint8
	ecode   uint8
	copyHdr bool
	event   driver.EventType
	what    string
}

func (e *termError) Error() string { return e.what }

func protoErr(layer wire.Layer, etype, ecode uint8, ev driver.EventType, format string, args ...any) *termError {
	return &termError{layer: layer, etype: etype, ecode: ecode, copyHdr: true, event: ev, what: fmt.Sprintf(format, args...)}
}

// truncated turns the end of the stream inside an FPDU into the error a
// Terminate reports; other errors (a reset, a closed socket) end the
// stream without one.
func truncated(err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return &termError{layer: wire.LayerLLP, etype: wire.LLPMPAError, ecode: wire.LLPConnectionLost,
			copyHdr: true, event: driver.EventQPFatal, what: "the stream ended inside an FPDU"}
	}
	return err
}

// creditOrderlyEnd takes the Sends and Writes sent on a stream that a
// peer other than goverbs ended in order (a FIN between FPDUs, no
// Terminate) for placed, when its TCP has acknowledged every byte of
// them: Linux siw drops the Read Responses it still owes when its
// application disconnects, so a peer that disconnects as soon as it has
// received (librdmacm's cmatose server and rdma_client do) leaves the
// Read that confirms them unanswered, though siw places what arrives as
// it arrives and would have sent a Terminate for what it could not
// place. Nothing is credited while a message is partly written.
func (c *conn) creditOrderlyEnd() {
	if !c.txMu.TryLock() {
		return // the transmitter is writing: not all of it is out
	}
	defer c.txMu.Unlock()
	q := c.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.c != c || len(c.tb.bufs) > 0 || q.req.cur.active {
		return
	}
	if n, ok := c.sk.unacked(); !ok || n != 0 {
		return
	}
	q.req.creditSent()
}

// errPeerTerminated ends the stream after a Terminate from the peer.
var errPeerTerminated = errors.New("the peer terminated the stream")

// rxLoop is the receive goroutine: it receives whenever the socket is
// readable and no poller is receiving, until the stream ends.
func (c *conn) rxLoop() {
	defer c.wg.Done()
	defer c.running.Add(-1)
	defer c.finish()
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
	c.rxMu.Lock()
	c.sk.release()
	c.rxMu.Unlock()
}

// pollGrace is how long the receive goroutine stays off the socket
// after it has seen an application poll: while one polls, the goroutine
// waking at every FPDU would only take processor time from it (two
// busy-polling processes fill a two-core machine) and contend for the
// socket. An application that goes to sleep on the CQ (ReqNotify) hands
// receiving back at once. (A variable for tests: SetPollGrace.)
var pollGrace = time.Millisecond

// rxSpin is how long the receive goroutine keeps reading after it last
// found an FPDU, before it waits for the socket: a responder serving a
// stream of requests (RDMA Reads of a passive peer, say) then answers
// each without the thread wake-up that waiting costs, which is several
// times the work of the request itself; the price is a processor kept
// busy while requests come closer together than rxSpin.
const rxSpin = 50 * time.Microsecond

// rxRun receives until the stream ends, and returns why.
func (c *conn) rxRun() error {
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	seenPolls, seenArms := c.polls.Load(), c.arms.Load()
	var spinUntil time.Time
	for {
		if c.rxStopped.Load() {
			// A disconnect stopped receiving: wait for its abort.
			for !c.aborted.Load() {
				<-c.rxWake
			}
			return net.ErrClosed
		}
		frames := c.rxFrames.Load()
		if err := c.rxTry(false); err != nil {
			return err
		}
		if c.rxFrames.Load() != frames {
			spinUntil = time.Now().Add(rxSpin)
		}
		// An application polls if it has polled since the last look
		// and not armed a CQ to sleep on since.
		polls, arms := c.polls.Load(), c.arms.Load()
		if polls != seenPolls && arms == seenArms {
			seenPolls = polls
			c.stayOff(t, &seenPolls, seenArms)
			continue
		}
		seenPolls, seenArms = polls, arms
		if !spinUntil.IsZero() {
			if time.Now().Before(spinUntil) {
				runtime.Gosched()
				continue
			}
			spinUntil = time.Time{}
		}
		err := c.sk.waitIn()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				// A poller kicked the goroutine (kickRx).
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
	wait := pollGrace
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
		wait = max(pollGrace-time.Duration(monotime()-int64(c.polledAt.Load())), pollGrace/4)
	}
}

// kickRx makes the receive goroutine run a round, for a poller that
// found the stream ended.
func (c *conn) kickRx() {
	c.sk.kick()
	c.wakeRx()
}

// wakeRx ends the receive goroutine's stay off the socket (pollGrace),
// for an application about to sleep on a CQ.
func (c *conn) wakeRx() {
	select {
	case c.rxWake <- struct{}{}:
	default:
	}
}

// rxTry receives what has arrived. A poller does not wait for someone
// else who is receiving: that one is told to look again before it stops,
// so that nothing that arrived is left unread. It returns the error that
// ended receiving.
//
// The responses the round queued go out at once, except the answers to
// zero-length Reads (the confirmations a peer asks for behind its Sends
// and Writes) when a poller received them, or when the receive
// goroutine's round woke the application (a completion of the QP fired
// an armed CQ's notification): an application that polls,
// or has just been woken, usually posts soon, and its next batch carries
// them at no extra system call; pollRx and a timer send them anyway
// once lazyAge has passed, and so does an application that goes to
// sleep on a CQ (ReqNotify).
func (c *conn) rxTry(poller bool) error {
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
		// Whether the receive goroutine's round woke the application
		// with a completion of this QP (and the stream goes on, so
		// that the application can still post). Writing the answers
		// itself cost a one-process Send/Recv ping-pong in CQ.Wait an
		// extra writev per message and 15-20% of its latency.
		woke := !poller && err == nil && c.q.wakes.Load() != wakes
		c.rxMu.Unlock()
		switch {
		case owe || (lazy && !poller && !woke):
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
			}
			return nil
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
func (c *conn) pollRx() {
	// A load and a release store, not a locked addition: two pollers at
	// once may count one round, and the receive goroutine still sees
	// the count move (rxRun).
	polls := c.polls.Load() + 1
	atomicrel.StoreUint64(&c.polls, polls)
	if err := c.rxTry(true); err != nil && !c.rxEnded.Load() {
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
// application's next post (rxTry), for an application about to sleep.
func (c *conn) flushLazy() {
	if c.lazyAt.Load() != 0 {
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

// sysRead is one non-blocking read system call into iov on the
// connection's own descriptor: the number of bytes read, or 0 and false
// when nothing has arrived. A descriptor of c's, never the net package's,
// so that a poller can read while the receive goroutine waits in the
// runtime's poller; abort waits for the call in progress (rxBusy).
func (c *conn) sysRead(iov []unix.Iovec) (int, bool, error) {
	c.rxBusy.Add(1)
	defer c.rxBusy.Add(-1)
	// An abort comes first, as in place: a revoked destination is a
	// protocol error, which an ended connection no longer reports.
	if c.aborted.Load() {
		return 0, false, net.ErrClosed
	}
	if c.rx.dstRevoked() {
		return 0, false, c.rx.revokedErr()
	}
	return c.stageRead(iov)
}

// stageRead is sysRead into the stage alone, the connection's own
// memory: it needs no announcement (rxBusy), which is two locked
// instructions of every empty poll. The descriptor stays open meanwhile:
// the receive goroutine releases it under rxMu, which the caller holds.
func (c *conn) stageRead(iov []unix.Iovec) (int, bool, error) {
	if c.aborted.Load() {
		return 0, false, net.ErrClosed
	}
	for {
		n, e := sockIO(unix.SYS_READV, uintptr(c.sk.fd), iov)
		switch e {
		case 0:
			if n == 0 {
				return 0, true, io.EOF
			}
			if raceEnabled {
				raceAcquire(c.sk.fd)
			}
			return int(n), true, nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return 0, false, nil
		}
		c.noteErr(e)
		return 0, false, e
	}
}

// raceAcquire gives the race detector the edge from the peer's socket
// writes (see raceRelease) to what follows this read: a read(2) of
// nothing through the syscall package, which the runtime annotates.
func raceAcquire(fd int) { syscall.Read(fd, nil) }

// need makes sure that k bytes are staged, reading what has arrived into
// the stage: false when they have not arrived (or the round already found
// the socket drained). The end of the stream between FPDUs is io.EOF.
func (c *conn) need(k int) (bool, error) {
	rx := &c.rx
	for rx.sEnd-rx.sOff < k {
		if rx.drained {
			return false, nil
		}
		if rx.sOff > 0 {
			rx.sEnd = copy(rx.stage[:], rx.stage[rx.sOff:rx.sEnd])
			rx.sOff = 0
		}
		room := len(rx.stage) - rx.sEnd
		iov := rx.stageIov[:]
		iov[0].Base = &rx.stage[rx.sEnd]
		iov[0].SetLen(room)
		n, ok, err := c.stageRead(iov)
		if err != nil {
			if err == io.EOF && rx.sEnd == 0 {
				return false, err
			}
			return false, truncated(err)
		}
		if !ok {
			rx.drained = true
			return false, nil
		}
		rx.sEnd += n
		rx.drained = n < room
	}
	return true, nil
}

// rxNext takes the next FPDU's headers from the stage and places what
// of it is staged; the rest is planned (rxRead) or, when all of it was
// staged, the FPDU completes. idle: its headers have not all arrived.
func (c *conn) rxNext() (idle bool, err error) {
	rx := &c.rx
	if ok, err := c.need(wire.MinHeaderLen); !ok {
		return err == nil, err
	}
	hl, err := wire.ValidateHdr(rx.stage[rx.sOff:rx.sEnd], c.ext)
	if err != nil {
		if !c.gate.Load() {
			// A malformed first FPDU is the first FPDU all the same:
			// the Terminate for it may go out.
			c.openGate()
		}
		copy(rx.hdr[:], rx.stage[rx.sOff:rx.sEnd])
		var he *wire.HeaderError
		errors.As(err, &he)
		return false, &termError{layer: he.Layer, etype: he.EType, ecode: he.ECode, copyHdr: he.Layer != wire.LayerLLP,
			event: driver.EventQPReqErr, what: he.What}
	}
	if ok, err := c.need(hl); !ok {
		if err == io.EOF {
			err = truncated(err)
		}
		return err == nil, err
	}
	copy(rx.hdr[:hl], rx.stage[rx.sOff:])
	rx.sOff += hl
	h := wire.Hdr(rx.hdr[:hl])
	if !c.heard.Load() {
		c.heard.Store(true)
	}
	if !c.gate.Load() {
		if err := c.firstFPDU(h); err != nil {
			return false, err
		}
	}
	rx.hlen, rx.plen, rx.tlen = hl, h.PayloadLen(), wire.Pad(h.ULPDULen())+wire.CRCLen
	if done, err := c.rxStagedSend(h); done || err != nil {
		return false, err
	}
	if err := c.rxBegin(h); err != nil {
		return false, err
	}
	// What is staged of the payload and trailer is copied out; the rest
	// is read straight into place.
	k := min(rx.plen, rx.sEnd-rx.sOff)
	if err := c.place(rx.stage[rx.sOff : rx.sOff+k]); err != nil {
		return false, err
	}
	rx.sOff += k
	rx.nseg, rx.at, rx.atOff, rx.got, rx.want = 0, 0, 0, 0, 0
	t := 0
	if k < rx.plen {
		rx.planDst(uint64(k), rx.plen-k)
	} else {
		t = copy(rx.trailer[:rx.tlen], rx.stage[rx.sOff:rx.sEnd])
		rx.sOff += t
	}
	if t < rx.tlen {
		rx.addSeg(rx.trailer[t:rx.tlen])
	}
	if rx.nseg > 0 {
		// What follows the FPDU, up to a stage's worth, comes with the
		// same readv (the stage is empty: the FPDU ran past it).
		rx.sOff, rx.sEnd = 0, 0
		rx.iov[rx.nseg].Base = &rx.stage[0]
		rx.iov[rx.nseg].SetLen(len(rx.stage))
		rx.planned = true
		return false, nil
	}
	return false, c.rxComplete()
}

// place copies the first bytes of the payload, staged, into its target,
// unless the connection was aborted: abort waits for a copy in progress
// (rxBusy), as for a read, so nothing is placed once it returns.
func (c *conn) place(b []byte) error {
	rx := &c.rx
	return c.placeInto(rx.dst[:rx.ndst], rx.dstMR[:rx.ndstMR], rx.skip, b)
}

// placeInto is place into dst from byte skip on, dst lying in the
// regions mrs, none of which may have been revoked.
func (c *conn) placeInto(dst [][]byte, mrs []*mr, skip uint64, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	c.rxBusy.Add(1)
	defer c.rxBusy.Add(-1)
	if c.aborted.Load() {
		return net.ErrClosed
	}
	if anyRevoked(mrs) {
		return c.rx.revokedErr()
	}
	copyInto(dst, skip, b)
	return nil
}

// rxStagedSend handles, as rxBegin, place and rxComplete would, a Send
// message of one FPDU (headers h, taken from the stage) whose payload and
// trailer are staged too: the common small message. It takes the
// receive, places the payload and completes the receive under one hold of
// q.mu, where that road takes it twice. done is false, with nothing
// done, for any other FPDU, or one whose CRC is wrong (the long road
// reports it); err is the error that ends receiving.
func (c *conn) rxStagedSend(h wire.Hdr) (done bool, err error) {
	rx := &c.rx
	if op := h.Opcode(); (op != wire.OpSend && op != wire.OpSendSE) || !h.Last() || h.MO() != 0 ||
		rx.send.active || rx.held || h.QN() != wire.QNSend || h.MSN() != rx.msn[wire.QNSend] ||
		rx.sEnd-rx.sOff < rx.plen+rx.tlen {
		return false, nil
	}
	payload := rx.stage[rx.sOff : rx.sOff+rx.plen]
	trailer := rx.stage[rx.sOff+rx.plen : rx.sOff+rx.plen+rx.tlen]
	if c.crc && checkTrailer(crc32.Update(crc32.Update(0, wire.Castagnoli, h), wire.Castagnoli, payload), trailer) != nil {
		return false, nil
	}
	q := c.q
	q.mu.Lock()
	err = c.takeRecvLocked()
	if err == nil && uint64(rx.plen) > rx.send.room {
		err = c.sendTooLong(rx.plen)
		c.completeSendLocked(driver.WorkCompletion{Status: driver.WCLocLenErr, Opcode: driver.WCRecv})
	}
	if err == nil {
		clear(rx.dstMR[:rx.ndstMR]) // the last FPDU's, as rxBegin clears them
		rx.ndstMR = 0
		s := &rx.send
		err = c.placeInto(s.segs[:s.nseg], s.mrs[:s.nseg], 0, payload)
	}
	if err == nil {
		rx.sOff += rx.plen + rx.tlen
		rx.send.placed = uint64(rx.plen)
		rx.lookAhead()
		c.rxCounted(h)
		c.completeSendLocked(c.sendDone(h))
	}
	q.mu.Unlock()
	return true, err
}

// dstRevoked reports whether a region the payload goes to has been
// deregistered or invalidated since the FPDU began: nothing more may be
// placed there. Called between rxBusy's increment and the placement
// (see Dereg).
func (rx *rxState) dstRevoked() bool { return anyRevoked(rx.dstMR[:rx.ndstMR]) }

// anyRevoked reports whether a region of mrs has been revoked.
func anyRevoked(mrs []*mr) bool {
	for _, m := range mrs {
		if m.revoked.Load() {
			return true
		}
	}
	return false
}

// revokedErr ends the stream when a region being placed into was
// deregistered or invalidated under the placement.
func (rx *rxState) revokedErr() error {
	return protoErr(wire.LayerDDP, wire.DDPTaggedError, wire.DDPInvalidSTag, driver.EventQPAccessErr,
		"a region the payload of the FPDU being received goes to was deregistered or invalidated while it was placed")
}

// dstSeg returns destination segment i from offset off within it (nil
// when off is past its end).
func (rx *rxState) dstSeg(i int, off uint64) []byte {
	s := rx.dst[i]
	if off >= uint64(len(s)) {
		return nil
	}
	return s[off:]
}

// copyInto copies b into the segments dst from byte off of them on.
// Under the race detector the copy is out of its sight, as the readv
// that places the rest of a payload is: an application may poll memory
// that a peer's RDMA Write is landing in (perftest's write_lat, a credit
// word), which RDMA allows.
func copyInto(dst [][]byte, off uint64, b []byte) {
	for _, s := range dst {
		if len(b) == 0 {
			return
		}
		if off >= uint64(len(s)) {
			off -= uint64(len(s))
			continue
		}
		s = s[off:]
		off = 0
		n := min(len(s), len(b))
		if raceEnabled {
			copyUnwatched(s, b)
		} else {
			copy(s, b)
		}
		b = b[n:]
	}
}

// planDst adds n bytes of the payload destination, from payload offset
// off, to the plan.
func (rx *rxState) planDst(off uint64, n int) {
	off += rx.skip
	for i := 0; i < rx.ndst && n > 0; i++ {
		s := rx.dstSeg(i, off)
		off -= min(off, uint64(len(rx.dst[i])))
		s = s[:min(len(s), n)]
		rx.addSeg(s)
		n -= len(s)
	}
}

// addSeg appends s to the plan.
func (rx *rxState) addSeg(s []byte) {
	if len(s) == 0 {
		return
	}
	rx.segs[rx.nseg] = s
	rx.iov[rx.nseg].Base = &s[0]
	rx.iov[rx.nseg].SetLen(len(s))
	rx.nseg++
	rx.want += len(s)
}

// rxRead reads the planned bytes, as far as they have arrived: done when
// all have. The read that completes them may bring the start of what
// follows into the stage.
func (c *conn) rxRead() (done bool, err error) {
	rx := &c.rx
	for rx.got < rx.want {
		if rx.atOff > 0 {
			s := rx.segs[rx.at][rx.atOff:]
			rx.iov[rx.at].Base = &s[0]
			rx.iov[rx.at].SetLen(len(s))
		}
		n, ok, err := c.sysRead(rx.iov[rx.at : rx.nseg+1])
		if err != nil {
			return false, truncated(err)
		}
		if !ok {
			rx.drained = true
			return false, nil
		}
		if ahead := rx.got + n - rx.want; ahead > 0 {
			rx.sEnd = ahead
			n -= ahead
			rx.drained = ahead < len(rx.stage)
		} else {
			rx.drained = false
		}
		rx.got += n
		for n > 0 {
			left := len(rx.segs[rx.at]) - rx.atOff
			if n < left {
				rx.atOff += n
				break
			}
			n -= left
			rx.at++
			rx.atOff = 0
		}
	}
	return true, nil
}

// rxComplete completes the FPDU whose headers rxNext took, all of it
// placed: its CRC is checked, then what it does is done.
func (c *conn) rxComplete() error {
	rx := &c.rx
	h := wire.Hdr(rx.hdr[:rx.hlen])
	err := c.rxCheckCRC(h)
	for i := range rx.nseg {
		rx.segs[i], rx.iov[i] = nil, unix.Iovec{}
	}
	rx.iov[rx.nseg] = unix.Iovec{}
	rx.nseg = 0
	clear(rx.dst[:rx.ndst])
	if err != nil {
		return err
	}
	rx.lookAhead()
	return c.rxEndFrame(h)
}

// lookAhead sees whether the next FPDU is a Read Request staged whole
// (nextRead), which this round handles: a receive completion is held
// back only for such a one, since a peer that sent part of one and
// stalls would otherwise keep a received Send from completing.
func (rx *rxState) lookAhead() {
	next := wire.Hdr(rx.stage[rx.sOff:rx.sEnd])
	rx.nextRead = len(next) >= readRequestFPDU && !next.Tagged() && next.Opcode() == wire.OpReadRequest
}

// readRequestFPDU is the length of an FPDU carrying a Read Request.
var readRequestFPDU = wire.FPDULen(wire.HeaderLen(wire.OpReadRequest) - wire.LenFieldLen)

// rxCheckCRC checks the MPA CRC of the FPDU with headers h, its payload
// in place and its trailer in rx.trailer, when CRCs are in use.
func (c *conn) rxCheckCRC(h wire.Hdr) error {
	if !c.crc {
		return nil
	}
	rx := &c.rx
	crc := crc32.Update(0, wire.Castagnoli, h)
	off, n := rx.skip, rx.plen
	for i := 0; i < rx.ndst && n > 0; i++ {
		s := rx.dstSeg(i, off)
		off -= min(off, uint64(len(rx.dst[i])))
		s = s[:min(len(s), n)]
		crc = crc32.Update(crc, wire.Castagnoli, s)
		n -= len(s)
	}
	return checkTrailer(crc, rx.trailer[:rx.tlen])
}

// checkTrailer checks the trailer t (pad and CRC) of an FPDU whose CRC
// over its headers and payload is crc.
func checkTrailer(crc uint32, t []byte) error {
	crc = crc32.Update(crc, wire.Castagnoli, t[:len(t)-wire.CRCLen])
	if got := wire.CRC(t[len(t)-wire.CRCLen:]); got != crc {
		return &termError{layer: wire.LayerLLP, etype: wire.LLPMPAError, ecode: wire.LLPCRCError, copyHdr: false,
			event: driver.EventQPFatal, what: fmt.Sprintf("MPA CRC %#08x, computed %#08x", got, crc)}
	}
	return nil
}

// rxEndFrame completes the FPDU with headers h once all of it is read,
// with the held receive completion released after it.
func (c *conn) rxEndFrame(h wire.Hdr) error {
	rx := &c.rx
	c.rxCounted(h)
	held := rx.held
	rx.held = false
	err := c.rxEnd(h)
	if held {
		c.releaseRecv()
	}
	return err
}

// rxCounted counts the FPDU with headers h as received.
func (c *conn) rxCounted(h wire.Hdr) {
	// One writer (under rxMu): release stores, not locked additions.
	atomicrel.StoreUint64(&c.rxFrames, c.rxFrames.Load()+1)
	atomicrel.StoreUint64(&c.rxBytes, c.rxBytes.Load()+uint64(h.PayloadLen()))
	switch op := h.Opcode(); op {
	case wire.OpReadResponse, wire.OpAtomicResponse:
		atomicrel.StoreUint64(&c.rxAnswers, c.rxAnswers.Load()+1)
	case wire.OpWrite, wire.OpSend, wire.OpSendInv, wire.OpSendSE, wire.OpSendSEInv:
		if mid := !h.Last(); mid != c.peerMid.Load() {
			c.peerMid.Store(mid)
		}
	}
}

// protocolError ends the stream after an error the receiver found: the
// QP fails, the Terminate goes out after the responses already queued,
// and the receiver drains the socket until the peer closes (so that the
// Terminate is not lost to a reset), for a bounded time.
func (c *conn) protocolError(te *termError) {
	q := c.q
	q.mu.Lock()
	if q.c != c || q.destroyed {
		q.mu.Unlock()
		return
	}
	var hdr wire.Hdr
	if te.copyHdr {
		hdr = wire.Hdr(c.rx.hdr[:])
	}
	c.terminate(te.layer, te.etype, te.ecode, hdr)
	if q.attr.State != driver.QPSErr {
		q.ctx.Event(te.event, q.userCtx)
		q.toErr()
	}
	q.mu.Unlock()
	deadline := time.Now().Add(terminateTimeout)
	var drain [4096]byte
	// The deadline holds even for a peer that keeps the socket full.
	for time.Now().Before(deadline) {
		n, err := c.sk.read(drain[:])
		if err == unix.EAGAIN || err == unix.EINTR {
			err = c.sk.waitInUntil(deadline)
			if errors.Is(err, os.ErrDeadlineExceeded) && time.Now().Before(deadline) {
				err = nil // a poller's kick (kickRx)
			}
		} else if err == nil && n == 0 {
			break
		}
		if err != nil {
			break
		}
	}
	// The peer may have closed its side before the Terminate went out:
	// give the transmitter the rest of the time to send it.
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-c.txDone:
	case <-t.C:
	}
}

// rxBegin checks the headers h of the FPDU about to be read, does what
// must precede its payload, and sets where the payload goes (rx.dst,
// skipping rx.skip bytes; payload beyond them is dropped).
func (c *conn) rxBegin(h wire.Hdr) error {
	rx := &c.rx
	rx.ndst, rx.skip, rx.discard = 0, 0, false
	clear(rx.dstMR[:rx.ndstMR])
	rx.ndstMR = 0
	n := h.PayloadLen()
	var err error
	switch h.Opcode() {
	case wire.OpWrite:
		err = c.rxWriteBegin(h)
	case wire.OpReadResponse:
		err = c.rxReadResponseBegin(h)
	case wire.OpSend, wire.OpSendInv, wire.OpSendSE, wire.OpSendSEInv:
		err = c.rxSendBegin(h)
	case wire.OpTerminate:
		rx.dst[0] = rx.hdr[wire.TerminateLen : wire.TerminateLen+terminateKept(h)]
		rx.ndst = 1
	case wire.OpReadRequest:
		err = c.soleSegmentCheck(h, wire.QNRead)
		if err == nil && n != 0 {
			err = protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPInvalidMO, driver.EventQPReqErr,
				"a Read Request with %d bytes of payload", n)
		}
	case wire.OpImmData, wire.OpImmDataSE:
		err = c.soleSegmentCheck(h, wire.QNSend)
		if err == nil && (n != 0 || rx.send.active || rx.immNext) {
			err = protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPInvalidMO, driver.EventQPReqErr,
				"Immediate Data inside another message")
		}
	case wire.OpAtomicRequest, wire.OpAtomicResponse:
		err = c.soleSegmentCheck(h, wire.QNAtomic)
		if err == nil && n != 0 {
			err = protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPInvalidMO, driver.EventQPReqErr,
				"%v with %d bytes of payload", h.Opcode(), n)
		}
	}
	if err != nil {
		return err
	}
	// What the destinations do not take (all of it when discarding) is
	// read into the drain and dropped.
	room := uint64(0)
	for _, s := range rx.dst[:rx.ndst] {
		room += uint64(len(s))
	}
	if rx.discard || room <= rx.skip {
		clear(rx.dst[:rx.ndst])
		rx.ndst, rx.skip, room = 0, 0, 0
	} else {
		room -= rx.skip
	}
	n = h.PayloadLen() - int(min(uint64(h.PayloadLen()), room))
	if n > 0 {
		// Payload nobody takes: read into the drain and dropped.
		if rx.drainBuf == nil {
			rx.drainBuf = make([]byte, 1<<16)
		}
		rx.dst[rx.ndst] = rx.drainBuf[:n]
		rx.ndst++
	}
	return nil
}

// siwTerminate rewrites in t the control word of a Terminate that Linux
// siw sent into the layout of RFC 5040. siw (6.1) builds the word with C
// bitfields that, on a little-endian machine, put the Layer in the low
// half of the first byte and the Error Type in the high half (RFC 5040:
// the other way round), and the M, D and R flags in the three low bits of
// the third byte, where RFC 5040 has reserved bits, rather than the three
// high ones: its Terminate for an invalid STag in RDMAP reads as a DDP
// catastrophic error whose copied headers are absent. A control word
// whose reserved bits are set in exactly that place, and no other, is
// taken for siw's (only from a peer other than goverbs); one that copies
// no headers cannot be told from an RFC one and is left as it is.
func siwTerminate(t wire.Terminate) {
	f := t[22]
	if f&0xf8 != 0 || f&0x07 == 0 || t[23] != 0 {
		return
	}
	t[20] = t[20]<<4 | t[20]>>4
	t[22] = (f&1)<<7 | (f&2)<<5 | (f&4)<<3
}

// terminateKept is how much of a Terminate's payload (the terminated
// headers) is kept: what the longest headers need.
func terminateKept(h wire.Hdr) int {
	return min(h.PayloadLen(), wire.TerminateMaxLen-wire.TerminateLen)
}

// rxEnd completes the FPDU with headers h: its payload and trailer are
// read and checked.
func (c *conn) rxEnd(h wire.Hdr) error {
	switch h.Opcode() {
	case wire.OpWrite:
		return c.rxWriteEnd(h)
	case wire.OpReadResponse:
		return c.rxReadResponseEnd(h)
	case wire.OpSend, wire.OpSendInv, wire.OpSendSE, wire.OpSendSEInv:
		return c.rxSendEnd(h)
	case wire.OpReadRequest:
		return c.rxReadRequest(h)
	case wire.OpTerminate:
		return c.rxTerminate(h)
	case wire.OpImmData, wire.OpImmDataSE:
		return c.rxImmData(h)
	case wire.OpAtomicRequest:
		return c.rxAtomicRequest(h)
	case wire.OpAtomicResponse:
		return c.rxAtomicResponse(h)
	}
	return nil
}

// openGate lets the transmitter send once the first FPDU has arrived
// (the accepting side sends nothing before it: see gate).
func (c *conn) openGate() {
	c.gate.Store(true)
	c.wakeTx()
}

// firstFPDU handles the first FPDU of a responder's stream: it opens the
// transmitter (MPA lets the responder send only once the initiator has),
// and in peer-to-peer mode it must be the RTR agreed on.
func (c *conn) firstFPDU(h wire.Hdr) error {
	c.openGate()
	if c.wantRTR == 0 {
		return nil
	}
	ok := false
	switch h.Opcode() {
	case wire.OpWrite:
		ok = c.wantRTR&wire.RTRWrite != 0 && h.PayloadLen() == 0
		if ok && c.ext && h.TO()&0xffffffff00000000 == wire.RTRQPNTag {
			c.remoteQPN.Store(uint32(h.TO()))
			c.q.mu.Lock()
			if c.q.c == c {
				c.q.attr.DestQPNum = uint32(h.TO())
			}
			c.q.mu.Unlock()
		}
	case wire.OpReadRequest:
		ok = c.wantRTR&wire.RTRRead != 0 && wire.ReadRequest(h).Size() == 0
	}
	if !ok {
		return protoErr(wire.LayerLLP, wire.LLPMPAError, wire.LLPNoMatchingRTR, driver.EventQPReqErr,
			"the first FPDU is a %v, not the RTR negotiated", h.Opcode())
	}
	close(c.rtrSeen)
	return nil
}

// rxWriteBegin checks an RDMA Write segment's STag, bounds and rights:
// its payload goes straight to the region.
func (c *conn) rxWriteBegin(h wire.Hdr) error {
	q := c.q
	n := h.PayloadLen()
	if n == 0 {
		return nil
	}
	q.mu.Lock()
	ok := q.accepts() && q.attr.AccessFlags&driver.AccessRemoteWrite != 0
	q.mu.Unlock()
	b, m, ae := c.q.ctx.span(h.STag(), q.pd, q, h.TO(), uint64(n), driver.AccessRemoteWrite)
	if !ok && ae == accessOK {
		ae = accessRights
	}
	if ae != accessOK {
		return protoErr(wire.LayerDDP, wire.DDPTaggedError, taggedCode(ae), driver.EventQPAccessErr,
			"RDMA Write of %d bytes at STag %#x offset %#x: %v", n, h.STag(), h.TO(), ae)
	}
	c.rx.dst[0] = b
	c.rx.ndst = 1
	c.rx.dstMR[0], c.rx.ndstMR = m, 1
	return nil
}

// rxWriteEnd accounts for a placed RDMA Write segment.
func (c *conn) rxWriteEnd(h wire.Hdr) error {
	c.rx.writeLen += uint64(h.PayloadLen())
	if h.Last() {
		c.rx.lastWriteLen, c.rx.writeLen = c.rx.writeLen, 0
	}
	return nil
}

// taggedCode is the DDP tagged buffer error code of an access error.
func taggedCode(e accessError) uint8 {
	switch e {
	case accessBounds:
		return wire.DDPBaseBounds
	case accessNotAssoc:
		return wire.DDPSTagNotAssoc
	}
	return wire.DDPInvalidSTag
}

// rdmapCode is the RDMAP remote protection error code of an access error.
func rdmapCode(e accessError) uint8 {
	switch e {
	case accessBounds:
		return wire.RDMAPBaseBounds
	case accessNotAssoc:
		return wire.RDMAPSTagNotAssoc
	case accessRights:
		return wire.RDMAPAccessRights
	}
	return wire.RDMAPInvalidSTag
}

// oversizedAnswerMax bounds what tcp0 reads and drops of the answer to a
// zero-length Read. Linux siw (6.1) queues a Read Request that arrives
// while it is sending something else, and when it starts the Read
// Response (siw_activate_tx) copies the request's SGE only if its length
// is not zero: for a zero-length Read the SGE of the work request sent
// before stays, and siw sends that buffer, up to the 32 bits of an SGE's
// length, to the zero-length Read's sink. RFC 5040 makes a Read Response
// exactly as long as its Read; tcp0 accepts this one longer answer to a
// zero-length Read only, from a peer other than goverbs, as one message in
// order from the sink's Tagged Offset, and places none of it.
const oversizedAnswerMax = 1<<32 - 1

// rxReadResponseBegin checks a Read Response segment against the Read
// at the head of the ORQ: its payload goes to that Read's local buffers.
func (c *conn) rxReadResponseBegin(h wire.Hdr) error {
	q := c.q
	rx := &c.rx
	if !rx.resp.active {
		q.mu.Lock()
		r := &q.req
		if r.orqHead == r.orqTail || r.orq[r.orqHead%maxRdAtomic].kind == orqAtomic {
			q.mu.Unlock()
			return protoErr(wire.LayerDDP, wire.DDPTaggedError, wire.DDPInvalidSTag, driver.EventQPFatal,
				"a Read Response with no Read outstanding")
		}
		e := &r.orq[r.orqHead%maxRdAtomic]
		rx.resp.nseg = copy(rx.resp.segs[:], e.segs[:e.nseg])
		rx.resp.nmr = copy(rx.resp.mrs[:], e.mrs[:e.nmr])
		rx.resp.size, rx.resp.placed = e.size, 0
		rx.resp.sinkSTag, rx.resp.sinkTO = e.sinkSTag, e.sinkTO
		rx.resp.active = true
		q.mu.Unlock()
	}
	n := h.PayloadLen()
	if rx.resp.size == 0 && h.STag() == rx.resp.sinkSTag && !c.ext {
		// A zero-length Read places nothing, whatever comes back: Linux
		// siw answers one that waited behind another response with the
		// bytes of the last buffer it sent, in as many segments as that
		// takes (see oversizedAnswerMax). The segments must still be one
		// message at the Read's sink, in order from its Tagged Offset;
		// their payload is dropped.
		if h.TO() != rx.resp.sinkTO+rx.resp.dropped || rx.resp.dropped+uint64(n) > oversizedAnswerMax {
			return protoErr(wire.LayerDDP, wire.DDPTaggedError, wire.DDPBaseBounds, driver.EventQPFatal,
				"answer to a zero-length Read: %d bytes at offset %#x, expected offset %#x and at most %d bytes in all",
				n, h.TO(), rx.resp.sinkTO+rx.resp.dropped, uint64(oversizedAnswerMax))
		}
		rx.resp.dropped += uint64(n)
		rx.discard = true
		return nil
	}
	switch {
	case h.STag() != rx.resp.sinkSTag:
		return protoErr(wire.LayerDDP, wire.DDPTaggedError, wire.DDPInvalidSTag, driver.EventQPFatal,
			"Read Response for STag %#x, the Read named %#x", h.STag(), rx.resp.sinkSTag)
	case h.TO() != rx.resp.sinkTO+uint64(rx.resp.placed) || uint64(n) > uint64(rx.resp.size-rx.resp.placed):
		return protoErr(wire.LayerDDP, wire.DDPTaggedError, wire.DDPBaseBounds, driver.EventQPFatal,
			"Read Response of %d bytes at offset %#x outside the %d-byte Read", n, h.TO(), rx.resp.size)
	case h.Last() && uint64(rx.resp.placed)+uint64(n) != uint64(rx.resp.size):
		return protoErr(wire.LayerDDP, wire.DDPTaggedError, wire.DDPBaseBounds, driver.EventQPFatal,
			"Read Response ends after %d bytes of a %d-byte Read", uint64(rx.resp.placed)+uint64(n), rx.resp.size)
	}
	rx.ndst = copy(rx.dst[:], rx.resp.segs[:rx.resp.nseg])
	rx.ndstMR = copy(rx.dstMR[:], rx.resp.mrs[:rx.resp.nmr])
	rx.skip = uint64(rx.resp.placed)
	return nil
}

// rxReadResponseEnd accounts for a placed Read Response segment; the
// last completes the Read.
func (c *conn) rxReadResponseEnd(h wire.Hdr) error {
	q := c.q
	rx := &c.rx
	if !rx.discard {
		rx.resp.placed += uint32(h.PayloadLen())
	}
	if h.Last() {
		rx.resp.active, rx.resp.dropped = false, 0
		clear(rx.resp.segs[:rx.resp.nseg])
		clear(rx.resp.mrs[:rx.resp.nmr])
		q.mu.Lock()
		if q.c == c && q.accepts() {
			q.responseDone(rx.resp.placed)
		}
		q.mu.Unlock()
	}
	return nil
}

// untaggedCheck checks an untagged segment's queue and sequence number.
func (c *conn) untaggedCheck(h wire.Hdr, qn uint32) error {
	if h.QN() != qn {
		return protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPInvalidQN, driver.EventQPReqErr,
			"%v on DDP queue %d", h.Opcode(), h.QN())
	}
	if h.MSN() != c.rx.msn[qn] {
		return protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPInvalidMSN, driver.EventQPReqErr,
			"%v with MSN %d, expected %d", h.Opcode(), h.MSN(), c.rx.msn[qn])
	}
	return nil
}

// soleSegmentCheck is untaggedCheck of a message that is nothing but its
// headers (a Read Request, an atomic, Immediate Data): it is one whole
// DDP segment, the last of its message and at message offset 0.
func (c *conn) soleSegmentCheck(h wire.Hdr, qn uint32) error {
	if err := c.untaggedCheck(h, qn); err != nil {
		return err
	}
	switch {
	case h.MO() != 0:
		return protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPInvalidMO, driver.EventQPReqErr,
			"%v at message offset %d, not 0", h.Opcode(), h.MO())
	case !h.Last():
		return protoErr(wire.LayerRDMAP, wire.RDMAPRemoteOperation, wire.RDMAPCatastrophicLocal, driver.EventQPReqErr,
			"%v without the DDP Last flag: it is a message of one segment", h.Opcode())
	}
	return nil
}

// rxSendBegin checks a Send segment and consumes the receive the
// message fills when it starts: the payload goes to that receive's
// buffers.
func (c *conn) rxSendBegin(h wire.Hdr) error {
	rx := &c.rx
	if err := c.untaggedCheck(h, wire.QNSend); err != nil {
		return err
	}
	n := h.PayloadLen()
	if !rx.send.active {
		if h.MO() != 0 {
			return protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPInvalidMO, driver.EventQPReqErr,
				"a Send starts at message offset %d", h.MO())
		}
		if err := c.takeRecv(); err != nil {
			return err
		}
	}
	s := &rx.send
	if uint64(h.MO()) != s.placed {
		return protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPInvalidMO, driver.EventQPReqErr,
			"Send segment at message offset %d, expected %d", h.MO(), s.placed)
	}
	if uint64(n) > s.room-s.placed {
		c.completeSend(driver.WCLocLenErr)
		return c.sendTooLong(n)
	}
	rx.ndst = copy(rx.dst[:], s.segs[:s.nseg])
	rx.ndstMR = copy(rx.dstMR[:], s.mrs[:s.nseg])
	rx.skip = s.placed
	return nil
}

// sendTooLong is the error of a Send segment of n bytes that overruns
// its receive.
func (c *conn) sendTooLong(n int) error {
	s := &c.rx.send
	return protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPTooLong, driver.EventQPReqErr,
		"a Send of more than %d bytes for a %d-byte receive", s.placed+uint64(n), s.room)
}

// rxSendEnd accounts for a placed Send segment; the last completes the
// receive.
func (c *conn) rxSendEnd(h wire.Hdr) error {
	q := c.q
	rx := &c.rx
	s := &rx.send
	s.placed += uint64(h.PayloadLen())
	if !h.Last() {
		return nil
	}
	wc := c.sendDone(h)
	if op := h.Opcode(); op == wire.OpSendInv || op == wire.OpSendSEInv {
		stag := h.InvalidateSTag()
		if !q.ctx.invalidate(stag, q) {
			c.completeSend(driver.WCRemInvReqErr)
			return protoErr(wire.LayerRDMAP, wire.RDMAPRemoteOperation, wire.RDMAPCannotInvalidate, driver.EventQPReqErr,
				"Send with Invalidate of STag %#x, which names no region of the QP's PD that grants remote access", stag)
		}
		wc.Flags |= driver.WCWithInv
		wc.InvalidatedRKey = stag
	}
	c.completeSendWC(wc)
	return nil
}

// sendDone ends the Send message whose last segment, with headers h, is
// placed: the receive completion it gets (but for an invalidation).
func (c *conn) sendDone(h wire.Hdr) driver.WorkCompletion {
	rx := &c.rx
	rx.msn[wire.QNSend]++
	wc := driver.WorkCompletion{Opcode: driver.WCRecv, ByteLen: uint32(rx.send.placed), SrcQP: c.remoteQPN.Load()}
	if op := h.Opcode(); op == wire.OpSendSE || op == wire.OpSendSEInv {
		wc.Flags |= driver.WCSolicited
	}
	if rx.immNext {
		rx.immNext = false
		wc.Flags |= driver.WCWithImm
		wc.Imm = rx.immNextVal
	}
	return wc
}

// takeRecv consumes the receive the Send that starts now fills, and
// resolves its buffers.
func (c *conn) takeRecv() error {
	q := c.q
	q.mu.Lock()
	defer q.mu.Unlock()
	return c.takeRecvLocked()
}

// takeRecvLocked is takeRecv with q.mu held.
func (c *conn) takeRecvLocked() error {
	q := c.q
	s := &c.rx.send
	if !q.accepts() || q.c != c {
		return io.EOF
	}
	if !q.takeRecv(&s.recv) {
		return protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPNoBuffer, driver.EventQPReqErr,
			"a Send arrived and no receive is posted (iWARP has no RNR retry: post receives before the peer sends)")
	}
	q.rxActive, q.rxWRID = true, s.recv.WRID
	s.active, s.nseg, s.room, s.placed = true, 0, 0, 0
	for i := range s.recv.SGE {
		b, m, e := q.localSpan(&s.recv.SGE[i], driver.AccessLocalWrite)
		if e != accessOK {
			q.rxActive, s.active = false, false
			q.completeRecv(driver.WorkCompletion{WRID: s.recv.WRID, Status: driver.WCLocProtErr, Opcode: driver.WCRecv})
			return protoErr(wire.LayerDDP, wire.DDPCatastrophic, 0, driver.EventQPAccessErr,
				"receive buffer %d of WR %#x: %v", i, s.recv.WRID, e)
		}
		s.segs[s.nseg], s.mrs[s.nseg] = b, m
		s.nseg++
		s.room += uint64(len(b))
	}
	return nil
}

// completeSend completes the receive being filled with an error status.
func (c *conn) completeSend(status driver.WCStatus) {
	c.completeSendWC(driver.WorkCompletion{Status: status, Opcode: driver.WCRecv})
}

// releaseRecv delivers the receive completion held back by
// completeSendWC, unless the move to the error state already did.
func (c *conn) releaseRecv() {
	q := c.q
	q.mu.Lock()
	if q.rxHeld && q.c == c {
		q.rxHeld = false
		q.completeRecv(q.rxHeldWC)
	}
	q.mu.Unlock()
}

// completeSendWC completes the receive being filled with wc. A
// successful one is held back until the next FPDU is handled when that
// FPDU is a Read Request that arrived with it: a peer follows its
// Sends with a Read (a zero-length one where it has nothing else to
// read) to learn that they were placed, and answering it before the
// application hears of the Send means that an application that
// disconnects as soon as it has the message still lets the peer's Send
// complete as a success, as an InfiniBand acknowledgement would.
func (c *conn) completeSendWC(wc driver.WorkCompletion) {
	q := c.q
	q.mu.Lock()
	c.completeSendLocked(wc)
	q.mu.Unlock()
}

// completeSendLocked is completeSendWC with q.mu held.
func (c *conn) completeSendLocked(wc driver.WorkCompletion) {
	q := c.q
	s := &c.rx.send
	s.active = false
	clear(s.segs[:s.nseg])
	clear(s.mrs[:s.nseg])
	if q.rxActive && q.c == c {
		q.rxActive = false
		wc.WRID = s.recv.WRID
		if wc.Status != driver.WCSuccess {
			wc = driver.WorkCompletion{WRID: wc.WRID, Status: wc.Status, Opcode: driver.WCRecv}
			q.completeRecv(wc)
		} else if c.rx.nextRead {
			q.rxHeld, q.rxHeldWC = true, wc
			c.rx.held = true
		} else {
			q.completeRecv(wc)
		}
	}
}

// rxImmData handles RFC 7306 Immediate Data: lent to the next Send, or
// consuming a receive that completes a Write with immediate.
func (c *conn) rxImmData(h wire.Hdr) error {
	q := c.q
	rx := &c.rx
	rx.msn[wire.QNSend]++
	d := wire.ImmData(h)
	if d.Flags()&wire.ImmWithSend != 0 {
		rx.immNext, rx.immNextVal = true, d.Imm()
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.accepts() || q.c != c {
		return io.EOF
	}
	var r rwqe
	if !q.takeRecv(&r) {
		return protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPNoBuffer, driver.EventQPReqErr,
			"an RDMA Write with immediate arrived and no receive is posted")
	}
	wc := driver.WorkCompletion{WRID: r.WRID, Opcode: driver.WCRecvRDMAWithImm, Flags: driver.WCWithImm,
		Imm: d.Imm(), ByteLen: uint32(rx.lastWriteLen), SrcQP: c.remoteQPN.Load()}
	if h.Opcode() == wire.OpImmDataSE {
		wc.Flags |= driver.WCSolicited
	}
	q.completeRecv(wc)
	return nil
}

// rxReadRequest queues the Read Response to an RDMA Read Request, after
// checking the STag, bounds and rights of the memory read and the IRD.
func (c *conn) rxReadRequest(h wire.Hdr) error {
	q := c.q
	c.rx.msn[wire.QNRead]++
	r := wire.ReadRequest(h)
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.accepts() || q.c != c {
		return io.EOF
	}
	if c.irqTail-c.irqHead >= uint64(len(c.irq)) {
		return protoErr(wire.LayerRDMAP, wire.RDMAPRemoteOperation, wire.RDMAPCatastrophicLocal, driver.EventQPReqErr,
			"more Read Requests outstanding than the IRD of %d this side offered", len(c.irq))
	}
	var src []byte
	var m *mr
	if size := r.Size(); size > 0 {
		var ae accessError
		src, m, ae = q.ctx.span(r.SrcSTag(), q.pd, q, r.SrcTO(), uint64(size), driver.AccessRemoteRead)
		if ae == accessOK && q.attr.AccessFlags&driver.AccessRemoteRead == 0 {
			ae = accessRights
		}
		if ae != accessOK {
			return protoErr(wire.LayerRDMAP, wire.RDMAPRemoteProtect, rdmapCode(ae), driver.EventQPAccessErr,
				"RDMA Read of %d bytes at STag %#x offset %#x: %v", size, r.SrcSTag(), r.SrcTO(), ae)
		}
	}
	e := &c.irq[c.irqTail%uint64(len(c.irq))]
	*e = irqEntry{kind: irqRead, sinkSTag: r.SinkSTag(), sinkTO: r.SinkTO(), src: src, mr: m}
	copy(e.req[:], h)
	c.irqTail++
	if len(src) > 0 {
		c.rx.owe = true
	} else {
		c.rx.lazy = true
	}
	return nil
}

// rxAtomicRequest performs an RFC 7306 atomic on the word it names, with
// a CPU atomic instruction, and queues the response with the word's
// original value.
func (c *conn) rxAtomicRequest(h wire.Hdr) error {
	q := c.q
	c.rx.msn[wire.QNAtomic]++
	a := wire.AtomicRequest(h)
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.accepts() || q.c != c {
		return io.EOF
	}
	switch {
	case c.irqTail-c.irqHead >= uint64(len(c.irq)):
		return protoErr(wire.LayerRDMAP, wire.RDMAPRemoteOperation, wire.RDMAPCatastrophicLocal, driver.EventQPReqErr,
			"more atomics outstanding than the IRD of %d this side offered", len(c.irq))
	case a.TO()%8 != 0:
		return protoErr(wire.LayerRDMAP, wire.RDMAPRemoteOperation, wire.RDMAPUnspecified, driver.EventQPReqErr,
			"atomic on offset %#x, which is not 8-byte aligned", a.TO())
	case a.Op() == wire.AtomicFetchAdd && a.AddSwapMask() != 0:
		return protoErr(wire.LayerRDMAP, wire.RDMAPRemoteOperation, wire.RDMAPUnspecified, driver.EventQPReqErr,
			"masked FetchAdd is not supported")
	case a.Op() > wire.AtomicCmpSwap:
		return protoErr(wire.LayerRDMAP, wire.RDMAPRemoteOperation, wire.RDMAPUnspecified, driver.EventQPReqErr,
			"unknown atomic operation %d", a.Op())
	}
	b, _, ae := q.ctx.span(a.STag(), q.pd, q, a.TO(), 8, driver.AccessRemoteAtomic)
	if ae == accessOK && q.attr.AccessFlags&driver.AccessRemoteAtomic == 0 {
		ae = accessRights
	}
	if ae == accessOK && uintptr(unsafe.Pointer(&b[0]))%8 != 0 {
		ae = accessBounds
	}
	if ae != accessOK {
		return protoErr(wire.LayerRDMAP, wire.RDMAPRemoteProtect, rdmapCode(ae), driver.EventQPAccessErr,
			"atomic at STag %#x offset %#x: %v", a.STag(), a.TO(), ae)
	}
	word := (*uint64)(unsafe.Pointer(&b[0]))
	var old uint64
	switch a.Op() {
	case wire.AtomicFetchAdd:
		old = atomic.AddUint64(word, a.AddSwap()) - a.AddSwap()
	default: // swap, compare and swap, each under its masks
		cmp, cmask := a.Compare(), a.CompareMask()
		if a.Op() == wire.AtomicSwap {
			cmask = 0
		}
		swap, smask := a.AddSwap(), a.AddSwapMask()
		for {
			old = atomic.LoadUint64(word)
			if old&cmask != cmp&cmask {
				break
			}
			if atomic.CompareAndSwapUint64(word, old, old&^smask|swap&smask) {
				break
			}
		}
	}
	c.irq[c.irqTail%uint64(len(c.irq))] = irqEntry{kind: irqAtomic, id: a.ID(), value: old}
	c.irqTail++
	c.rx.owe = true
	return nil
}

// rxAtomicResponse completes the atomic at the head of the ORQ.
func (c *conn) rxAtomicResponse(h wire.Hdr) error {
	q := c.q
	c.rx.msn[wire.QNAtomic]++
	a := wire.AtomicResponse(h)
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.c != c || !q.accepts() {
		return io.EOF
	}
	ok, revoked := q.atomicDone(a.ID(), a.Value())
	switch {
	case !ok:
		return protoErr(wire.LayerRDMAP, wire.RDMAPRemoteOperation, wire.RDMAPUnexpectedOpcode, driver.EventQPFatal,
			"an Atomic Response for request %d, which is not the one outstanding", a.ID())
	case revoked:
		// As for a Read Response whose buffers went: the stream
		// ends, and the atomic completes with its error (the QP's
		// move to the error state completes it; no later WR can go
		// past it).
		return c.rx.revokedErr()
	}
	return nil
}

// rxTerminate handles a Terminate from the peer: the WR it names fails
// with the error it reports, and the QP moves to the error state.
func (c *conn) rxTerminate(h wire.Hdr) error {
	q := c.q
	// Longer than a Terminate of RFC 5040 needs: what fits was kept.
	n := terminateKept(h)
	t := wire.Terminate(c.rx.hdr[:wire.TerminateLen+n])
	if !c.ext {
		siwTerminate(t)
	}
	status := terminateStatus(t.Layer(), t.EType(), t.ECode())
	debugf("QP %d: the peer's Terminate: %v", q.num, t)
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.c != c || q.destroyed {
		return errPeerTerminated
	}
	q.terminated(t.Terminated(), status)
	q.completeInOrder()
	if q.attr.State != driver.QPSErr {
		q.ctx.Event(driver.EventQPFatal, q.userCtx)
		q.toErr()
	}
	return errPeerTerminated
}
