package shm

import (
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/internal/peerguard"
	"github.com/goverbs/goverbs/verbs/driver"
)

// A connection's control plane: one SOCK_SEQPACKET Unix socket, carrying
// the handshake with the shared segments' memfds, and afterwards the rare
// messages the data path needs. Its end is how each side learns that the
// other is gone: the kernel closes the socket of a dead process.

// Control message types.
const (
	msgReq      = 1 // connection request (handshake)
	msgRep      = 2 // acceptance (handshake)
	msgRej      = 3 // rejection, with private data
	msgRTU      = 4 // ready to use: the dialler is in RTS
	msgGetSeg   = 5 // a: segment id, b: 1 to map it writable
	msgSeg      = 6 // a: segment id, b: 1 if writable; one fd, or none if refused
	msgErr      = 7 // a: the event to raise; the receiver's QP must move to the error state
	msgDisc     = 8 // disconnect
	msgSRQLimit = 9 // the receiver's SRQ fell below its limit
	msgOverrun  = 10
	msgSegGone  = 11 // a: segment id; the segment was freed, unmap it
	msgRevoke   = 12 // a: sequence number; a key was revoked: answer once no WR uses it
	msgRevoked  = 13 // a: the sequence number of the msgRevoke answered
	msgGetKey   = 14 // a: a key the requester wants granted
	msgKey      = 15 // a: the key asked for; b: 1 if granted (now in the grant table)
	// a: the key of a window a Send with Invalidate invalidates
	msgInvalidate = 16
	// a: the key asked for; b: 1 if invalidated
	msgInvalidated = 17
	// the first request of the sender reached the receiver's QP while it
	// was in RTR (announceRequest)
	msgCommEst = 18
)

// ctrl is a runtime control message: type, a, b.
type ctrl [12]byte

func (m *ctrl) set(t uint8, a, b uint32) {
	*m = ctrl{}
	m[0] = t
	binary.LittleEndian.PutUint32(m[4:], a)
	binary.LittleEndian.PutUint32(m[8:], b)
}
func (m *ctrl) typ() uint8 { return m[0] }
func (m *ctrl) a() uint32  { return binary.LittleEndian.Uint32(m[4:]) }
func (m *ctrl) b() uint32  { return binary.LittleEndian.Uint32(m[8:]) }

// conn is one QP's connection to its peer: the peer's shared structures
// mapped here, and the control socket.
type conn struct {
	// hot: what postPath reads of the connection, in an object of its
	// own (qp.hot points at it too).
	hot *connHot
	// epochOwn: this side's grant epoch word for the connection, which
	// the peer was handed (epoch.go); epochSeg: the peer's page of
	// them, mapped read-only, in which hot.epoch lies.
	epochOwn *epochSlot
	epochSeg *segment
	peerHdr  *ringHeader // the peer QP's header: state, access, attributes
	keys     *keyTable   // the peer's grant table for this connection (keySeg)
	peerGen  uint32      // the peer QP's gen when it connected: a later one is another connection's
	ended    atomic.Bool // done is closed
	// revokeWant: the peer's msgRevoke waiting for an answer (0: none),
	// given by whoever sees first that no WR is under way (answerRevoke).
	revokeWant atomic.Uint32
	// peerSettled: the peer's QP can raise no communication established
	// event for a request of this connection any more (announceRequest);
	// holdUnsettled until it is. Guarded by q.mu.
	peerSettled bool
	// retired: mappings absorb replaced or dropped while a target of the
	// WR being executed (dst) lay in them, unmapped once the WR is done
	// (closeRetired): a WR that resolved one of its SGEs into a mapping
	// may see it replaced while it resolves the next. Any other mapping
	// absorb drops is unmapped at once. holdRetired while it is not
	// empty. Guarded by q.mu.
	retired []*segment
	// segWaitUntil bounds the waits for segments of the WR being executed
	// (segment), all of them together; zero between WRs, holdSegWait
	// while it is not (waitDeadline). Guarded by q.mu.
	segWaitUntil time.Time
	// kc: the resolved keys, guarded by q.mu.
	kc keyCache

	q      *qp
	sock   *net.UnixConn
	pid    int
	remote driver.ConnParam

	peerBlock  *segment
	started    atomic.Bool // start has run: the reader answers control messages
	peerRecv   *recvRing   // the peer's receive queue, or its SRQ
	peerSRQ    bool
	srqSeg     *segment
	cqSeg      *segment  // the peer's receive CQ: its arming and futex word, its doorbells
	peerNotify *cqRing   // its view
	peerBells  doorbells // its doorbells, and the peer QP's bell in them
	peerBell   uint32
	peerCQ     *cqRing  // the peer QP's receive completion ring, in peerBlock
	keySeg     *segment // the peer's grant table for this connection, mapped read-only (keys views it)
	// keyAck hands the requester (askKey) the peer's answers to its
	// msgGetKey: key, granted.
	keyAck chan [2]uint32
	// invAck hands askInvalidate the answers to its msgInvalidate.
	invAck chan [2]uint32
	// refused is the last key the peer refused, not asked for again
	// (a WR that postNow gave up on asks again in Execute). Guarded by
	// q.mu.
	refused    uint32
	refusedSet bool
	// guard, of the listener that accepted the connection (nil for a
	// dialled one), counts the peer's refused keys against peerID, its
	// user; once it refuses the peer, the connection ends.
	guard  *peerguard.Guard
	peerID string

	// Peer segments mapped for the requester; guarded by q.mu, which
	// serialises the requester. The reader queues what the peer sends
	// (segments it pushes or was asked for, segments it freed) in
	// arrivals, and the requester absorbs them.
	segs   map[uint32]*segment
	segRW  map[uint32]bool
	mapped int // bytes of the mappings in segs
	// The segment a requester waits for, and whether the peer refused
	// it. Only that refusal is kept: a peer can send refusals for any
	// number of segments.
	awaiting     uint32
	awaitingSet  bool
	awaitRefused bool
	arriveMu     sync.Mutex
	arrivals     []segReply // at most maxArrivals
	overflow     bool       // arrivals were dropped: drop the mappings too
	segNote      chan struct{}

	wmu    sync.Mutex // serialises socket writes
	events chan ctrl
	done   chan struct{}
	gone   chan struct{} // closed when the reader sees the socket end
	// Revocations this side asked the peer to confirm (revokePeer):
	// one at a time (revokeMu), numbered revokeSeq, the peer's answers
	// handed over on revokeAck.
	revokeMu  sync.Mutex
	revokeSeq uint32
	revokeAck chan uint32
	// fenceMu guards fenceClosed, set once close has begun, after which
	// lastWQE starts no goroutine (close waits for those in wg).
	fenceMu     sync.Mutex
	fenceClosed bool
	// The requester's scratch space, guarded by q.mu: a Send's receive
	// and its resolved buffers (kept here, not zeroed on the stack for
	// every WR).
	rent     recvEntry
	dst      [maxSGE]remote
	doneOnce sync.Once
	wg       sync.WaitGroup
	closing  sync.Once
}

