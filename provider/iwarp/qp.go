package iwarp

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/goverbs/goverbs/internal/recvq"
	"github.com/goverbs/goverbs/internal/soft"
	"github.com/goverbs/goverbs/internal/swq"
	"github.com/goverbs/goverbs/verbs/driver"
)

// qpNums numbers the QPs of the process.
var qpNums = soft.QPNumbers{Base: 0x400}

// qp is an iWARP queue pair. Its send queue is executed by whoever
// transmits on its connection (requester.go, transmit.go): the posting
// goroutine, or the transmit goroutine; incoming messages are placed by
// whoever receives (rxloop.go, rxframe.go, placement.go, responder.go,
// completer.go): a goroutine polling one of its CQs, or the receive
// goroutine. All take q.mu for their bookkeeping and never
// hold it across socket I/O.
type qp struct {
	soft.QP // Num, Query, Modify, PostRecv
	ctx     *devCtx
	pd      *pd
	num     uint32
	userCtx any
	sendCQ  *cq
	recvCQ  *cq
	srq     *srq
	cap     driver.QPCap

	mu   sync.Mutex // guards what follows
	attr driver.QPAttr
	sq   *swq.Queue
	rq   *recvq.Queue // nil with an SRQ
	// live is the connection whose receiving pollers of the QP's CQs
	// may drive (conn.pollRx), from its start until its receiver stops.
	live atomic.Pointer[conn]
	// wakes counts the completions of the QP that fired a notification
	// of an armed CQ: a receive round that did leaves the answers to
	// zero-length Reads to the application it woke (conn.rxTry).
	wakes atomic.Uint64

	c        *conn   // the connection, attached by cm before the move to RTR
	old      []*conn // connections detached by a reset, still winding down
	rxActive bool    // a receive is consumed by a Send being placed
	rxWRID   uint64  // its WRID
	// A receive completion held back while the receiver answers the
	// Read Request right behind its Send (see conn.completeSendWC).
	rxHeld   bool
	rxHeldWC driver.WorkCompletion
	// sqdPending: the QP moved to SQD with a message under way or WRs
	// not yet completed, and EventSQDrained waits for them (sqDrained).
	sqdPending bool
	destroyed  bool
	// mrCache holds the regions the QP's local lookups found last, by
	// the low bits of their keys (localSpan): a lookup in the context's
	// table takes its lock, two locked instructions of every message's
	// path. It is filled only while the QP's connection is live and the
	// QP not yet in the error state, and emptied when the QP fails, is
	// reset or destroyed, and by the Dereg of a region in it, so that it
	// keeps no deregistered region's memory alive.
	mrCache [4]*mr
	// pollsSeen is the count of Polls of the QP's CQs the last post
	// that could be left saw, and pollSeenAt when it first saw it
	// (mayLeave); guarded by mu.
	pollsSeen  uint32
	pollSeenAt int64
	// lastPostAt is when the last post that could be left was made
	// (mayLeave); guarded by mu.
	lastPostAt int64
	// req is last: its scalars come first, its arrays (some 10 KiB)
	// after them, away from the QP's other fields.
	req requester
}

// localSpan is ctx.span for q's own WRs (the local keys of its send and
// receive SG lists), through q.mrCache. q.mu is held.
func (q *qp) localSpan(g *driver.SGE, need driver.AccessFlags) ([]byte, *mr, accessError) {
	slot := &q.mrCache[g.LKey%uint32(len(q.mrCache))]
	if m := *slot; m != nil && m.stag == g.LKey && !m.ext.Revoked() {
		return m.span(g.LKey, q.pd, g.Addr, uint64(g.Length), need)
	}
	b, m, e := q.ctx.span(g.LKey, q.pd, nil, g.Addr, uint64(g.Length), need)
	if e == accessOK && q.c != nil && q.live.Load() == q.c && q.accepts() {
		// Only while Dereg can find the QP (its connection is live)
		// and toErr is still to come, which empties the cache.
		*slot = m
	}
	return b, m, e
}

// forgetMR takes m out of q.mrCache. q.mu is held.
func (q *qp) forgetMR(m *mr) {
	for i, c := range q.mrCache {
		if c == m {
			q.mrCache[i] = nil
		}
	}
}

