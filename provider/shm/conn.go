package shm

import (
	"encoding/binary"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

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
	q      *qp
	sock   *net.UnixConn
	pid    int
	remote driver.ConnParam

	peerBlock *segment
	peerHdr   *ringHeader // the peer QP's header: state, access, attributes
	peerGen   uint32      // the peer QP's gen when it connected: a later one is another connection's
	started   atomic.Bool // start has run: the reader answers control messages
	peerRecv  *recvRing   // the peer's receive queue, or its SRQ
	peerSRQ   bool
	srqSeg    *segment
	cqSeg     *segment
	peerCQ    *cqRing
	keySeg    *segment  // the peer's grant table for this connection, mapped read-only
	keys      *keyTable // its view
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
	segs  map[uint32]*segment
	segRW map[uint32]bool
	// retired: mappings absorb replaced or dropped while a target of the
	// WR being executed (dst) lay in them, unmapped once the WR is done
	// (closeRetired): a WR that resolved one of its SGEs into a mapping
	// may see it replaced while it resolves the next. Any other mapping
	// absorb drops is unmapped at once.
	retired []*segment
	mapped  int // bytes of the mappings in segs
	// The segment a requester waits for, and whether the peer refused
	// it. Only that refusal is kept: a peer can send refusals for any
	// number of segments.
	awaiting     uint32
	awaitingSet  bool
	awaitRefused bool
	arriveMu     sync.Mutex
	arrivals     []segReply // at most maxArrivals
	overflow     bool       // arrivals were dropped: drop the mappings too
	dirty        atomic.Bool
	segNote      chan struct{}
	// segWaitUntil bounds the waits for segments of the WR being executed
	// (segment), all of them together; zero between WRs. Guarded by q.mu.
	segWaitUntil time.Time

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
	// revokeWant: the peer's msgRevoke waiting for an answer (0: none),
	// given by whoever sees first that no WR is under way (answerRevoke).
	revokeWant atomic.Uint32
	ended      atomic.Bool // done is closed
	// fenceMu guards fenceClosed, set once close has begun, after which
	// lastWQE starts no goroutine (close waits for those in wg).
	fenceMu     sync.Mutex
	fenceClosed bool
	// The requester's scratch space, guarded by q.mu: a Send's receive
	// and its resolved buffers (kept here, not zeroed on the stack for
	// every WR), and the resolved keys.
	rent     recvEntry
	dst      [maxSGE]remote
	kc       keyCache
	doneOnce sync.Once
	wg       sync.WaitGroup
	closing  sync.Once
}

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

// awaitRevokeAnswer answers the peer's msgRevoke once no WR of this
// side's is under way: at once if the QP's lock is free, else as soon as
// the WR that holds it is done (the requester answers then, between two
// WRs: answerRevoke). A WR checks a key's version once, before its copy,
// so the WRs after that point see the key revoked.
func (c *conn) awaitRevokeAnswer() {
	q := c.q
	var tick *time.Ticker
	for c.revokeWant.Load() != 0 {
		if q.mu.TryLock() {
			c.answerRevoke()
			q.mu.Unlock()
			break
		}
		if tick == nil {
			tick = time.NewTicker(50 * time.Microsecond)
			defer tick.Stop()
		}
		select {
		case <-c.gone:
			return
		case <-tick.C:
		}
	}
}

// answerRevoke answers a msgRevoke waiting for it. q.mu is held, and no
// WR is under way.
func (c *conn) answerRevoke() {
	if seq := c.revokeWant.Swap(0); seq != 0 {
		c.kc = keyCache{}
		c.sendCtrl(msgRevoked, seq, 0)
	}
}

// revokeTimeout bounds how long Dereg waits for a peer to confirm that no
// WR of its uses the region any more; a peer that does not is taken for
// dead (its connection ends).
const revokeTimeout = segWait + time.Second

// revokePeer asks the peer to confirm that none of its WRs still uses a
// key this side revoked, and waits for the answer, the connection's end,
// or revokeTimeout (which ends the connection). No lock is held: the
// peer's answer may wait for a WR of its that waits for this process.
func (c *conn) revokePeer() {
	c.revokeMu.Lock()
	defer c.revokeMu.Unlock()
	if c.ended.Load() {
		return
	}
	c.revokeSeq++
	seq := c.revokeSeq
	c.sendCtrl(msgRevoke, seq, 0)
	t := time.NewTimer(revokeTimeout)
	defer t.Stop()
	for {
		select {
		case got := <-c.revokeAck:
			if got == seq {
				return
			}
		case <-c.gone:
			return
		case <-c.done:
			return
		case <-t.C:
			c.sock.Close()
			return
		}
	}
}