// The bits of conn.hold.
const (
	holdUnsettled = 1 << iota // peerSettled is false
	holdDirty                 // arrivals wait to be absorbed (the mappings change)
	holdRetired               // retired is not empty
	holdSegWait               // segWaitUntil is not zero
	holdRevoke                // revokeWant may be set
	holdEnded                 // ended is set
)

// connHot is what postPath reads of a connection: its hold word and its
// fastPaths, a few lines in an object of their own. A requester going
// round a thousand connections misses the TLB on each page of a
// connection's that a WR touches; the connections' connHots, small and
// made one after another, share pages, where a conn (2 KiB) fills one
// of its own.
type connHot struct {
	// hold is zero while nothing stands between two WRs of the
	// requester: it has one bit (hold*) for each thing that postFast
	// would otherwise test on its own. Each bit is set by setHold after
	// the state it stands for, and cleared by whoever deals with that
	// state before it looks at the state, so that a bit is never clear
	// while its state wants dealing with (a bit left set for a state
	// already dealt with costs one WR on the long road, which clears
	// it).
	hold atomic.Uint32
	// epoch: the peer's grant epoch word for the connection, which it
	// moves on after every write of its grant table (epoch.go).
	epoch *atomic.Uint64
	// fast: postFast's resolved keys, by opcode, which the key cache's
	// mappings outlive only as long as they are cached (forgetKeys
	// forgets both). Guarded by q.mu.
	fast [len(fastOps)]fastPath
}

// forgetKeys empties the key cache and the fastPaths, which point into
// its mappings. q.mu is held.
func (c *conn) forgetKeys() {
	c.kc = keyCache{}
	c.hot.fast = [len(fastOps)]fastPath{}
}

// setHold sets bits of c.hold, once the state they stand for is set.
func (c *conn) setHold(bits uint32) { c.hot.hold.Or(bits) }

// clearHold clears bits of c.hold and reports which of them were set;
// the caller then deals with the state they stand for.
func (c *conn) clearHold(bits uint32) uint32 { return c.hot.hold.And(^bits) & bits }

// maxArrivals bounds the segments received and not yet absorbed by the
// requester.
const maxArrivals = 1024

// segReply is a segment the peer sent (fd >= 0), refused (fd < 0), or
// freed (gone).
type segReply struct {
	id       uint32
	fd       int
	writable bool
	gone     bool
}