func (p *pd) CreateQP(a driver.QPInitAttr) (driver.QP, error) {
	scq, rcq, s, err := soft.CheckQPInit[*cq, *srq](a, "iwarp", maxSGE, deviceAttr.MaxInlineData)
	if err != nil {
		return nil, err
	}
	c := a.Cap
	q := &qp{ctx: p.ctx, pd: p, userCtx: a.UserCtx, sendCQ: scq, recvCQ: rcq, srq: s, cap: c,
		num: qpNums.Next(), sq: swq.New(c, a.SigAll)}
	q.sq.MW = true // memory windows: mw.go
	q.req.init(int(c.MaxSendWR))
	if s == nil {
		q.rq = recvq.New(int(c.MaxRecvWR), c.MaxRecvSGE)
	}
	q.attr.Cap = c
	q.QP.Init(q.num, &q.mu, q, q, &q.attr, &q.destroyed, &q.sqdPending, &q.rq)
	p.ctx.mu.Lock()
	defer p.ctx.mu.Unlock()
	if err := soft.Admit(p.ctx.closed || p.Released(), len(p.ctx.qps), deviceAttr.MaxQP); err != nil {
		return nil, err
	}
	p.ctx.qps[q] = true
	scq.attach(q)
	if rcq != scq {
		rcq.attach(q)
	}
	return q, nil
}

// VetoModify implements soft.QPHooks.
func (q *qp) VetoModify(driver.QPState, *driver.QPAttr) error { return nil }

// Modified implements soft.QPHooks: the QP's Timeout and RetryCnt bound
// how long its connection waits for the peer.
func (q *qp) Modified(mask driver.QPAttrMask) {
	if mask&(driver.QPAttrTimeout|driver.QPAttrRetryCnt) != 0 && q.c != nil {
		q.c.setUserTimeout(userTimeout(q.attr.Timeout, q.attr.RetryCnt))
	}
}

// EnterReset implements soft.QPHooks.
func (q *qp) EnterReset() { q.reset() }

// EnterRTR implements soft.QPHooks: the connection cm attached places
// the peer's messages already.
func (q *qp) EnterRTR() {}

// EnterRTS implements soft.QPHooks.
func (q *qp) EnterRTS() { q.kick() }

// DrainSQ implements soft.QPHooks: drained once the message under way,
// if any, is out and what was executed has completed; the transmitter
// asks the peer to confirm it at once (needConfirm).
func (q *qp) DrainSQ() {
	q.sqDrained()
	if q.sqdPending {
		q.kick()
	}
}

// EnterErr implements soft.QPHooks.
func (q *qp) EnterErr() {
	if q.c != nil {
		q.c.abort() // placing stops before toErr flushes (see fail)
	}
	q.toErr()
}

// reset empties both queues without completions and drops the
// connection, as the move to Reset does. q.mu is held.
func (q *qp) reset() {
	if c := q.c; c != nil {
		c.abort()
		q.keepOld(c)
		q.c = nil
	}
	q.sendCQ.mu.Lock() // serialises the reset with Retire (swq.Queue.Reset)
	q.sq.Reset()
	q.sendCQ.mu.Unlock()
	q.req.reset(q.sq.Tail())
	if q.rq != nil {
		q.rq.Reset()
	}
	q.rxActive, q.rxHeld = false, false
	q.attr = driver.QPAttr{Cap: q.cap}
	clear(q.mrCache[:])
}

// accepts reports whether the QP's responder takes requests. q.mu is held.
func (q *qp) accepts() bool { return soft.Accepts(q.attr.State) }

// toErr moves the QP to the error state and flushes every outstanding
// WR: the send queue's in flight and queued WRs in order, the receive
// being placed, then the posted receives. The caller deals with the
// connection. q.mu is held.
func (q *qp) toErr() {
	if q.attr.State == driver.QPSErr {
		return
	}
	q.attr.State = driver.QPSErr
	clear(q.mrCache[:])
	q.req.flushExpired = q.req.expired && q.req.cur.active
	q.req.expired = false
	q.flushSQ()
	if q.rxHeld {
		q.rxHeld = false
		q.completeRecv(q.rxHeldWC)
	}
	if q.rxActive {
		q.rxActive = false
		q.completeRecv(driver.WorkCompletion{WRID: q.rxWRID, Status: driver.WCWRFlushErr, Opcode: driver.WCRecv})
	}
	soft.FlushRecvs(q, q.rq)
	if q.srq != nil {
		// The receive it was filling, if any, is flushed: it takes
		// no more from its SRQ.
		q.ctx.Event(driver.EventQPLastWQEReached, q.userCtx)
	}
	if q.c != nil {
		q.c.wakeTx()
	}
}

