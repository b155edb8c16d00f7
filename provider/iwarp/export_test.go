package iwarp

import (
	"errors"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/verbs/driver"
)

// set sets *p to v and returns a function that restores what it was.
func set[T any](p *T, v T) (restore func()) {
	prev := *p
	*p = v
	return func() { *p = prev }
}

// SetMaxPayload makes FPDUs carry at most n bytes of payload, so that
// tests can cut messages into many segments; it returns a function that
// restores the default.
func SetMaxPayload(n int) (restore func()) {
	return set(&maxPayload, n)
}

// SetMinUserTimeout sets the least TCP_USER_TIMEOUT of a connection, so
// that tests can see a QP time out in less than its default 4 s; it
// returns a function that restores the default.
func SetMinUserTimeout(d time.Duration) (restore func()) {
	return set(&minUserTimeout, d)
}

// SetRTRTimeout sets how long a responder waits for the initiator's RTR,
// in place of listenwait.Timeout(); it returns a function that restores
// the default.
func SetRTRTimeout(d time.Duration) (restore func()) {
	return set(&rtrTimeout, d)
}

// SetPollGrace sets how long the receive goroutine stays off the socket
// after it has seen an application poll; it returns a function that
// restores the default.
func SetPollGrace(d time.Duration) (restore func()) {
	prev := pollGraceNS.Swap(int64(d))
	return func() { pollGraceNS.Store(prev) }
}

// ReceiverRounds is how many rounds of receiving (holds of rxMu) the
// receive goroutine of q's connection has run.
func ReceiverRounds(q driver.QP) uint64 {
	if c := q.(*qp).live.Load(); c != nil {
		return c.rxRounds.Load()
	}
	return 0
}

// KickReceiver ends the receive goroutine's wait for the socket of q's
// connection, so that it runs a round, as a poller that leaves receiving
// to it does (kickRx, whose wakeRx would also cut short the stay off the
// socket that follows the round).
func KickReceiver(q driver.QP) {
	if c := q.(*qp).live.Load(); c != nil {
		c.sk.kick()
	}
}

// RetainedConns is how many ended connections q keeps for Destroy to
// wait for.
func RetainedConns(q driver.QP) int {
	p := q.(*qp)
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.old)
}

// AnswerSlack is how many bytes a peer that answers nothing must send
// before its requests time out while it talks.
const AnswerSlack = answerSlack

// PollBudget is the FPDUs one poll receives at most.
const PollBudget = pollBudget

// FramesReceived is how many FPDUs the connection of q has received.
func FramesReceived(q driver.QP) uint64 {
	if c := q.(*qp).live.Load(); c != nil {
		return c.rxFrames.Load()
	}
	return 0
}

// HoldReceive takes the receiving of q's connection, as a poller does,
// until release: the receive goroutine waits.
func HoldReceive(q driver.QP) (release func()) {
	c := q.(*qp).live.Load()
	c.rxMu.Lock()
	return c.rxMu.Unlock
}

// DrainHeld is a poller's round on q's connection, held by HoldReceive,
// with budget: the FPDUs it received.
func DrainHeld(q driver.QP, budget int) (int, error) {
	c := q.(*qp).live.Load()
	before := c.rxFrames.Load()
	err := c.rxDrain(budget)
	if errors.Is(err, errBudget) {
		err = nil
	}
	return int(c.rxFrames.Load() - before), err
}

// AbortWithSocketCallHeld announces a system call on the socket of q's
// connection, as the transmitter does before its writev, then aborts the
// connection in a goroutine (as a Close does: the abort waits for the
// call) and, once the abort has begun, kicks the receive goroutine (as a
// poller that found the stream ended does), which then ends. It returns
// the socket's descriptor, a channel closed when the abort returns, and
// the function that ends the call; ok false: q has no live connection.
func AbortWithSocketCallHeld(q driver.QP) (fd int, aborted <-chan struct{}, end func(), ok bool) {
	c := q.(*qp).live.Load()
	if c == nil || !c.sk.enter() {
		return -1, nil, nil, false
	}
	done := make(chan struct{})
	go func() { c.abort(); close(done) }()
	for !c.sk.closed.Load() {
		runtime.Gosched()
	}
	c.kickRx()
	return c.sk.fd, done, c.sk.exit, true
}