// sendCtrl sends a control message; errors mean the peer is gone, which
// the reader notices.
func (c *conn) sendCtrl(t uint8, a, b uint32) {
	var m ctrl
	m.set(t, a, b)
	c.wmu.Lock()
	c.writeCtrl(m[:], nil)
	c.wmu.Unlock()
}

// ctrlWriteTimeout bounds a control message's write: a peer that has
// not read its socket for that long while the socket is full (stopped,
// hung, or hostile) is taken for dead, so that no caller (the reader
// answering a request, AllocMR pushing a segment, a disconnect) waits
// on it longer.
const ctrlWriteTimeout = time.Second

// writeCtrl writes a control message with its descriptors (oob); a write
// that times out, or fails, closes the socket: the reader sees it end
// and the QP moves to the error state. wmu is held.
func (c *conn) writeCtrl(m, oob []byte) {
	c.sock.SetWriteDeadline(time.Now().Add(ctrlWriteTimeout))
	if _, _, err := c.sock.WriteMsgUnix(m, oob, nil); err != nil {
		c.sock.Close()
	}
}

// peerError tells the peer its QP must move to the error state (a
// responder error this side detected on its behalf).
func (c *conn) peerError(ev driver.EventType) { c.sendCtrl(msgErr, uint32(ev), 0) }

// announceRequest is what the requester does before it performs a
// request on the peer's QP, whose CPU takes no part in it: the first
// time it finds that QP in RTR, it tells the peer (msgCommEst), which
// raises EventCommEst (soft.QP.RequestArrived). Once it has told it, or
// found the QP beyond RTR, it does nothing more. q.mu is held.
func (c *conn) announceRequest() {
	if c.peerSettled {
		return
	}
	switch driver.QPState(c.peerHdr.state.Load()) {
	case driver.QPSRTR:
		c.sendCtrl(msgCommEst, 0, 0)
		c.settle()
	case driver.QPSReset, driver.QPSInit:
	default:
		c.settle()
	}
}

// settle records that the peer's QP is past RTR (peerSettled).
func (c *conn) settle() {
	c.peerSettled = true
	c.clearHold(holdUnsettled)
}

// peerBroke handles a peer whose shared memory made no sense: the
// connection is ended.
func (c *conn) peerBroke() {
	c.sendCtrl(msgErr, uint32(driver.EventQPFatal), 0)
	c.sock.CloseRead()
}

// start runs the connection's reader and event goroutines, and hands the
// peer the segments it may access.
func (c *conn) start() {
	c.started.Store(true)
	c.q.ctx.remember(c)
	c.pushShareable()
	c.wg.Add(2)
	go c.reader()
	go c.handleEvents()
}

// reader reads control messages until the socket ends. It answers segment
// requests itself and hands everything that changes QP state to
// handleEvents, so that it never waits for q.mu (a requester holding q.mu
// may be waiting for a reply this goroutine must deliver).
func (c *conn) reader() {
	defer c.wg.Done()
	defer close(c.events)
	defer close(c.gone)
	buf := make([]byte, 64)
	oob := make([]byte, unix.CmsgSpace(4*4))
	for {
		n, oobn, _, _, err := c.sock.ReadMsgUnix(buf, oob)
		fds := parseFDs(oob[:oobn])
		if err != nil || n == 0 {
			closeFDs(fds)
			return
		}
		var m ctrl
		if n != len(m) {
			closeFDs(fds)
			continue // not a runtime message: ignore it
		}
		copy(m[:], buf)
		switch m.typ() {
		case msgGetSeg:
			closeFDs(fds)
			c.serveSegment(m.a(), m.b() == 1)
		case msgGetKey:
			closeFDs(fds)
			c.serveKey(m.a())
		case msgInvalidate:
			closeFDs(fds)
			c.serveInvalidate(m.a())
		case msgInvalidated:
			closeFDs(fds)
			select {
			case c.invAck <- [2]uint32{m.a(), m.b()}:
			default: // nobody waits for it (any more)
			}
		case msgKey:
			closeFDs(fds)
			select {
			case c.keyAck <- [2]uint32{m.a(), m.b()}:
			default: // nobody waits for it (any more)
			}
		case msgRevoked:
			closeFDs(fds)
			select {
			case c.revokeAck <- m.a():
			default: // nobody waits for it (any more)
			}
		case msgSeg, msgSegGone:
			r := segReply{id: m.a(), fd: -1, writable: m.b() == 1, gone: m.typ() == msgSegGone}
			if len(fds) == 1 && !r.gone {
				r.fd = fds[0]
			} else {
				closeFDs(fds)
			}
			c.arriveMu.Lock()
			if len(c.arrivals) >= maxArrivals {
				// A peer that floods us with segments while the
				// requester is idle would have this process hold
				// every descriptor it sends. Forget what is pending
				// and have the requester drop its mappings too: it
				// asks again for the segments it needs.
				for _, p := range c.arrivals {
					if p.fd >= 0 {
						unix.Close(p.fd)
					}
				}
				c.arrivals = c.arrivals[:0]
				c.overflow = true
			}
			c.arrivals = append(c.arrivals, r)
			c.arriveMu.Unlock()
			c.setHold(holdDirty)
			select {
			case c.segNote <- struct{}{}:
			default:
			}
		default:
			closeFDs(fds)
			c.events <- m
		}
	}
}

