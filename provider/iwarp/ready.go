package iwarp

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/internal/atomicrel"
)

// A CQ of many QPs (more than manyQPs) reads only the connections that
// have something to read. It keeps an epoll instance of its own (ready)
// in which the sockets of its QPs' live connections stay registered,
// edge-triggered, for as long as they live: a poller that finds the CQ
// empty asks it, without waiting, which sockets have received since it
// last asked, and reads those, at most readyBatch of them per poll,
// each up to pollBudget FPDUs. A poll of an empty CQ thus costs one
// system call whatever the number of connections, and the kernel's
// ready list, which hands back a socket once per new arrival, takes the
// connections in turn: one that a peer floods is read no more often
// than the others that have something, and what a poll's budget leaves
// is the receive goroutine's (kickRx).
//
// While the CQ is being polled, the receive goroutines of its
// connections park on it (park) rather than wait for their sockets in
// the runtime's poller: a goroutine woken at every arrival would race
// the poller for the socket and cost a thread wake-up and two epoll_ctl
// calls per message. One timer per CQ, not one per connection, sees the
// polls stop: once a pollGrace has passed without a poll reading the
// ready set, it hands every parked goroutine its socket back (handBack),
// and each waits for its socket again. An application that arms the CQ
// (ReqNotify) wakes them at once.
//
// A CQ of at most manyQPs QPs reads every one of its connections when
// empty (cq.Poll): a registration in an epoll instance is a callback the
// kernel runs at every segment the socket receives (see sock), which a
// lone connection's latency would pay for nothing.
//
// The receive CQ of more than manyQPs QPs also has a receiver of its
// own (receiveReady): a goroutine that reads the ready set as a poller
// does while no application polls it, and, when it has nothing, sleeps
// in ppoll(2) on the set's epoll instance itself (sleep), a thread of
// its own blocked in the kernel until a connection receives. Waiting in
// the runtime's poller instead would add the set to an epoll instance
// at each wait, and the kernel checks an epoll instance added to
// another for loops by walking every socket it holds, a thousand each
// time. The price is an OS thread per such CQ, blocked in the kernel
// while its receiver sleeps (debug.SetMaxThreads counts them). Its
// connections' receive goroutines stay parked meanwhile, whether it
// reads or stands aside (handBack keeps them), and read only what it
// leaves them (a round's budget used up, the end of a stream: kickRx):
// FPDUs that come in turn on a thousand connections, each of which
// receives seldom, then cost one goroutine's wake-up for all that
// arrive together rather than one each, and the answers they ask for go
// out at once (scripts/tcprrfloor measures both shapes on bare
// sockets). It stands aside while an application polls the set, and
// spins after FPDUs as a receive goroutine does (rxSpin). A send CQ has
// none, even of many QPs: a QP with a CQ of each kind (a server's many
// clients on one send CQ and one receive CQ, say) would wake two for
// each arrival.

// manyQPs: a CQ of more QPs than this reads only its ready connections.
const manyQPs = 4

// readyBatch is how many ready connections one poll reads at most.
const readyBatch = 32

// readySet is a CQ's epoll instance and the connections registered in it.
type readySet struct {
	watching atomic.Bool // ep is open (set once, under mu)
	mu       sync.Mutex  // guards ep, conns, free, closed
	ep       int
	conns    []*conn  // by registration number, the epoll event's data
	free     []uint32 // registration numbers not in use
	closed   bool     // the CQ is destroyed: no more registrations

	pollMu sync.Mutex // one poller reads the set at a time
	ev     [readyBatch]unix.EpollEvent
	got    [readyBatch]*conn // the connections of a poll's events

	// polls counts the polls that read the set, the receiver's (mine)
	// and the application's; the receive goroutines park while it
	// moves (park), and handBack lets them go once it has not moved for
	// a pollGrace.
	polls atomic.Uint64
	mine  atomic.Uint64
	// missed counts the application's polls that found another poller
	// reading the set (the receiver, say): they are polls all the same,
	// which the receiver stands aside for (appPolls).
	missed atomic.Uint64
	// The receiver's wake-up: an eventfd, open once the receiver has
	// started (stop is not nil), written once, when the CQ is destroyed.
	// While the receiver runs (rcvLive, under mu) it is the one that
	// closes ep and stopFD, as it ends, since it may be asleep in ppoll
	// on them.
	stopFD  int
	rcvLive bool
	pfds    [2]unix.PollFd // the receiver's ppoll: ep and stopFD
	stop    chan struct{}  // closed when the CQ is destroyed
	rcvDone chan struct{}  // closed when the receiver has stopped
	resume  chan struct{}  // ends the receiver's standing aside (wakeReceiver)
	// receiving: the CQ has a receiver (set after the above, cleared
	// when it stops); aside: it stands aside for an application's polls
	// (what the tests look at: handBack keeps the goroutines parked
	// either way).
	receiving atomic.Bool
	aside     atomic.Bool
	// armedAt is when an application last armed a CQ of the QPs the
	// receiver reads for (monotime; wakeReceiver).
	armedAt  atomic.Int64
	parkMu   sync.Mutex
	parked   chan struct{} // closed to let the parked goroutines go; nil when none waits
	seen     uint64        // polls at the timer's last look
	timer    *time.Timer
	timerSet bool
}

