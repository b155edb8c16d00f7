package shm

import (
	"sync"
	"sync/atomic"

	"github.com/goverbs/goverbs/internal/grant"
	"github.com/goverbs/goverbs/internal/sglist"
	"github.com/goverbs/goverbs/internal/soft"
	"github.com/goverbs/goverbs/internal/spin"
	"github.com/goverbs/goverbs/internal/swq"
	"github.com/goverbs/goverbs/verbs/driver"
)

// qpNums numbers the QPs of the process.
var qpNums = soft.QPNumbers{Base: 0x100}

// qp is a shm queue pair. Its send queue is private memory: this process
// executes its own WRs. Its block — state, responder attributes, the
// receive ring when it has no SRQ, and the ring of receive completions —
// is shared with the peer, whose Sends consume the receives and complete
// them there (qpshared.go).
type qp struct {
	// The fields every WR reads, in a struct of their own, small: a
	// requester going round a thousand QPs misses the TLB on each page of
	// a QP's that a WR touches, and these QPs share pages. The rest,
	// qpCold, is read through the pointer.
	//
	// mu guards attr, conn, hot, lastMR and destroyed, what sq holds,
	// and those of qpCold's fields that say so; sendCQ and cap never
	// change. It is a spin lock, since PostSend takes it on every call:
	// hold it only briefly. (A holder that blocks — a control message to
	// a peer whose socket is full — makes waiters nap until it lets go.)
	mu        spin.Lock
	attr      driver.QPAttr
	sq        *swq.Queue
	conn      *conn    // the connection, set on the move to RTR (setConn)
	hot       *connHot // conn's hot, or nil
	lastMR    *mr      // what the last local key a WR named resolved to (localSpan), or nil
	sendCQ    *cq
	cap       driver.QPCap
	destroyed bool
	*qpCold
}

// qpCold is the part of a qp that a WR on postFast's road does not read.
type qpCold struct {
	soft.QP // Num, Query, Modify
	ctx     *devCtx
	pd      *pd
	num     uint32
	userCtx any
	recvCQ  *cq
	srq     *srq
	block   *segment
	hdr     *ringHeader
	// grants is the key table the QP's peer reads: only the keys it
	// asked for and was granted (serveKey), each a region of the QP's
	// PD with remote rights or a receive posted in it. Its memfd goes
	// to the peer read-only (grantsRO). grantMu serialises its writers
	// and guards grantConn, the connection whose requests it answers;
	// it is taken after devCtx.mu and q.mu, and nothing blocks under it.
	grantSeg *segment
	grants   *keyTable
	// mwWait is the memory window operation the send queue waits for
	// (guarded by mu); invalidated the keys the peer had invalidated
	// (mw.go).
	mwWait      windowWait
	invalidated invalidated
	grantsRO    int
	grantMu     sync.Mutex
	grantConn   *conn
	grantEpoch  *epochSlot // grantConn's epoch word, held while grants points at it
	// recvExposed: the regions receives of this QP's own queue were
	// posted in (exposeForRecv).
	recvExposed recvSet
	rq          *recvRing // nil with an SRQ
	rqN         int

	// sh: the shared memory of the QP's connection, which block,
	// grantSeg, grantsRO, grants, hdr and rq are views of; spare: the
	// fresh one its next Reset hands it (prepareReset). sh is replaced
	// under mu, rqMu, grantMu and the receive CQ's mu; spare is guarded
	// by mu.
	sh, spare *qpShared
	// peerAccess: the QP's remote access flags as publish last saw them,
	// which bound what its peer is granted (peerRights).
	peerAccess atomic.Uint32

	// Guarded by qp.mu, as far as sqdPending.
	rnr     swq.RNR
	pending *conn       // a connection cm is setting up
	result  [8]byte     // an atomic's result on its way to the local buffer
	local   sglist.List // the local side of the WR being executed
	// resets counts the moves to Reset, in this process's memory (the
	// shared header's gen is the peer's to write too).
	resets uint64
	// sqdPending: the QP moved to SQD while a Send retried
	// receiver-not-ready, and EventSQDrained waits for it (sqDrained).
	sqdPending bool

	// rqMu serialises the receive queue's producer (PostRecv) with its
	// reset, and its flush waits for it, so that a receive posted while
	// the QP moves to the error state is flushed by one or the other.
	// Lock order: mu, then rqMu; nothing blocks under it.
	rqMu spin.Lock

	// postState mirrors attr.State, or is stateDestroyed, for PostRecv,
	// which reads it without q.mu; publish keeps it.
	postState atomic.Uint32
}