// handleEvents applies the peer's control messages, and the socket's end,
// to the QP.
func (c *conn) handleEvents() {
	defer c.wg.Done()
	for m := range c.events {
		switch m.typ() {
		case msgErr:
			ev := driver.EventType(m.a())
			if ev != driver.EventQPAccessErr && ev != driver.EventQPReqErr {
				ev = driver.EventQPFatal
			}
			c.withQP(func(q *qp) { q.fail(ev) })
		case msgDisc:
			c.withQP(func(q *qp) { q.toErr() })
			c.finish()
		case msgCommEst:
			// The peer's first request reached the QP: the QP raises
			// EventCommEst if it is still in RTR, as it would have had
			// its CPU taken part. A peer that lies costs at most the
			// one event.
			c.withQP(func(q *qp) { q.RequestArrived(q.ctx.EventQueue, q.userCtx) })
		case msgSRQLimit:
			if s := c.q.srq; s != nil {
				s.limitReached()
			}
		case msgRevoke:
			c.revokeWant.Store(m.a())
			c.setHold(holdRevoke)
			c.awaitRevokeAnswer()
		case msgOverrun:
			// Only from the QP's current connection: a peer of one
			// before a reset has no say over the CQ.
			c.withQP(func(q *qp) {
				q.recvCQ.markOverrun()
				q.fail(driver.EventQPFatal)
			})
		}
	}
	// The socket ended: the peer disconnected, died, or we closed it.
	c.withQP(func(q *qp) { q.toErr() })
	c.finish()
}

// withQP runs f with q.mu held if the QP still uses this connection.
func (c *conn) withQP(f func(q *qp)) {
	q := c.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if (q.conn == c || q.pending == c) && !q.destroyed {
		f(q)
	}
}

// finish marks the connection ended.
func (c *conn) finish() {
	c.doneOnce.Do(func() {
		c.ended.Store(true)
		c.setHold(holdEnded)
		close(c.done)
	})
}

// close ends the connection from this side: the peer is told, the socket
// closed, the goroutines waited for, and the peer's segments unmapped.
// q.mu must not be held.
func (c *conn) close() {
	c.closing.Do(func() {
		c.fenceMu.Lock()
		c.fenceClosed = true
		c.fenceMu.Unlock()
		// The QP's state, published before (Destroy, Reset, the move to
		// the error state), refuses the peer's next WRs; the peer
		// confirms that none of its WRs is still under way before the
		// connection is forgotten, since a Dereg asks only the
		// connections it knows: a WR in progress would otherwise go on
		// writing or reading a region after its Dereg has returned. (A
		// peer that does not answer within revokeTimeout loses the
		// connection, as for Dereg.) A connection that never started
		// has no reader to take the answer, and was never one a Dereg
		// asked: it closes at once.
		if c.started.Load() {
			c.revokePeer()
		}
		c.sendCtrl(msgDisc, 0, 0)
		c.sock.Close()
		c.wg.Wait()
		c.finish()
		c.q.mu.Lock()
		c.absorb()
		c.forgetKeys()
		for id, s := range c.segs {
			c.retire(id, s)
		}
		c.closeRetired() // no WR runs on the connection now
		c.q.mu.Unlock()
		c.q.ctx.forget(c)
		for _, s := range []*segment{c.peerBlock, c.srqSeg, c.cqSeg, c.keySeg, c.epochSeg} {
			if s != nil {
				s.close()
			}
		}
		if c.epochOwn != nil {
			c.epochOwn.release()
		}
		unix.Close(c.peerNotify.notifier.fd)
	})
}

// RemoteParam implements driver.Conn.
func (c *conn) RemoteParam() driver.ConnParam { return c.remote }

// Done implements driver.Conn.
func (c *conn) Done() <-chan struct{} { return c.done }

// Close implements driver.Conn: the QP moves to the error state and the
// peer is told.
func (c *conn) Close() error {
	c.withQP(func(q *qp) { q.toErr() })
	c.close()
	return nil
}

func parseFDs(oob []byte) []int {
	if len(oob) == 0 {
		return nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if f, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, f...)
		}
	}
	return fds
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

var errHandshake = errors.New("shm: malformed connection handshake")