// readyWatch opens the CQ's ready set and registers the sockets of its
// QPs' live connections; the connections that start later register
// themselves (joinReady).
func (c *cq) readyWatch() error {
	r := &c.ready
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.watching.Load() || r.closed {
		return nil
	}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		// Its pollers read nothing then: the receive goroutines do.
		r.closed = true
		return fmt.Errorf("iwarp: epoll for a CQ: %w", err)
	}
	r.ep = ep
	r.watching.Store(true)
	if p := c.qps.Load(); p != nil {
		for _, q := range *p {
			if cn := q.live.Load(); cn != nil {
				c.joinLocked(cn)
			}
		}
	}
	return nil
}

// startReceiver gives the CQ a receiver (receiveReady), with a ready
// set if it has none yet, unless it has one.
func (c *cq) startReceiver() error {
	if err := c.readyWatch(); err != nil {
		return err
	}
	r := &c.ready
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stop != nil || r.closed {
		return nil
	}
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("iwarp: a receiver for a CQ: %w", err)
	}
	r.stopFD, r.rcvLive = fd, true
	r.pfds = [2]unix.PollFd{{Fd: int32(r.ep), Events: unix.POLLIN}, {Fd: int32(fd), Events: unix.POLLIN}}
	r.stop, r.rcvDone, r.resume = make(chan struct{}), make(chan struct{}), make(chan struct{}, 1)
	// Before it starts: a receiver that stops at once clears it (letGo).
	r.receiving.Store(true)
	go c.receiveReady()
	return nil
}

// receives reports whether the receiver of c, q's receive CQ, reads q's
// connection cn: then an application about to sleep on a CQ of q's
// wakes the receiver (wakeReceiver) rather than cn's receive goroutine.
func (c *cq) receives(q *qp, cn *conn) bool {
	return c.ready.receiving.Load() && cn.readyNum[q.cqIndex(c)].Load() != 0
}

// wakeReceiver ends the receiver's standing aside for an application's
// polls, for an application about to sleep on a CQ of the QPs it reads
// for, and keeps it from standing aside for the application's last
// polls before it sleeps (appAsleep).
func (r *readySet) wakeReceiver() {
	r.armedAt.Store(monotime())
	select {
	case r.resume <- struct{}{}:
	default:
	}
}

// cqs are the QP's send CQ and its receive CQ, or nil in its place
// when that is the send CQ.
func (q *qp) cqs() [2]*cq {
	if q.recvCQ == q.sendCQ {
		return [2]*cq{q.sendCQ}
	}
	return [2]*cq{q.sendCQ, q.recvCQ}
}

// cqIndex is which of q's CQs c is (cqs).
func (q *qp) cqIndex(c *cq) int {
	if c == q.sendCQ {
		return 0
	}
	return 1
}

// joinReady registers the connection's socket in the ready sets of its
// QP's CQs that keep one; the receive goroutine calls it as it starts.
func (cn *conn) joinReady() {
	for _, c := range cn.q.cqs() {
		if c != nil && c.ready.watching.Load() {
			c.ready.mu.Lock()
			c.joinLocked(cn)
			c.ready.mu.Unlock()
		}
	}
}

// joinLocked registers cn's socket in c's ready set, unless it is
// there. ready.mu is held, and cn's socket is open: cn's receive
// goroutine, which releases it, leaves the set first (leaveReady).
func (c *cq) joinLocked(cn *conn) {
	r := &c.ready
	i := cn.q.cqIndex(c)
	if r.closed || cn.readyNum[i].Load() != 0 || cn.readyLeft.Load() {
		return
	}
	var n uint32
	if k := len(r.free); k > 0 {
		n, r.free = r.free[k-1], r.free[:k-1]
	} else {
		n = uint32(len(r.conns))
		r.conns = append(r.conns, nil)
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLRDHUP | unix.EPOLLET, Fd: int32(n)}
	if err := unix.EpollCtl(r.ep, unix.EPOLL_CTL_ADD, cn.sk.fd, &ev); err != nil {
		// The connection's receive goroutine reads for it instead: it
		// never parks on a CQ it is not registered with.
		r.free = append(r.free, n)
		debugf("QP %d: not in its CQ's ready set: %v", cn.q.num, err)
		return
	}
	r.conns[n] = cn
	cn.readyNum[i].Store(n + 1)
}