// flushSQ flushes the send queue in the error state: the executed WRs,
// the WR the connection timed out in (flushExpired), then those queued.
// It stops before a window operation that waits for its old binding's
// quiesce (requester.flush), and goes on once that has completed it.
// q.mu is held.
func (q *qp) flushSQ() {
	if !q.req.flush(q) {
		return
	}
	if q.req.flushExpired {
		q.req.flushExpired = false
		// The WR the connection timed out in, after those before it.
		q.sq.FailNext(q, driver.WCRetryExcErr)
	}
	q.sq.Progress(q)
}

// fail moves the QP to the error state on its own, raising ev, and
// drops its connection. q.mu is held.
func (q *qp) fail(ev driver.EventType) {
	// The connection stops placing first: once toErr has flushed a
	// receive, its buffer is the application's again.
	if q.c != nil {
		q.c.abort()
	}
	if q.attr.State != driver.QPSErr {
		q.ctx.Event(ev, q.userCtx)
		q.toErr()
	}
}

func (q *qp) PostSend(wrs []driver.SendWR) (int, error) {
	// A single WR may take the short road to the socket (postNow), for
	// which the poster becomes the transmitter first: txMu comes before
	// q.mu.
	var tx *conn
	if len(wrs) == 1 {
		if c := q.live.Load(); c != nil && c.txMu.TryLock() {
			tx = c
		}
	}
	q.mu.Lock()
	if q.destroyed {
		// Its queue is gone with it: nothing runs it (kick would flush
		// the WRs Destroy discarded into the CQ).
		q.mu.Unlock()
		if tx != nil {
			tx.endTransmit(false, false)
		}
		return 0, driver.ErrClosed
	}
	if len(wrs) == 1 && q.mayLeave(&wrs[0]) {
		// Left for a later writev (coalesce.go).
		err := q.postSend(&wrs[0])
		if err == nil {
			q.leftPost()
		}
		c := q.c
		q.mu.Unlock()
		if tx != nil {
			tx.endTransmit(false, false)
		}
		if err != nil {
			return 0, err
		}
		if q.sendCQ.Armed() || q.recvCQ.Armed() {
			// A goroutine armed a CQ of the QP to sleep since mayLeave
			// looked, and its ReqNotify may have looked for WRs left
			// before leftPost marked this one: each side stores its
			// mark, then loads the other's, so one of them sends it.
			c.transmit()
		}
		return 1, nil
	}
	if tx != nil && tx == q.c && q.postNow(&wrs[0]) {
		q.mu.Unlock()
		tx.endTransmit(tx.sendBatch(tx.tb, true))
		return 1, nil
	}
	n, err := len(wrs), error(nil)
	for i := range wrs {
		if err = q.postSend(&wrs[i]); err != nil {
			n = i
			break
		}
	}
	c := q.c
	if c == nil || q.attr.State != driver.QPSRTS {
		q.kick()
		c = nil
	}
	q.mu.Unlock()
	switch {
	case tx != nil && tx == c && n > 0:
		tx.transmitHeld()
	case tx != nil:
		tx.endTransmit(false, false)
		if c != nil && n > 0 {
			c.transmit()
		}
	case c != nil && n > 0:
		c.transmit()
	}
	return n, err
}

// postSend queues one WR. q.mu is held.
func (q *qp) postSend(wr *driver.SendWR) error {
	if q.destroyed {
		return driver.ErrClosed
	}
	if err := soft.PostSendStateErr(q.attr.State); err != nil {
		return err
	}
	switch wr.Opcode {
	case driver.OpSendWithImm, driver.OpRDMAWriteWithImm, driver.OpAtomicCmpAndSwp, driver.OpAtomicFetchAndAdd:
		if c := q.c; c != nil && !c.ext {
			return fmt.Errorf("%w: %v needs the RFC 7306 extensions, which the peer did not negotiate (a peer such as Linux siw lacks them)", driver.ErrUnsupported, wr.Opcode)
		}
	}
	return q.sq.Post(wr, q)
}

// kick makes the send queue progress: the transmit goroutine executes it
// while the QP is connected in RTS (or finishing a message in SQD);
// otherwise it is flushed or failed here. q.mu is held.
func (q *qp) kick() {
	if q.drainingSQ() {
		q.c.wakeTx()
		return
	}
	q.sq.Progress(q)
	q.afterProgress()
}