// lastWQE raises EventQPLastWQEReached for the QP, on an SRQ, that has
// moved to the error state, once the peer has confirmed that none of its
// WRs is under way (revokePeer): a Send that took a receive of the SRQ
// before the state was published goes on placing into it until then. A
// connection that never started, or is closing, raises it at once. One
// that the QP has left meanwhile (Reset, Destroy) raises nothing. q.mu is
// held.
func (c *conn) lastWQE() {
	c.fenceMu.Lock()
	defer c.fenceMu.Unlock()
	q := c.q
	if !c.started.Load() || c.fenceClosed {
		q.ctx.Event(driver.EventQPLastWQEReached, q.userCtx)
		return
	}
	resets := q.resets
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.revokePeer()
		q.mu.Lock()
		if !q.destroyed && q.attr.State == driver.QPSErr && q.resets == resets {
			q.ctx.Event(driver.EventQPLastWQEReached, q.userCtx)
		}
		q.mu.Unlock()
	}()
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
			c.dirty.Store(true)
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
		case msgSRQLimit:
			if s := c.q.srq; s != nil {
				s.limitReached()
			}
		case msgRevoke:
			c.revokeWant.Store(m.a())
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
		close(c.done)
	})
}

// serveKey answers the peer's request for a key its grant table lacks
// (the table is filled as regions become reachable, so this is a key
// that races its registration, or a wrong one): granted, and written into
// the QP's grant table, if it names a region of the QP's PD that peers
// may reach; refused otherwise, which counts against the peer in the
// listener's guard, and once the guard refuses the peer, the connection
// ends.
func (c *conn) serveKey(key uint32) {
	q, ctx := c.q, c.q.ctx
	ctx.mu.RLock()
	m := ctx.lookupMR(key)
	ok := m != nil && q.reaches(m)
	if ok {
		q.grantMu.Lock()
		ok = q.grantConn == c && q.grantLocked(key)
		q.grantMu.Unlock()
	}
	ctx.mu.RUnlock()
	granted := uint32(0)
	if ok {
		granted = 1
	}
	c.sendCtrl(msgKey, key, granted)
	if !ok && c.guard != nil && c.guard.Fail(c.peerID) > 0 {
		// Cut off: the peer's QP fails, and this side's with it when the
		// socket ends (handleEvents).
		c.peerError(driver.EventQPAccessErr)
		c.sock.CloseWrite()
		c.sock.CloseRead()
	}
}

// askKey asks the peer to grant key and waits for the answer, within the
// WR's bound on waits (segWait); true if the peer granted it, which it
// then wrote into its grant table. q.mu is held.
func (c *conn) askKey(key uint32) bool {
	if c.refusedSet && c.refused == key {
		return false
	}
	for len(c.keyAck) > 0 {
		<-c.keyAck // an answer that came too late for an earlier ask
	}
	c.sendCtrl(msgGetKey, key, 0)
	if c.segWaitUntil.IsZero() {
		c.segWaitUntil = time.Now().Add(segWait)
	}
	t := time.NewTimer(time.Until(c.segWaitUntil))
	defer t.Stop()
	for {
		select {
		case a := <-c.keyAck:
			if a[0] == key {
				if a[1] != 1 {
					c.refused, c.refusedSet = key, true
				}
				return a[1] == 1
			}
		case <-c.done:
			return false
		case <-c.gone:
			return false
		case <-t.C:
			return false
		}
	}
}

// serveSegment answers a peer's request for one of this process's
// segments, as pushSegment does.
func (c *conn) serveSegment(id uint32, write bool) {
	ctx := c.q.ctx
	ctx.segMu.Lock()
	defer ctx.segMu.Unlock()
	c.pushSegmentLocked(id, ctx.segs[id], write)
}