// leaveReady takes the connection's socket out of the ready sets it is
// in, for good; its receive goroutine calls it before it releases the
// socket.
func (cn *conn) leaveReady() {
	cn.readyLeft.Store(true)
	for _, c := range cn.q.cqs() {
		if c == nil {
			continue
		}
		r := &c.ready
		r.mu.Lock()
		i := cn.q.cqIndex(c)
		if n := cn.readyNum[i].Load(); n != 0 {
			cn.readyNum[i].Store(0)
			if !r.closed {
				unix.EpollCtl(r.ep, unix.EPOLL_CTL_DEL, cn.sk.fd, nil)
			}
			r.conns[n-1] = nil
			r.free = append(r.free, n-1)
		}
		r.mu.Unlock()
	}
}

// pollReady reads the connections of the ready set that have received
// something since the last poll asked.
func (c *cq) pollReady() {
	r := &c.ready
	if !r.watching.Load() {
		if err := c.readyWatch(); err != nil {
			debugf("%v", err)
		}
		return // the goroutines read what came before
	}
	c.readyRound(false)
}

// readyRound reads the connections of the ready set that have received
// something since the last round asked, for an application's poll or,
// mine, for the CQ's receiver, and returns how many it read (readyBatch:
// more may be waiting), or -1 when another round is under way.
func (c *cq) readyRound(mine bool) int {
	r := &c.ready
	if !r.pollMu.TryLock() {
		if !mine {
			r.missed.Add(1)
		}
		return -1 // another poller is at it
	}
	if mine {
		r.mine.Add(1)
	}
	atomicrel.StoreUint64(&r.polls, r.polls.Load()+1)
	r.mu.Lock()
	n := 0
	if !r.closed {
		k, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(r.ep), uintptr(unsafe.Pointer(&r.ev[0])), readyBatch, 0, 0, 0)
		if e == 0 {
			for _, ev := range r.ev[:k] {
				if int(ev.Fd) >= len(r.conns) {
					continue
				}
				if cn := r.conns[ev.Fd]; cn != nil {
					r.got[n] = cn
					n++
				}
			}
		}
	}
	r.mu.Unlock()
	// Outside mu, which a connection that ends takes to leave: reading
	// one that has ended finds it closed.
	for i, cn := range r.got[:n] {
		if mine {
			cn.receiveFor()
		} else {
			cn.pollRx()
		}
		r.got[i] = nil
	}
	r.pollMu.Unlock()
	return n
}

// appPolls counts the application's polls of the set, those that read
// it and those that found another poller at it.
func (r *readySet) appPolls() uint64 {
	return r.polls.Load() - r.mine.Load() + r.missed.Load()
}

// receiveReady is a CQ's receiver: it reads the ready set whenever it
// reports connections and no application polls it, until the CQ is
// destroyed.
func (c *cq) receiveReady() {
	r := &c.ready
	defer close(r.rcvDone)
	defer r.letGo()
	defer r.receiverEnds()
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	seenApp := r.appPolls()
	var sp spin
	for {
		if app := r.appPolls(); app != seenApp && !r.appAsleep() {
			// An application polls the set: it reads what arrives, and
			// the receiver would only race it for the sockets and take
			// a processor from it. It looks again after a pollGrace.
			seenApp = app
			sp.stop()
			r.aside.Store(true)
			t.Reset(pollGrace())
			select {
			case <-t.C:
			case <-r.resume:
				t.Stop()
				seenApp = r.appPolls()
			case <-r.stop:
				return
			}
			r.aside.Store(false)
			continue
		}
		seenApp = r.appPolls()
		n := c.readyRound(true)
		switch {
		case n < 0:
			// An application's poll is under way: the receiver looks
			// again once it is over (the count above moves with it),
			// for what it left, more than a poll reads.
			runtime.Gosched()
			continue
		case n > 0:
			sp.found(time.Now())
			continue // more may have come meanwhile: the set reports each arrival once
		}
		if sp.on() {
			runtime.Gosched()
			continue
		}
		if stopped, err := r.sleep(); stopped || err != nil {
			if err != nil {
				debugf("a CQ's receiver stops, its connections' receive goroutines read for it: %v", err)
			}
			return
		}
	}
}

// sleep waits until a connection of the ready set has received
// something, or the CQ is destroyed (stopped), in ppoll(2), which
// leaves the set's reports for readyRound to take. A signal (the
// runtime's preemption, say) ends it early: the receiver looks again.
func (r *readySet) sleep() (stopped bool, err error) {
	n, err := unix.Ppoll(r.pfds[:], nil, nil)
	switch {
	case err == unix.EINTR:
		return false, nil
	case err != nil:
		return false, fmt.Errorf("iwarp: a CQ's receiver waits: %w", err)
	}
	return n > 0 && r.pfds[1].Revents != 0, nil
}