// HoldTx takes the transmitter of q's connection (its txMu) until
// release; round runs one non-blocking transmit round meanwhile, so that
// a test decides what one batch holds.
func HoldTx(q driver.QP) (round func() (more, stop bool), release func()) {
	c := q.(*qp).live.Load()
	c.txMu.Lock()
	return func() (bool, bool) { return c.txRound(true) }, func() { c.lendBack(); c.txMu.Unlock(); c.wakeTx() }
}

// HoldsBatch reports whether q's connection holds a transmit batch
// between its transmitter's rounds; ok false: q has no live connection.
func HoldsBatch(q driver.QP) (holds, ok bool) {
	c := q.(*qp).live.Load()
	if c == nil {
		return false, false
	}
	c.txMu.Lock()
	defer c.txMu.Unlock()
	return c.tb != nil, true
}

// CachesMR reports whether q's cache of local key lookups (mrCache)
// holds the region with key lkey.
func CachesMR(q driver.QP, lkey uint32) bool {
	p := q.(*qp)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range p.mrCache {
		if m != nil && m.stag == lkey {
			return true
		}
	}
	return false
}

// StaleDstMRs counts the regions the receiver of q's connection still
// points at (rx.dstMR) beyond those of the FPDU in hand (ndstMR).
func StaleDstMRs(q driver.QP) int {
	c := q.(*qp).live.Load()
	if c == nil {
		return -1
	}
	c.rxMu.Lock()
	defer c.rxMu.Unlock()
	n := 0
	for _, m := range c.rx.dstMR[c.rx.ndstMR:] {
		if m != nil {
			n++
		}
	}
	return n
}

// ReadyConns is the number of sockets registered in the ready set of
// the send CQ of QP d (ready.go): those a poller that finds it empty
// asks about, when it has more than manyQPs QPs.
func ReadyConns(d driver.QP) int {
	r := &d.(*qp).sendCQ.ready
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.conns) - len(r.free)
}

// ReadyConnsRecv is ReadyConns of the receive CQ of QP d.
func ReadyConnsRecv(d driver.QP) int {
	r := &d.(*qp).recvCQ.ready
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.conns) - len(r.free)
}

// ManyQPs is manyQPs.
const ManyQPs = manyQPs

// PollerRounds is how many times pollers of QP d's CQs have read its
// connection (pollRx).
func PollerRounds(d driver.QP) uint64 {
	if c := d.(*qp).live.Load(); c != nil {
		return c.polls.Load()
	}
	return 0
}

// HoldQuiesce keeps every quiesce (a Dereg, a window's unbinding) waiting
// for q's connection, as a placement under way on it does, until release
// is called.
func HoldQuiesce(q driver.QP) (release func()) {
	c := q.(*qp).live.Load()
	c.rxBusy.Add(1)
	return func() { c.rxBusy.Add(-1) }
}

// Unbinding reports whether q's send queue has a window operation
// waiting for its old binding's quiesce.
func Unbinding(q driver.QP) bool {
	p := q.(*qp)
	p.mu.Lock()
	defer p.mu.Unlock()
	r := &p.req
	for seq := r.doneSeq; seq < r.execSeq; seq++ {
		if r.slot(seq).unbinding() {
			return true
		}
	}
	return false
}

// CQReceiverRounds is how many rounds the receiver of QP d's receive CQ
// has run (ready.go).
func CQReceiverRounds(d driver.QP) uint64 { return d.(*qp).recvCQ.ready.mine.Load() }

// HoldReceiving takes rxMu of QP d's connection, as revokeRead does, and
// returns its release, which, as revokeRead's, receives nothing itself.
func HoldReceiving(d driver.QP) (release func()) {
	c := d.(*qp).live.Load()
	c.rxMu.Lock()
	return c.rxUnlockUnread
}