// stateDestroyed is qp.postState once the QP is destroyed.
const stateDestroyed = 0xff

func (p *pd) CreateQP(a driver.QPInitAttr) (driver.QP, error) {
	scq, rcq, s, err := soft.CheckQPInit[*cq, *srq](a, "shm", maxSGE, deviceAttr.MaxInlineData)
	if err != nil {
		return nil, err
	}
	if s != nil && s.failed.Load() {
		return nil, errSRQFailed
	}
	c := a.Cap
	q := &qp{sendCQ: scq, cap: c, sq: swq.New(c, a.SigAll),
		qpCold: &qpCold{ctx: p.ctx, pd: p, userCtx: a.UserCtx, recvCQ: rcq, srq: s, num: qpNums.Next()}}
	q.rnr.Init(q.rnrExpired)
	q.sq.MW = true // memory windows: mw.go
	q.rqN = 1
	if s == nil {
		q.rqN = pow2(int(c.MaxRecvWR))
	}
	sh, err := q.newQPShared()
	if err != nil {
		return nil, err
	}
	q.adopt(sh)
	closeSegs := sh.close
	q.attr.Cap = c
	q.QP.Init(q.num, &q.mu, q, nil, &q.attr, &q.destroyed, &q.sqdPending, nil)
	q.publish()
	scq.addSender(q)
	p.ctx.mu.Lock()
	defer p.ctx.mu.Unlock()
	if err := soft.Admit(p.ctx.closed || p.Released(), len(p.ctx.qps), deviceAttr.MaxQP); err != nil {
		closeSegs()
		return nil, err
	}
	if p.ctx.qps == nil {
		p.ctx.qps = map[*qp]bool{}
	}
	p.ctx.qps[q] = true
	rcq.addRecvQP(q)
	return q, nil
}

// publish writes the responder's view of the QP into its shared block,
// and moves its grant table's epoch on (keyTable.touch).
func (q *qp) publish() {
	if q.destroyed {
		q.postState.Store(stateDestroyed)
	} else {
		q.postState.Store(uint32(q.attr.State))
	}
	q.hdr.access.Store(uint32(q.attr.AccessFlags))
	q.hdr.attrs.Store(uint32(q.attr.MinRNRTimer) | uint32(q.attr.MaxDestRdAtomic)<<8)
	q.hdr.pd.Store(q.pd.id)
	q.hdr.state.Store(uint32(q.attr.State))
	// The peer's fastPaths read the grant epoch, not the header: the
	// header changed, so does the epoch.
	q.grantMu.Lock()
	q.grants.touch()
	q.grantMu.Unlock()
	q.noteAccess()
}

// VetoModify implements soft.QPHooks: a move to Reset needs the fresh
// shared memory it hands the QP (prepareReset); a QP whose SRQ failed
// moves only to Reset or the error state, as it could never receive.
func (q *qp) VetoModify(next driver.QPState, _ *driver.QPAttr) error {
	switch {
	case next == driver.QPSReset:
		return q.prepareReset()
	case next != driver.QPSErr && q.srq != nil && q.srq.failed.Load():
		return errSRQFailed
	}
	return nil
}

// Modified implements soft.QPHooks: the QP's new state and attributes
// are published to its peer.
func (q *qp) Modified(driver.QPAttrMask) { q.publish() }

