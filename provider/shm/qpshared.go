package shm

import (
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/internal/atomicrel"
	"github.com/goverbs/goverbs/verbs/driver"
)

// What a QP shares with the peer of one connection, and how the receive
// completions that peer writes are taken.
//
// A QP's block holds its header, its receive ring and its receive
// completion ring; its grant table is a segment of its own, which goes to
// the peer read-only. A QP gets fresh ones at each Reset: the peer of an
// earlier connection may keep its mappings, and then writes memory that
// nobody reads any more, and reads a grant table that nobody fills.
//
// The peer writes the completions of the receives its Sends (and Writes
// with immediate) consume into the QP's own completion ring, naming the
// receive by its position in the queue. Poll of the QP's receive CQ
// merges the rings of the QPs that complete receives there, and takes
// from each completion only a status, flags, an immediate and a byte
// count: the QP is the one whose ring it came from, and the WRID the one
// this process recorded when it posted the receive at that position
// (recvLog); a position with no receive posted, or one already
// completed, or a Send's byte count beyond the receive's buffers, is a
// lie, which cuts the peer off.

// qpShared is a QP's shared memory for one connection.
type qpShared struct {
	block    *segment
	grantSeg *segment
	grantsRO int       // the grant table's memfd, opened read-only for the peer
	rq       *recvRing // the header and receive ring (its log, with an SRQ, unused)
	cring    *cqRing   // the receive completion ring, in block
	// failing: the QP is being moved to the error state from Poll
	// (failLater): the peer wrote a completion that was not true, or a
	// receive's buffer no longer resolves. Guarded by the receive CQ's
	// mu.
	failing bool
}

// blockSize is the size of a QP's block: the header and receive ring of
// rqN entries of sges SGEs, then the receive completion ring, at
// recvCQOffset, of cN entries: as many as the QP's receive CQ holds,
// since that many of the QP's receive completions may wait for Poll
// before the CQ is overrun.
func blockSize(rqN, sges, cN int) int {
	return recvCQOffset(rqN, sges) + ringSize(cN, cqSlotSize)
}

// blockPad is where the block of the QP numbered qpn starts in its
// segment: a multiple of headerSize below a page, spread by the QP number
// (the multiplicative hash), so that the headers of many QPs' blocks,
// which a requester going round its connections reads for every WR, lie
// on different cache sets rather than all at the start of a page (the
// segment's), where they would evict each other.
func blockPad(qpn uint32) int { return int(qpn*0x9e3779b1>>28) * headerSize }

func recvCQOffset(rqN, sges int) int {
	return (ringSize(rqN, recvEntrySize(sges)) + headerSize - 1) &^ (headerSize - 1)
}

// srqLogSize is the number of positions an SRQ of n receives records: a
// receive of the SRQ whose completion is not yet polled holds back the
// posting of a receive at its position that many places on. (Those of
// a QP's own queue are bounded by the QP's receive CQ: qp.newQPShared.)
func srqLogSize(n int) int { return 4 * n }

// newQPShared makes the shared memory of a QP with attributes q.rqN,
// q.cap, q.srq and q.recvCQ.
func (q *qp) newQPShared() (*qpShared, error) {
	sges, cN := int(q.cap.MaxRecvSGE), q.recvCQ.n
	pad := blockPad(q.num)
	block, err := newSegment("qp", pad+blockSize(q.rqN, sges, cN))
	if err != nil {
		return nil, err
	}
	sh := &qpShared{block: block, grantsRO: -1}
	if sh.grantSeg, err = newSegment("grants", maxKeys*keySlotSize); err != nil {
		sh.close()
		return nil, err
	}
	if sh.grantsRO, err = sh.grantSeg.readOnlyFD(); err != nil {
		sh.close()
		return nil, err
	}
	// A receive of the QP's own queue is live from its PostRecv until its
	// completion is polled: at most as many as the queue holds, and then
	// as many as the CQ does.
	sh.rq = initRecvRing(block.mem[pad:], q.rqN, sges, pow2(q.rqN+cN))
	sh.cring = initCQRing(block.mem[pad+recvCQOffset(q.rqN, sges):], cN)
	return sh, nil
}

func (sh *qpShared) close() {
	for _, s := range []*segment{sh.block, sh.grantSeg} {
		if s != nil {
			s.close()
		}
	}
	if sh.grantsRO >= 0 {
		unix.Close(sh.grantsRO)
		sh.grantsRO = -1
	}
}