// pushSegmentLocked sends segment id to the peer: only a segment with
// remote rights or receive buffers, and a region of the QP's PD, is ever
// handed out, writable only when a region on it may be written by the
// peer (or, with wantWrite false, whenever it may); otherwise the message
// carries no descriptor. ctx.segMu is held.
func (c *conn) pushSegmentLocked(id uint32, si *segInfo, wantWrite bool) {
	fd, writable := -1, false
	if si.inPD(c.q.pd) {
		if ok, w := si.shareable(c.q, true); ok && w {
			fd, writable = si.seg.fd, true
		} else if ok, _ := si.shareable(c.q, false); ok && !wantWrite {
			if ro, err := si.seg.readOnlyFD(); err == nil {
				fd = ro
				defer unix.Close(ro)
			}
		}
	}
	var m ctrl
	b := uint32(0)
	if writable {
		b = 1
	}
	m.set(msgSeg, id, b)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if fd >= 0 {
		c.writeCtrl(m[:], unix.UnixRights(fd))
	} else {
		c.writeCtrl(m[:], nil)
	}
}

// pushShareable sends the peer every segment it may touch, so that its
// first access to a region needs nothing from this process.
func (c *conn) pushShareable() {
	ctx := c.q.ctx
	ctx.segMu.Lock()
	defer ctx.segMu.Unlock()
	for id, si := range ctx.segs {
		if ok, _ := si.shareable(c.q, false); ok && si.inPD(c.q.pd) {
			c.pushSegmentLocked(id, si, false)
		}
	}
}

// absorb applies the segments the peer sent or freed; q.mu is held.
func (c *conn) absorb() {
	if !c.dirty.Load() || !c.dirty.Swap(false) {
		return
	}
	c.kc = keyCache{}
	c.arriveMu.Lock()
	arrivals, overflow := c.arrivals, c.overflow
	c.arrivals, c.overflow = nil, false
	c.arriveMu.Unlock()
	if overflow {
		for id, s := range c.segs {
			c.retire(id, s)
		}
	}
	for _, r := range arrivals {
		if old := c.segs[r.id]; old != nil && !r.gone && r.fd >= 0 && c.segRW[r.id] == r.writable {
			// The segment again, as it is mapped: the peer pushed it
			// when the connection started and then answered a request
			// for it sent before that push arrived. (An id is not
			// reused before its msgSegGone, which this side reads
			// first, and a sealed segment's size cannot change.)
			unix.Close(r.fd)
			continue
		}
		if old := c.segs[r.id]; old != nil && (r.gone || r.fd >= 0) {
			c.retire(r.id, old)
		}
		switch {
		case r.fd < 0 || r.gone:
			// No descriptor, or the segment freed or withdrawn (its
			// regions for this QP's PD deregistered): a refusal.
			if c.awaitingSet && r.id == c.awaiting {
				c.awaitRefused = true
			}
		default:
			if s, err := mapPeerSegment(r.fd, 1, r.writable); err == nil {
				if !c.makeRoom(len(s.mem)) {
					// The process's budget is spent by other
					// connections: refused, as a segment not handed out.
					s.close()
					if c.awaitingSet && r.id == c.awaiting {
						c.awaitRefused = true
					}
					continue
				}
				c.segs[r.id], c.segRW[r.id] = s, r.writable
				c.mapped += len(s.mem)
				peerMaps.Add(1)
				peerBytes.Add(int64(len(s.mem)))
			}
		}
	}
}

// Bounds on the peer's segments mapped at once, in number and in bytes:
// a peer may push as many as it likes, and each takes address space and
// one of the process's mappings (vm.max_map_count, 65530 by default).
// Each connection has its bound, and the process one over all of them,
// so that many connections, of one peer or several, cannot spend the
// process's mappings between them (the runtime dies when its own mmap
// fails).
const (
	maxPeerMappings = 4096
	maxPeerMapped   = 1 << 40
)

// The process's bounds, and what its connections have mapped of their
// peers' segments (variables for tests). Past the budget, each
// connection may still map its first minPeerMappings segments and
// minPeerMapped bytes, up to a hard limit of twice the budget, so that
// peers who spend the budget cannot starve a connection of the few
// segments it works with; the hard limit, with the four mappings each
// connection makes at setup for as many connections as a context takes,
// stays well under vm.max_map_count (65530) and the address space.
var (
	maxProcPeerMappings int64 = 16384
	maxProcPeerMapped   int64 = 8 << 40
	minPeerMappings           = 8
	minPeerMapped             = 1 << 30
	peerMaps, peerBytes atomic.Int64
)