// EnterReset implements soft.QPHooks.
func (q *qp) EnterReset() { q.reset() }

// EnterRTR implements soft.QPHooks: the connection cm set up serves the
// peer's requests.
func (q *qp) EnterRTR() {
	if q.pending != nil {
		q.setConn(q.pending)
		q.pending = nil
	}
}

// setConn makes c (or none, if nil) the QP's connection. q.mu is held.
func (q *qp) setConn(c *conn) {
	q.conn, q.hot = c, nil
	if c != nil {
		q.hot = c.hot
	}
}

// EnterRTS implements soft.QPHooks.
func (q *qp) EnterRTS() { q.sq.Progress(q) }

// DrainSQ implements soft.QPHooks: execution is synchronous, so only a
// Send retrying receiver-not-ready can be under way (sqDrained).
func (q *qp) DrainSQ() { q.sqDrained() }

// EnterErr implements soft.QPHooks.
func (q *qp) EnterErr() { q.toErr() }

// reset empties both queues without completions.
func (q *qp) reset() {
	q.rnr.Reset()
	q.mwWait = windowWait{}
	q.invalidated.clear()
	q.sendCQ.mu.Lock() // serialises the reset with Retire (swq.Queue.Reset)
	q.sq.Reset()
	q.sendCQ.mu.Unlock()
	q.attr = driver.QPAttr{Cap: q.cap}
	q.resets++
	q.hdr.gen.Add(1)
	q.grantTo(nil)
	if c := q.conn; c != nil {
		// The peer's WRs see the QP in Reset from now on (close waits
		// for the one under way). close waits for the connection's
		// goroutines, which may wait for q.mu: close it without holding
		// it up.
		q.publish()
		q.setConn(nil)
		go c.close()
	}
	q.renewShared()
}

// toErr moves the QP to the error state and flushes every outstanding
// send and receive with WCWRFlushErr. q.mu is held.
func (q *qp) toErr() {
	if q.attr.State == driver.QPSErr {
		return
	}
	q.attr.State = driver.QPSErr
	q.publish()
	q.rnr.Stop()
	q.mwWait = windowWait{} // a window operation waiting is flushed too
	q.flushRecv()
	q.sq.Progress(q)
	if q.srq != nil {
		// Published in the error state, it takes no more receives from
		// its SRQ once the peer's WR under way, if any, is done.
		if q.conn != nil {
			q.conn.lastWQE()
		} else {
			q.ctx.Event(driver.EventQPLastWQEReached, q.userCtx)
		}
	}
}

// flushRecv completes every posted receive with WCWRFlushErr, claiming
// each from the ring as a peer would, so that none completes twice.
func (q *qp) flushRecv() {
	if q.rq == nil {
		return
	}
	// Wait out a PostRecv under way, so that what it posted is seen
	// here; one that starts later reads the error state and flushes
	// itself. (The consumption below needs no lock: consumers claim
	// entries with a CAS, as the peer's Sends do.)
	q.rqMu.Lock()
	q.rqMu.Unlock()
	var e recvEntry
	// The ring holds at most rqN receives. A peer can write the ring's
	// indices, and one that kept moving the tail ahead of the head would
	// otherwise keep this loop — and q.mu — forever.
	for range q.rqN {
		ok, err := q.rq.consume(&e)
		if !ok || err != nil {
			return
		}
		q.pushRecv(&driver.WorkCompletion{WRID: e.pos, Status: driver.WCWRFlushErr, Opcode: driver.WCRecv})
	}
}

// fail moves the QP to the error state on its own, raising ev. q.mu is held.
func (q *qp) fail(ev driver.EventType) {
	if q.attr.State != driver.QPSErr {
		q.ctx.Event(ev, q.userCtx)
		q.toErr()
	}
}