// adopt makes sh the QP's shared memory. The caller excludes whatever
// reads what it replaces: PostRecv (rqMu), Poll of the receive CQ (its
// mu), the grant table's writers (grantMu).
func (q *qp) adopt(sh *qpShared) {
	q.sh = sh
	q.block, q.grantSeg, q.grantsRO = sh.block, sh.grantSeg, sh.grantsRO
	q.grants = viewKeyTable(sh.grantSeg.mem, maxKeys, grantRotation(q.num))
	q.hdr = sh.rq.h
	if q.srq == nil {
		q.rq = sh.rq
	}
}

// prepareReset makes the shared memory a move to Reset hands the QP
// (renewShared), before the move: a QP that cannot get fresh memory
// stays where it is, and Modify fails. q.mu is held.
func (q *qp) prepareReset() error {
	if q.spare != nil {
		return nil
	}
	sh, err := q.newQPShared()
	if err != nil {
		return err
	}
	q.spare = sh
	return nil
}

// renewShared hands the QP, moving to Reset, the fresh shared memory
// prepareReset made, and closes its own mappings of the old: the peer
// of the connection before keeps its mappings, of memory no one else
// uses. Completions of the old ring that Poll has not taken are dropped,
// their receives with them. q.mu is held; the grant table is already
// emptied (grantTo).
func (q *qp) renewShared() {
	sh := q.spare
	if sh == nil {
		return
	}
	q.spare = nil
	old := q.sh
	q.recvCQ.mu.Lock()
	q.rqMu.Lock()
	q.grantMu.Lock()
	q.adopt(sh)
	q.grantMu.Unlock()
	q.rqMu.Unlock()
	q.releaseRecvs(old)
	q.recvCQ.watchRecvs()
	q.recvCQ.mu.Unlock()
	old.close()
}

// releaseRecvs takes the completions of old, a ring the QP no longer
// uses, so that the SRQ receives they completed are free to be posted
// again; the completions are dropped. The receive CQ's mu is held.
func (q *qp) releaseRecvs(old *qpShared) {
	if q.srq == nil {
		return // the QP's own receive queue goes with old
	}
	var wc driver.WorkCompletion
	for range old.cring.mask + 1 {
		if !old.cring.ready() {
			return
		}
		old.cring.take(&wc)
		if rec := q.srq.ring.log.claim(wc.WRID, true); rec != nil {
			rec.release()
		}
	}
}

// pushRecv adds a receive completion produced in this process (a
// flushed receive, wc.WRID its position) to the QP's completion ring,
// behind those the peer wrote, so that a receive queue completes in
// order. A full ring loses it: the CQ's overrun is recorded and raised,
// and the QP moves to the error state. q.mu is held.
func (q *qp) pushRecv(wc *driver.WorkCompletion) {
	c := q.recvCQ
	if c.destroyed.Load() {
		q.fail(driver.EventQPFatal)
		return
	}
	ok := q.sh.cring.produce(wc, nil)
	if ok {
		c.bells.ring(bellOf(q.num))
	}
	if !c.notifyOrOverrun(wc, ok) {
		q.fail(driver.EventQPFatal)
	}
}

// recvWatch is the word that says whether the next completion of a QP's
// ring is there, and the value that says so: Poll looks at these, side
// by side, rather than at each QP and its ring.
type recvWatch struct {
	seq  *atomic.Uint64
	want uint64
}

// watch points w at the next completion of r.
func (w *recvWatch) watch(r *cqRing) {
	w.seq, w.want = &r.slots[r.head&r.mask].seq, r.head+1
}

// watchRecvs points the watches at the next completion of each QP's
// ring, after the QPs or their rings changed. The CQ's mu is held.
func (c *cq) watchRecvs() {
	c.recvWatch = c.recvWatch[:0]
	for _, q := range c.recvQPs {
		c.recvWatch = append(c.recvWatch, recvWatch{})
		c.recvWatch[len(c.recvWatch)-1].watch(q.sh.cring)
	}
	c.recvNext = 0
	c.rb.reset(c.recvQPs)
	c.ownOnly = len(c.recvWatch) == 0 && !c.destroyed.Load()
}

// addRecvQP has Poll take q's receive completions, before q can be
// connected.
func (c *cq) addRecvQP(q *qp) {
	c.mu.Lock()
	c.recvQPs = append(c.recvQPs, q)
	c.watchRecvs()
	c.mu.Unlock()
}