// makeRoom retires mappings until one of n more bytes fits under the
// bounds; any mapping can go, since the requester asks the peer again
// for a segment it needs. It reports false when the process's bounds
// stay spent once this connection has none left. q.mu is held.
func (c *conn) makeRoom(n int) bool {
	fits := func() bool {
		if len(c.segs) >= maxPeerMappings || c.mapped+n > maxPeerMapped {
			return false
		}
		maps, bytes := peerMaps.Load(), peerBytes.Load()+int64(n)
		return (maps < maxProcPeerMappings || len(c.segs) < minPeerMappings && maps < 2*maxProcPeerMappings) &&
			(bytes <= maxProcPeerMapped || c.mapped+n <= minPeerMapped && bytes <= 2*maxProcPeerMapped)
	}
	for id, s := range c.segs {
		if fits() {
			return true
		}
		c.retire(id, s)
	}
	return fits()
}

// retire drops the mapping s of segment id: unmapped now, or once the
// WR being executed is done if it resolved a target into it. q.mu is
// held.
func (c *conn) retire(id uint32, s *segment) {
	c.mapped -= len(s.mem)
	peerMaps.Add(-1)
	peerBytes.Add(-int64(len(s.mem)))
	delete(c.segs, id)
	delete(c.segRW, id)
	if c.targets(s) {
		c.retired = append(c.retired, s)
		return
	}
	s.close()
}

// targets reports whether a target in dst lies in mapping s. Entries
// that earlier WRs left are compared too (by address only: a stale one
// only defers the unmapping to the end of the current WR). q.mu is held.
func (c *conn) targets(s *segment) bool {
	if len(s.mem) == 0 {
		return false
	}
	lo := uintptr(unsafe.Pointer(&s.mem[0]))
	hi := lo + uintptr(len(s.mem))
	for i := range c.dst {
		if b := c.dst[i].b; len(b) > 0 {
			if p := uintptr(unsafe.Pointer(&b[0])); p >= lo && p < hi {
				return true
			}
		}
	}
	return false
}

// closeRetired unmaps the mappings absorb retired; q.mu is held, and no
// WR is being executed.
func (c *conn) closeRetired() {
	for i, s := range c.retired {
		s.close()
		c.retired[i] = nil
	}
	c.retired = c.retired[:0]
}

// segment returns the peer's segment id mapped here, writable if asked.
// The peer normally pushed it already; if not, it is asked for it, and the
// answer awaited. q.mu is held.
func (c *conn) segment(id uint32, write bool) (*segment, bool) {
	c.absorb()
	if s := c.segs[id]; s != nil && (!write || c.segRW[id]) {
		return s, true
	}
	c.awaiting, c.awaitingSet, c.awaitRefused = id, true, false
	defer func() { c.awaitingSet = false }()
	b := uint32(0)
	if write {
		b = 1
	}
	c.sendCtrl(msgGetSeg, id, b)
	if c.segWaitUntil.IsZero() {
		c.segWaitUntil = time.Now().Add(segWait)
	}
	t := time.NewTimer(time.Until(c.segWaitUntil))
	defer t.Stop()
	for {
		select {
		case <-c.segNote:
			c.absorb()
			if s := c.segs[id]; s != nil && (!write || c.segRW[id]) {
				return s, true
			}
			if c.awaitRefused {
				return nil, false
			}
		case <-c.done:
			return nil, false
		case <-c.gone:
			// The peer died or hung up: handleEvents, which closes
			// done, waits for q.mu, which this requester holds.
			return nil, false
		case <-t.C:
			return nil, false
		}
	}
}

// segWait bounds how long one WR waits for the peer to send the segments
// it names.
const segWait = 2 * time.Second

// procCopy copies between local memory b and the peer's process memory
// at addr: out writes the peer, else reads it.
func (c *conn) procCopy(b []byte, addr uint64, out bool) bool {
	if len(b) == 0 {
		return true
	}
	local := [1]unix.Iovec{{Base: &b[0]}}
	local[0].SetLen(len(b))
	rem := [1]unix.RemoteIovec{{Base: uintptr(addr), Len: len(b)}}
	var n int
	var err error
	if out {
		n, err = unix.ProcessVMWritev(c.pid, local[:], rem[:], 0)
	} else {
		n, err = unix.ProcessVMReadv(c.pid, local[:], rem[:], 0)
	}
	return err == nil && n == len(b)
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
		c.kc = keyCache{}
		for id, s := range c.segs {
			c.retire(id, s)
		}
		c.closeRetired() // no WR runs on the connection now
		c.q.mu.Unlock()
		c.q.ctx.forget(c)
		for _, s := range []*segment{c.peerBlock, c.srqSeg, c.cqSeg, c.keySeg} {
			if s != nil {
				s.close()
			}
		}
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

var _ = unsafe.Pointer(nil)