func (q *qp) PostSend(wrs []driver.SendWR) (int, error) {
	q.mu.Lock()
	// One WR on postFast's shortest road (postPath) takes no more than
	// this; postSendLocked tries the rest of postFast. Of sendsNow, the
	// state alone: a destroyed QP is in the error state, and one waiting
	// to retry receiver-not-ready has that WR queued, which postPath's
	// test that the queue is idle refuses.
	if len(wrs) == 1 && q.attr.State == driver.QPSRTS {
		if q.postPath(&wrs[0]) {
			q.mu.Unlock()
			return 1, nil
		}
		return q.postSendLocked(wrs, true)
	}
	return q.postSendLocked(wrs, false)
}

// sendsNow reports whether the QP performs WRs as they are posted: it is
// in RTS, not destroyed, with no RNR wait. q.mu is held.
func (q *qp) sendsNow() bool {
	return !q.destroyed && q.attr.State == driver.QPSRTS && !q.rnr.Waiting()
}

// postSendLocked is PostSend once q.mu is held, which it releases; tried
// says that postPath refused wrs[0] already.
func (q *qp) postSendLocked(wrs []driver.SendWR, tried bool) (int, error) {
	// While nothing waits in the queue, the WRs that can be performed at
	// once are (postFast, postNow); the first that cannot, and all after
	// it, are queued.
	i := 0
	for i < len(wrs) && q.sendsNow() {
		// postFast, in line: a Send, which it does not take, calls
		// nothing on its way to postNow. A run of WRs with the kept
		// keys is performed whole.
		wr := &wrs[i]
		if int(wr.Opcode) < len(fastOps) && fastOps[wr.Opcode].rneed != 0 {
			n := 0
			if !tried {
				n = q.postRun(wrs[i:])
			}
			if n == 0 && q.fillFast(wr) {
				n = q.postRun(wrs[i:])
			}
			if n > 0 {
				// The run stopped at the end of wrs, at a failed QP,
				// which sendsNow ends the loop at, or at a WR postPath
				// refused.
				tried = true
				i += n
				continue
			}
		}
		if !q.postNow(wr) {
			break
		}
		tried = false
		i++
	}
	if i < len(wrs) {
		n, err := q.postQueued(wrs[i:])
		i += n
		if err != nil {
			q.mu.Unlock()
			return i, err
		}
	}
	q.mu.Unlock()
	return i, nil
}

// postQueued posts wrs through the send queue and executes what it can.
// q.mu is held.
func (q *qp) postQueued(wrs []driver.SendWR) (int, error) {
	for i := range wrs {
		if err := q.postSend(&wrs[i]); err != nil {
			if !q.destroyed {
				// The WRs before the one refused go on; a destroyed
				// QP's queue is gone with it, and completes nothing.
				q.sq.Progress(q)
			}
			return i, err
		}
	}
	q.sq.Progress(q)
	return len(wrs), nil
}

func (q *qp) postSend(wr *driver.SendWR) error {
	return soft.PostSend(q.sq, q, q.destroyed, q.attr.State, wr)
}

func (q *qp) PostRecv(wrs []driver.RecvWR) (int, error) {
	if q.srq != nil {
		return 0, soft.ErrRecvOnSRQ
	}
	for i := range wrs {
		// The receive's buffers become shareable before rqMu is taken,
		// since that can write to sockets; it need only precede the
		// receive's publication. Only valid WRs count (the loop below
		// checks them again and stops at the same one).
		if driver.CheckRecvWR(&wrs[i], q.cap.MaxRecvSGE) != nil {
			break
		}
		q.ctx.exposeForRecv(wrs[i].SGList, &q.recvExposed)
	}
	q.rqMu.Lock()
	// The state is read under rqMu: toErr publishes the error state
	// before its flush takes rqMu, so receives posted here are either
	// seen by that flush or posted knowing the QP is in the error state.
	st := q.postState.Load()
	n, err := q.postRecvLocked(wrs, st)
	q.rqMu.Unlock()
	if n > 0 && driver.QPState(st) == driver.QPSErr {
		// A QP in the error state flushes what is posted to it — if it
		// is still in that state: it may have been reset and reused
		// since (or destroyed, its ring unmapped).
		q.mu.Lock()
		if q.attr.State == driver.QPSErr && !q.destroyed {
			q.flushRecv()
		}
		q.mu.Unlock()
	}
	return n, err
}