// removeRecvQP stops taking q's receive completions, before its block is
// unmapped; those Poll has not taken are dropped.
func (c *cq) removeRecvQP(q *qp) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, r := range c.recvQPs {
		if r == q {
			q.releaseRecvs(q.sh)
			c.recvQPs = append(c.recvQPs[:i], c.recvQPs[i+1:]...)
			c.recvQPs = c.recvQPs[:len(c.recvQPs):len(c.recvQPs)]
			c.watchRecvs()
			return
		}
	}
}

// takeRecv takes a receive completion of one of the CQ's QPs into wc,
// starting after the QP it took the last one from, so that a QP whose
// peer keeps writing completions does not keep the others' waiting; false
// if none waits. Completions that are lies are dropped (acceptRecv). The
// CQ's mu is held.
func (c *cq) takeRecv(wc *driver.WorkCompletion) bool {
	if len(c.recvWatch) == 0 {
		return false // a CQ of send completions only: inlined in Poll
	}
	return c.takeRecvOfAny(wc)
}

// takeRecvOfAny is takeRecv for a CQ into which QPs complete receives:
// of a few QPs, it looks at each QP's ring; of more, at those whose
// doorbells rang (takeRecvRung).
func (c *cq) takeRecvOfAny(wc *driver.WorkCompletion) bool {
	w := c.recvWatch
	if len(w) > bellMinQPs {
		return c.takeRecvRung(wc)
	}
	for k := c.recvNext; k < len(w); k++ {
		if w[k].seq.Load() == w[k].want && c.takeRecvOf(k, wc) {
			return true
		}
	}
	for k := range min(c.recvNext, len(w)) {
		if w[k].seq.Load() == w[k].want && c.takeRecvOf(k, wc) {
			return true
		}
	}
	return false
}

// takeRecvRung is takeRecvOfAny for a CQ of many QPs: it looks at the
// QPs queued because their doorbells rang, in turn, and refills the
// queue from the doorbells when it runs dry, at most twice a call, so
// that a peer that keeps ringing cannot hold Poll. A QP a completion is
// taken from goes to the back of the queue: it may have more, which wait
// for the others'. The CQ's mu is held.
func (c *cq) takeRecvRung(wc *driver.WorkCompletion) bool {
	w, r := c.recvWatch, &c.rb
	for refills := 0; ; {
		k, ok := r.pop()
		if !ok {
			if refills == 2 || !r.refill(c.bells) {
				return false
			}
			refills++
			continue
		}
		if w[k].seq.Load() == w[k].want && c.takeRecvOf(int(k), wc) {
			r.push(k)
			return true
		}
	}
}

// takeRecvOf takes the completion waiting in the ring of the CQ's QP k
// (its watch says one is there) into wc, and reports false if it was a
// lie, and so was every one after it. The CQ's mu is held.
func (c *cq) takeRecvOf(k int, wc *driver.WorkCompletion) bool {
	q := c.recvQPs[k]
	r := q.sh.cring
	ok := q.acceptRecv(wc, r.peek(wc))
	r.release()
	ok = ok || q.skipLies(r, wc)
	c.recvWatch[k].watch(r)
	if ok {
		if c.recvNext = k + 1; c.recvNext == len(c.recvQPs) {
			c.recvNext = 0
		}
	}
	return ok
}

// skipLies takes the completions after a lie from the QP's ring r until
// one is true, into wc; false if none is. A lying peer's completions are
// dropped (and it is cut off): the ring holds at most its size of them.
// The CQ's mu is held.
func (q *qp) skipLies(r *cqRing, wc *driver.WorkCompletion) bool {
	for range r.mask {
		if !r.ready() {
			return false
		}
		ok := q.acceptRecv(wc, r.peek(wc))
		r.release()
		if ok {
			return true
		}
	}
	return false
}

// recvPending reports whether a receive completion waits in the ring of
// one of the CQ's QPs (with solicitedOnly, a solicited or failed one).
// The CQ's mu is held.
func (c *cq) recvPending(solicitedOnly bool) bool {
	for _, q := range c.recvQPs {
		if q.sh.cring.pending(solicitedOnly) {
			return true
		}
	}
	return false
}