// ReceiveMissed reports whether a poller or a CQ's receiver found rxMu
// of QP d's connection held, and left what had arrived to its holder.
func ReceiveMissed(d driver.QP) bool { return d.(*qp).live.Load().rxMissed.Load() }

// CQReceiverAside reports whether the receiver of QP d's receive CQ
// stands aside for an application's polls.
func CQReceiverAside(d driver.QP) bool { return d.(*qp).recvCQ.ready.aside.Load() }

// HoldReadySet takes the ready-set lock of QP d's receive CQ, as a poller
// reading the set holds it, and returns its release.
func HoldReadySet(d driver.QP) (release func()) {
	r := &d.(*qp).recvCQ.ready
	r.pollMu.Lock()
	return r.pollMu.Unlock
}

// CQAppPollsSeen is how many of an application's polls of QP d's receive
// CQ's ready set its receiver counts (appPolls), those that found the
// set held among them.
func CQAppPollsSeen(d driver.QP) uint64 { return d.(*qp).recvCQ.ready.appPolls() }

// CQAppPolls is how many polls of QP d's receive CQ's ready set were an
// application's.
func CQAppPolls(d driver.QP) uint64 {
	r := &d.(*qp).recvCQ.ready
	return r.polls.Load() - r.mine.Load()
}

// PostsLeft is how many WRs q's send queue holds posted and not yet
// executed: those a post left for a later writev (coalesce.go).
func PostsLeft(q driver.QP) uint64 {
	p := q.(*qp)
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.sq.Queued()
}

// CountSocketWrites counts the writev calls on the socket of a's
// connection from now until restore, which the caller calls while the
// connection is idle. b is a's peer in this process, the only other
// connection live: sockIO, which both read, is swapped holding both.
func CountSocketWrites(a, b driver.QP) (writes func() int64, restore func()) {
	ca, cb := a.(*qp).live.Load(), b.(*qp).live.Load()
	fd := uintptr(ca.sk.fd)
	var n atomic.Int64
	prev := sockIO
	swap := func(f func(trap, fd uintptr, iov []unix.Iovec) (uintptr, syscall.Errno)) {
		for _, c := range []*conn{ca, cb} {
			c.rxMu.Lock()
			c.txMu.Lock()
		}
		sockIO = f
		for _, c := range []*conn{ca, cb} {
			c.txMu.Unlock()
			c.rxMu.Unlock()
		}
	}
	swap(func(trap, f uintptr, iov []unix.Iovec) (uintptr, syscall.Errno) {
		if f == fd && trap == unix.SYS_WRITEV {
			n.Add(1)
		}
		return prev(trap, f, iov)
	})
	return n.Load, func() { swap(prev) }
}

// LeftForLater reports whether a post to q was left in its send queue
// for a later writev (coalesce.go) and has not been sent yet.
func LeftForLater(q driver.QP) bool {
	c := q.(*qp).live.Load()
	return c != nil && c.postsLeft.Load()
}

// SetLeftBackstop sets how long the timer waits before it sends WRs left
// for a later writev; it returns a function that restores the default.
func SetLeftBackstop(d time.Duration) (restore func()) {
	return set(&leftBackstop, d)
}

// ArmLazyTimer sets the lazy timer of q's connection to fire in d, as
// leftPost sets it to leftBackstop: a test that posted with the backstop
// far off, to see its post left, then lets the timer send it.
func ArmLazyTimer(q driver.QP, d time.Duration) {
	p := q.(*qp)
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.live.Load(); c != nil {
		c.lazyTimer.Reset(d)
	}
}

// SendCQHeld is how many completions q's send CQ holds that nobody has
// polled.
func SendCQHeld(q driver.QP) int { return int(q.(*qp).sendCQ.Held()) }

// SetLeaveWindow sets how recently the application must have polled for
// a post to be left for a later writev; it returns a function that
// restores the default.
func SetLeaveWindow(d time.Duration) (restore func()) {
	return set(&leaveWindow, d)
}

// SetLeaveGap sets how soon after the previous post a post may be left
// for a later writev; it returns a function that restores the default.
func SetLeaveGap(d time.Duration) (restore func()) {
	return set(&leaveGap, d)
}