// receiverEnds is the receiver's last act: the descriptors its sleep
// used are closed by it, if the CQ is destroyed, or else by the CQ's
// destruction (closeReady).
func (r *readySet) receiverEnds() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rcvLive = false
	if r.closed {
		unix.Close(r.ep)
		unix.Close(r.stopFD)
	}
}

// appAsleep reports whether an application armed a CQ of the QPs the
// receiver reads for less than a pollGrace ago: its polls since are
// likely the last before it sleeps (CQ.Wait arms, then polls once more),
// and the receiver goes on reading rather than stand aside for them,
// which would leave what comes next to nobody for a pollGrace. An
// application that goes on polling instead has the receiver beside it
// for that long.
func (r *readySet) appAsleep() bool {
	at := r.armedAt.Load()
	return at != 0 && monotime()-at < int64(pollGrace())
}

// letGo is the receiver's end: the receive goroutines parked on the CQ
// go back to their sockets, and later ones park only while an
// application polls.
func (r *readySet) letGo() {
	r.receiving.Store(false)
	r.parkMu.Lock()
	if r.parked != nil {
		close(r.parked)
		r.parked = nil
	}
	r.parkMu.Unlock()
}

// park keeps cn's receive goroutine off its socket while pollers read
// the CQ's ready set, if they have since *seen (the count of their polls
// at the goroutine's last look), and cn is registered in the set. It
// returns false at once if not; else, true once the polls have stopped
// (handBack), the CQ has gone, or the goroutine is woken (wakeRx).
func (c *cq) park(cn *conn, seen *uint64) bool {
	r := &c.ready
	polls := r.polls.Load()
	if polls == *seen || cn.readyNum[cn.q.cqIndex(c)].Load() == 0 {
		*seen = polls
		return false
	}
	*seen = polls
	cn.sk.unwatchIn()
	r.parkMu.Lock()
	if r.parked == nil {
		r.parked = make(chan struct{})
	}
	ch := r.parked
	if !r.timerSet {
		r.timerSet = true
		r.seen = polls
		if r.timer == nil {
			r.timer = time.AfterFunc(pollGrace(), r.handBack)
		} else {
			r.timer.Reset(pollGrace())
		}
	}
	r.parkMu.Unlock()
	select {
	case <-ch:
	case <-cn.rxWake:
	}
	*seen = r.polls.Load()
	return true
}

// handBack lets the parked receive goroutines go once no poll has read
// the ready set for a pollGrace; the timer looks every pollGrace while
// goroutines are parked.
func (r *readySet) handBack() {
	r.parkMu.Lock()
	defer r.parkMu.Unlock()
	if polls := r.polls.Load(); polls != r.seen {
		r.seen = polls
		r.timer.Reset(pollGrace())
		return
	}
	r.timerSet = false
	if r.receiving.Load() {
		// The CQ's receiver reads for them, and they stay parked: back
		// on their sockets, each would wake for every FPDU as the
		// receiver does. It lets them go when it stops (letGo). One
		// that stands aside for an application's polls reads again a
		// pollGrace after their last, as they would.
		return
	}
	if r.parked != nil {
		close(r.parked)
		r.parked = nil
	}
}

// closeReady closes the ready set of a CQ destroyed, and lets its
// parked goroutines go.
func (c *cq) closeReady() {
	r := &c.ready
	r.mu.Lock()
	if !r.closed {
		r.closed = true
		if r.stop != nil {
			close(r.stop)
		}
		switch {
		case r.rcvLive:
			// The receiver may be asleep on ep and stopFD: the write
			// wakes it, and it closes them (receiverEnds).
			var one [8]byte
			binary.NativeEndian.PutUint64(one[:], 1)
			unix.Write(r.stopFD, one[:])
		case r.watching.Load():
			unix.Close(r.ep)
			if r.stop != nil {
				unix.Close(r.stopFD) // the receiver ended before: receiverEnds left it
			}
		}
		for _, cn := range r.conns {
			if cn != nil {
				cn.readyNum[cn.q.cqIndex(c)].Store(0)
			}
		}
		r.conns, r.free = nil, nil
	}
	r.mu.Unlock()
	r.parkMu.Lock()
	if r.timer != nil {
		r.timer.Stop()
	}
	r.timerSet = false
	if r.parked != nil {
		close(r.parked)
		r.parked = nil
	}
	r.parkMu.Unlock()
}

// waitReceiver waits for the receiver of a CQ destroyed (closeReady) to
// stop; the caller holds no lock of the device's.
func (c *cq) waitReceiver() {
	r := &c.ready
	r.mu.Lock()
	done := r.rcvDone
	r.mu.Unlock()
	if done != nil {
		<-done
	}
}