// acceptRecv checks a receive completion read from the QP's ring, in
// slot s, against the record of the receive posted at the position it
// names, and makes it say what this process knows: the QP, and the
// receive's WRID. A completion naming no receive posted there that is
// not yet completed is dropped (false); one that claims more bytes for a
// Send than the receive's buffers hold completes it as a length error,
// and the peer is cut off. A Send carried in the slot is placed into the
// receive's buffers (placeInline). The receive CQ's mu is held.
func (q *qp) acceptRecv(wc *driver.WorkCompletion, s *cqSlot) bool {
	log, shared := q.sh.rq.log, false
	if q.srq != nil {
		log, shared = q.srq.ring.log, true
	}
	rec := log.claim(wc.WRID, shared)
	if rec == nil {
		q.peerLied()
		return false
	}
	if !shared {
		// The receive's own position, from this process's record.
		atomicrel.StoreUint64(&q.sh.rq.polled, rec.state.Load())
	}
	wc.WRID, wc.QPNum = rec.wrid.Load(), q.num
	q.checkInvalidated(wc)
	switch {
	case s.placed != 0 && wc.Status == driver.WCSuccess:
		q.placeInline(wc, rec, s)
	case wc.Opcode == driver.WCRecv && wc.Status == driver.WCSuccess && uint64(wc.ByteLen) > rec.length.Load():
		wc.Status, wc.ByteLen = driver.WCLocLenErr, 0
		q.peerLied()
	}
	rec.release()
	return true
}

// placeInline copies the Send carried in slot s, of wc.ByteLen bytes,
// into the buffers of the receive rec records, and turns wc into an
// error completion if that cannot be right. The length is the one read
// once out of the slot, and checked against the slot's room and the
// receive's own record, never the peer's ring: a Send longer than either
// completes the receive as a length error, with nothing written, and a
// Send carried inline where the peer must not place one (not a Send, or
// a receive with more buffers than its record holds) as a general error;
// the peer is cut off. A buffer that no longer resolves (its region
// deregistered since the receive was posted) completes it as a
// protection error, and the QP moves to the error state.
func (q *qp) placeInline(wc *driver.WorkCompletion, rec *recvRec, s *cqSlot) {
	n := uint64(wc.ByteLen)
	switch {
	case wc.Opcode != driver.WCRecv || rec.nsge > recSGEs:
		wc.Status, wc.ByteLen = driver.WCGeneralErr, 0
		q.peerLied()
	case n > inlineMax || n > rec.length.Load():
		wc.Status, wc.ByteLen = driver.WCLocLenErr, 0
		q.peerLied()
	case !q.scatterInline(rec, s.inline[:n]):
		wc.Status, wc.ByteLen = driver.WCLocProtErr, 0
		q.failLater(false, driver.EventQPAccessErr)
	}
}

// scatterInline copies b into the buffers of the receive rec records, in
// order, resolving each in the QP's protection domain: false if one does
// not resolve. The buffers hold all of b (placeInline checked).
func (q *qp) scatterInline(rec *recvRec, b []byte) bool {
	if rec.nsge == 1 { // the common case, without the loop
		g := &rec.sge[0]
		dst, ok := q.ctx.span(g.LKey, q.pd, g.Addr, uint64(len(b)), driver.AccessLocalWrite)
		copy(dst, b)
		return ok
	}
	for i := range rec.nsge {
		if len(b) == 0 {
			break
		}
		g := &rec.sge[i]
		k := min(uint64(g.Length), uint64(len(b)))
		dst, ok := q.ctx.span(g.LKey, q.pd, g.Addr, k, driver.AccessLocalWrite)
		if !ok {
			return false
		}
		b = b[copy(dst, b):]
	}
	return true
}

// peerLied cuts off the peer that wrote a false completion into the QP's
// ring: the QP moves to the error state and the connection ends, once.
// The receive CQ's mu is held.
func (q *qp) peerLied() { q.failLater(true, driver.EventQPFatal) }

// failLater moves the QP to the error state, raising ev, once, and with
// breakConn ends its connection. Poll holds the CQ's mu, which ranks
// after q.mu: the work is left to a goroutine. The receive CQ's mu is
// held.
func (q *qp) failLater(breakConn bool, ev driver.EventType) {
	sh := q.sh
	if sh.failing {
		return
	}
	sh.failing = true
	go func() {
		q.mu.Lock()
		defer q.mu.Unlock()
		if q.sh != sh || q.destroyed {
			return // reset or destroyed meanwhile: that connection is gone
		}
		if c := q.conn; c != nil && breakConn {
			c.peerBroke()
		}
		q.fail(ev)
	}()
}