// LocalSpan implements swq.Memory: the SGE's bytes in a region of q's PD
// that grants need (an inline SGE must lie in such a region too). q.mu is
// held.
func (q *qp) LocalSpan(g *driver.SGE, need driver.AccessFlags) ([]byte, bool) {
	b, _, e := q.localSpan(g, need)
	return b, e == accessOK
}

// takeRecv removes the next posted receive (from the QP's queue or its
// SRQ) into dst; false when none is posted. q.mu is held.
func (q *qp) takeRecv(dst *rwqe) bool {
	if q.srq != nil {
		return q.srq.Take(dst)
	}
	ok, _ := q.rq.Take(dst) // a QP's own queue has no limit
	return ok
}

// completeRecv reports a receive completion; a lost one (CQ overrun)
// moves the QP to the error state. q.mu is held.
func (q *qp) completeRecv(wc driver.WorkCompletion) {
	wc.QPNum = q.num
	q.pushed(q.recvCQ.push(soft.Entry{WC: wc}))
}

// CompleteRecv implements soft.RecvHooks. q.mu is held.
func (q *qp) CompleteRecv(wc driver.WorkCompletion) { q.completeRecv(wc) }

// pushed handles the outcome of a push of one of q's completions. q.mu
// is held.
func (q *qp) pushed(ok, woke bool) {
	if woke {
		q.wakes.Add(1)
	}
	if !ok {
		q.fail(driver.EventQPFatal)
	}
}

// Complete implements swq.Engine: it reports the completion of send
// slot seq. q.mu is held.
func (q *qp) Complete(seq uint64, wc driver.WorkCompletion) {
	wc.QPNum = q.num
	q.pushed(q.sendCQ.push(soft.Entry{WC: wc, SQ: q.sq, Retire: seq}))
}

func (q *qp) Destroy() error {
	// The answers owed to the peer's confirming Reads, left for a next
	// post that will not come, go out if the transmitter is free: they
	// complete the peer's Sends and Writes that this side received as
	// successes. Only a disconnect (Conn.Close) waits for them; without
	// one, the peer may see those complete flushed.
	if c := q.live.Load(); c != nil {
		c.transmit()
	}
	q.mu.Lock()
	if q.destroyed {
		q.mu.Unlock()
		return driver.ErrClosed
	}
	q.destroyed = true
	clear(q.mrCache[:]) // Dereg no longer visits the QP
	conns := q.old
	q.old = nil
	if q.c != nil {
		q.c.abort()
		conns = append(conns, q.c)
		q.c = nil
	}
	q.attr.State = driver.QPSErr
	q.mu.Unlock()
	for _, c := range conns {
		c.wait()
	}
	q.sendCQ.detach(q)
	q.recvCQ.detach(q)
	q.ctx.mu.Lock()
	delete(q.ctx.qps, q)
	q.ctx.mu.Unlock()
	return nil
}

// attach makes c the QP's connection, before cm moves the QP to RTR. The
// QP must be in Reset or Init.
func (q *qp) attach(c *conn) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.destroyed:
		return driver.ErrClosed
	case q.attr.State != driver.QPSReset && q.attr.State != driver.QPSInit:
		return fmt.Errorf("%w: connecting needs a QP in Reset or Init, this one is %v", driver.ErrInvalidState, q.attr.State)
	case q.c != nil:
		return fmt.Errorf("%w: the QP is already being connected", driver.ErrBusy)
	}
	q.c = c
	q.req.connect(c.ord)
	return nil
}

// detach undoes attach after a failed connection setup, moving the QP to
// the error state if it got past Init.
func (q *qp) detach(c *conn) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.c != c {
		return
	}
	if q.attr.State != driver.QPSReset && q.attr.State != driver.QPSInit {
		q.toErr()
	}
	q.c = nil
	q.keepOld(c)
}

// keepOld keeps c, a connection the QP no longer uses, for Destroy to
// wait for. Those kept before that have ended since need no waiting,
// and are let go, so that a QP reset and reconnected again and again
// does not keep them all. q.mu is held.
func (q *qp) keepOld(c *conn) {
	q.old = slices.DeleteFunc(q.old, (*conn).exited)
	q.old = append(q.old, c)
}