// postRecvLocked posts wrs to a QP whose published state is st; rqMu is
// held.
func (q *qp) postRecvLocked(wrs []driver.RecvWR, st uint32) (int, error) {
	if st == stateDestroyed {
		return 0, driver.ErrClosed
	}
	if err := soft.PostRecvStateErr(driver.QPState(st)); err != nil {
		return 0, err
	}
	for i := range wrs {
		wr := &wrs[i]
		if err := driver.CheckRecvWR(wr, q.cap.MaxRecvSGE); err != nil {
			return i, err
		}
		if !q.rq.produce(wr, uint64(q.cap.MaxRecvWR)) {
			return i, driver.ErrQueueFull
		}
	}
	return len(wrs), nil
}

// Complete implements swq.Engine: it reports the completion of send slot seq.
func (q *qp) Complete(seq uint64, wc driver.WorkCompletion) {
	q.sendCQ.pushSend(q, seq, wc.WRID, wc.Status, wc.Opcode, wc.ByteLen)
}

func (q *qp) Destroy() error {
	q.mu.Lock()
	if q.destroyed {
		q.mu.Unlock()
		return driver.ErrClosed
	}
	q.destroyed = true
	q.rnr.Stop()
	c := q.conn
	q.setConn(nil)
	q.attr.State = driver.QPSErr
	q.publish()
	q.mu.Unlock()
	if c != nil {
		c.close()
	}
	q.ctx.mu.Lock()
	delete(q.ctx.qps, q)
	q.ctx.mu.Unlock()
	// Wait out a PostRecv that read the state before it was published
	// destroyed and may still be writing the receive ring, which the
	// block holds; one that starts later sees the state and posts nothing.
	q.rqMu.Lock()
	q.rqMu.Unlock()
	q.grantTo(nil)
	q.ctx.forgetRecvs(&q.recvExposed)
	q.recvCQ.removeRecvQP(q)
	q.sh.close()
	if q.spare != nil {
		q.spare.close()
	}
	return nil
}

// grantTo empties the QP's grant table and has it answer c's requests
// from now on (none, if c is nil): each connection starts with the keys
// of the regions of the QP's PD that peers may reach (remote rights, or a
// receive posted in them), and no other. A region deregistered meanwhile
// is out of the context's table before its Dereg takes grantMu, so that
// it is either not granted here or revoked after.
func (q *qp) grantTo(c *conn) {
	q.grantMu.Lock()
	defer q.grantMu.Unlock()
	q.grantConn = c
	for i := range uint32(maxKeys) {
		if q.grants.slot(i).kind.Load() != kindNone {
			q.grants.revoke(i)
		}
	}
	// The table moves c's epoch word on from now on (the revocations
	// above moved the previous connection's).
	var next *epochSlot
	if c != nil {
		next = c.epochOwn
	}
	if next != q.grantEpoch {
		if next != nil && !next.hold() {
			next = nil // the connection has ended
		}
		if q.grantEpoch != nil {
			q.grantEpoch.release()
		}
		q.grantEpoch = next
	}
	q.grants.epoch = nil
	if next != nil {
		q.grants.epoch = next.word()
	}
	if c == nil {
		return
	}
	q.ctx.mrs.Range(func(key uint32, e grant.Entry[*mr]) bool {
		if m := e.MR; m != nil && q.reaches(m) {
			q.grantLocked(key)
		} else if e.W != nil {
			q.grantWindowLocked(e.W)
		}
		return true
	})
}
