package iwarp

import (
	"github.com/goverbs/goverbs/internal/sglist"
	"github.com/goverbs/goverbs/internal/soft"
	"github.com/goverbs/goverbs/internal/swq"
	"github.com/goverbs/goverbs/provider/iwarp/wire"
	"github.com/goverbs/goverbs/verbs/driver"
)

// The requester: the QP as the swq engine whose Execute turns send WRs
// into FPDUs in the transmit batch of its connection (transmit.go writes
// them); the completer completes them as the responder's answers arrive.
// Everything here runs with q.mu held.

// wrTrack is what the requester keeps of an executed WR until it
// completes: how to complete it and how the wire names it, so that a
// Terminate can be matched to it.
type wrTrack struct {
	wrid      uint64
	op        driver.WCOpcode
	signaled  bool
	status    driver.WCStatus // WCSuccess, or the error it completes with
	byteLen   uint32
	response  bool // it completes with a response (a Read or an atomic)
	responded bool // that response has arrived
	confirmed bool // the responder is known to have placed it
	// Wire identity: the untagged messages it sent on queue qn (MSNs
	// msn0 to msn1) and the tagged range [stag:to, stag:toEnd].
	untagged   bool
	qn         uint32
	msn0, msn1 uint32
	tagged     bool
	stag       uint32
	to, toEnd  uint64
}

// unbinding reports whether t is a window operation that undid a binding
// (windowOp) and waits for that binding to be quiesced (qp.unbound).
func (t *wrTrack) unbinding() bool {
	return (t.op == driver.WCBindMW || t.op == driver.WCLocalInv) && t.response && !t.responded && t.status == driver.WCSuccess
}

// orqKind is the kind of an outstanding request.
type orqKind uint8

const (
	orqRead    orqKind = iota // an application's RDMA Read
	orqAtomic                 // an application's atomic
	orqConfirm                // a zero-length Read that confirms the WRs before it
)

// orqEntry is an outstanding Read or atomic: what its response confirms
// and where its data goes.
//
// Its scalars come first, 64 bytes (one or two cache lines, as the
// entry falls), the sink's arrays last: pushORQ writes the scalars, and
// the arrays only as far as the last occupant of the entry filled them,
// so that a zero-length Read (a confirmation, the commonest request)
// writes the scalars' lines only, not the nine lines of the entry.
type orqEntry struct {
	kind     orqKind
	sinkSTag uint32
	seq      uint64 // the WR's slot (orqRead, orqAtomic)
	cover    uint64 // the response confirms the slots before cover
	sinkTO   uint64
	size     uint32
	id       uint32 // atomic request identifier
	sent     int64  // when it was built into a batch (monotime)
	nseg     int
	nmr      int
	segs     [maxSGE][]byte
	mrs      [maxSGE]*mr // the regions of segs: placement stops once one is revoked
}

// setSink makes r's resolved local SG list (resolveLocal) the entry's
// sink: where the response's data goes.
func (e *orqEntry) setSink(r *requester) {
	e.nseg = r.local.N()
	for i := range e.nseg {
		e.segs[i] = r.local.Seg(i)
	}
	e.nmr = copy(e.mrs[:], r.localMR[:r.nlocalMR])
}

// txCursor is the progress of the transmitter through the WR at the head
// of the send queue, when a batch filled up in the middle of it.
type txCursor struct {
	active bool
	off    uint64 // bytes of the message sent
	immOut bool   // the Immediate Data of a Send with immediate is out
	msgOut bool   // the data message of a Write with immediate is out
}

// begun reports whether a frame of the WR at the cursor is built: its
// message is under way, and goes out whole before anything else.
func (c txCursor) begun() bool { return c.active && (c.off > 0 || c.immOut || c.msgOut) }

// requester is the requester state of a QP.
type requester struct {
	track    []wrTrack // by slot modulo the send queue depth
	execSeq  uint64    // slots executed: their frames are built
	doneSeq  uint64    // slots completed
	confSeq  uint64    // the slots before confSeq are confirmed
	coverSeq uint64    // the slots before coverSeq are covered by a request's response
	failing  bool      // a WR failed locally: stop, then move to the error state
	expired  bool      // the connection timed out in the middle of the WR at cur (timedOut)
	// flushHeld: the move to the error state has completed the WRs
	// before a window operation still quiescing the binding it undid
	// (unbinding); the rest of the send queue is flushed after it
	// completes (qp.unbound). flushExpired is the expired of that move.
	flushHeld    bool
	flushExpired bool
	cur          txCursor
	msn          [wire.NumQN]uint32 // MSNs sent, per queue
	atomicID     uint32
	ord          int // the Reads and atomics the QP may have outstanding
	// orq[orqHead%maxRdAtomic:orqTail%maxRdAtomic]: the Reads and
	// atomics outstanding, and the zero-length Reads that confirm.
	orqHead    uint64
	orqTail    uint64
	uncovBytes uint64 // bytes sent since coverSeq
	// uncovSignaled: a signaled Send or Write is among them.
	uncovSignaled bool
	nlocalMR      int
	result        [8]byte
	// The arrays last, after the scalars every WR touches.
	local   sglist.List
	localMR [maxSGE]*mr // the regions of local's SGEs (resolveLocal)
	orq     [maxRdAtomic]orqEntry
}

func (r *requester) init(depth int) { r.track = make([]wrTrack, depth) }

// reset forgets everything, as the move to Reset does; the next WR the
// send queue executes has number next (which goes on across a reset:
// swq.Queue.Reset).
func (r *requester) reset(next uint64) {
	track := r.track
	*r = requester{track: track, execSeq: next, doneSeq: next, confSeq: next, coverSeq: next}
}

// connect readies the requester for a new connection with ord Reads and
// atomics outstanding at most. The QP is in Reset or Init: nothing is
// queued, and the next WR is numbered execSeq.
func (r *requester) connect(ord int) {
	r.reset(r.execSeq)
	r.ord = min(ord, maxRdAtomic)
}

func (r *requester) slot(seq uint64) *wrTrack { return &r.track[seq%uint64(len(r.track))] }

func (r *requester) orqLen() int { return int(r.orqTail - r.orqHead) }

// State implements swq.Engine: the state the send queue executes in. A
// QP moved to SQD in the middle of a message finishes it (DDP sends each
// message of a stream whole, RFC 5041 5.3, and siw ends a stream that
// interleaves two), so while that message's WR is under way the send
// queue goes on as in RTS; it starts no other WR. A QP in the error state
// whose flush is held (flushHeld) flushes no queued WR until the window
// operation before them completes: the queue waits as in SQD. q.mu is
// held.
func (q *qp) State() driver.QPState {
	switch {
	case q.attr.State == driver.QPSSQD && q.req.cur.begun() && q.c != nil:
		return driver.QPSRTS
	case q.attr.State == driver.QPSErr && q.req.flushHeld:
		return driver.QPSSQD
	}
	return q.attr.State
}

// drainingSQ reports whether the transmitter executes the send queue:
// the QP is connected in RTS, or in SQD (which finishes the message under
// way, see State). q.mu is held.
func (q *qp) drainingSQ() bool {
	return q.c != nil && (q.attr.State == driver.QPSRTS || q.attr.State == driver.QPSSQD)
}

// sqDrained raises EventSQDrained once a QP moved to SQD has drained its
// send queue, as IB defines it: the message it was in is out, and every
// WR executed has completed (its response came, or the peer confirmed
// it). q.mu is held.
func (q *qp) sqDrained() {
	r := &q.req
	soft.SQDrained(&q.sqdPending, q.attr.State, r.cur.active || r.doneSeq != r.execSeq, q.ctx.EventQueue, q.userCtx)
}

// Stalled implements swq.Engine: execution waits after a local failure,
// and, before it starts another WR, while responses are owed to the peer
// (they go out between the requester's messages, which go out each
// whole: a queue kept full of Writes must not hold them back).
func (q *qp) Stalled() bool { return q.req.failing || q.responsesOwed() }

// responsesOwed reports whether the requester is between messages and
// the connection owes the peer responses. q.mu is held.
func (q *qp) responsesOwed() bool {
	c := q.c
	return c != nil && !q.req.cur.active && c.irqHead != c.irqTail
}

// Fail implements swq.Engine. Execute never returns a final error
// status, so Progress never calls it.
func (q *qp) Fail() { q.fail(driver.EventQPFatal) }

// afterProgress moves the QP to the error state if a WR failed locally.
func (q *qp) afterProgress() {
	if q.req.failing {
		q.req.failing = false
		q.fail(driver.EventQPReqErr)
	}
}

// Execute implements swq.Engine: it builds the frames of the WR at the
// head of the send queue into the connection's transmit batch. It
// returns RNRWait when the batch is full (the rest goes in the next
// one), or when the WR must wait (ORD exhausted, a fence); Pending once
// its frames are built. A WR that fails locally is recorded with its
// error and the queue stops (afterProgress then fails the QP), so that
// its completion comes in order after the WRs before it.
func (q *qp) Execute(s *swq.Slot) (driver.WCStatus, uint32) {
	r := &q.req
	wr := &s.WR
	c := q.c
	if c == nil {
		// A QP moved to RTS by hand: iwarp QPs are connected with cm, so
		// nobody answers and the transport retries run out.
		return q.failWR(s, driver.WCRetryExcErr)
	}
	if !r.cur.active {
		// First look at this WR: resolve its local memory and check it.
		if wr.Opcode.IsAtomic() || wr.Opcode == driver.OpRDMARead {
			if r.ord == 0 {
				return q.failWR(s, driver.WCRemInvReqErr)
			}
			if r.orqLen() >= r.ord {
				return swq.RNRWait, 0
			}
		}
		if wr.Flags&driver.SendFence != 0 && q.req.appRequestsOutstanding() {
			return swq.RNRWait, 0
		}
	}
	if wr.Opcode == driver.OpBindMW || wr.Opcode == driver.OpLocalInv {
		return q.windowOp(s)
	}
	if !q.resolveLocal(s) {
		return q.failWR(s, driver.WCLocProtErr)
	}
	length := r.local.Len()
	if length > deviceAttr.MaxMsgSize {
		return q.failWR(s, driver.WCLocLenErr)
	}
	b := c.tb // lent by txRound, the only caller of Progress in these states
	if !r.cur.active {
		r.cur = txCursor{active: true}
		t := r.slot(r.execSeq)
		*t = wrTrack{wrid: wr.WRID, op: wr.Opcode.CompletionOpcode(), signaled: s.Signaled}
	}
	t := r.slot(r.execSeq)
	if built, fail := q.buildWR(b, wr, t, length); fail != driver.WCSuccess {
		return q.failWR(s, fail)
	} else if !built {
		if !r.cur.begun() {
			// The batch filled before any frame of it: it has not
			// begun (a move to SQD now keeps it from going out), and
			// the next look starts it anew.
			r.cur = txCursor{}
		}
		return swq.RNRWait, 0
	}
	// The WR's frames are all built.
	r.cur = txCursor{}
	r.built(t, length)
	return swq.Pending, 0
}

// built accounts for the WR at execSeq, tracked by t, whose frames are
// all built: length bytes of payload.
func (r *requester) built(t *wrTrack, length uint64) {
	seq := r.execSeq
	r.execSeq++
	if t.response {
		e := &r.orq[(r.orqTail-1)%maxRdAtomic]
		e.seq, e.cover = seq, seq
		r.coverSeq, r.uncovBytes, r.uncovSignaled = r.execSeq, 0, false
	} else {
		r.uncovBytes += length
		if t.signaled {
			r.uncovSignaled = true
		}
		if r.ord == 0 {
			// Nothing can confirm it: it completes once sent.
			t.confirmed = true
		}
	}
}

// postNow is the short road of a Send or RDMA Write posted to an idle
// connection: the poster, transmitter already (c.txMu is held), builds
// its frame straight from the WR into a new batch, as Execute would
// have, and writes it at once, sparing the copy of the WR into the send
// queue and the queue's round (swq.Queue.Commit takes its slot). It
// reports false, having changed nothing but scratch state (r.local and
// the lookups' cache), for any WR or state that is not the common case: another WR queued or under way, responses owed, the
// batch before still going out, a fence, a message of more than one
// frame, an inline payload that would not be copied into the batch at
// once; such a WR goes through the queue (Post, then Progress), whose
// Execute builds it and produces its error. q.mu is held.
func (q *qp) postNow(wr *driver.SendWR) bool {
	c, r := q.c, &q.req
	switch wr.Opcode {
	case driver.OpSend, driver.OpRDMAWrite:
	default:
		return false
	}
	if q.attr.State != driver.QPSRTS || wr.Flags&driver.SendFence != 0 || r.cur.active || r.failing ||
		!q.sq.Idle() || !q.sq.Room() || q.sq.Check(wr) != nil {
		return false
	}
	if c.txStopped || c.txLeft() || c.pinned || c.finishPending || c.aborted.Load() || !c.gate.Load() ||
		c.term || c.closing || c.rtrOut != 0 || c.kickNow || c.irqHead != c.irqTail || c.lazyAt.Load() != 0 {
		return false
	}
	r.local.Reset()
	inline := wr.Flags&driver.SendInline != 0
	need := driver.AccessFlags(0) // an inline payload's regions need no right (Post)
	if !inline {
		need = swq.NeedOf(wr.Opcode)
	}
	if !q.resolveSGL(wr.SGList, need) {
		return false
	}
	length := r.local.Len()
	if length > uint64(maxPayload) || (inline && length > inlineMax) {
		return false
	}
	seq, signaled := q.sq.Commit(wr)
	b := c.batch()
	b.reset()
	r.cur = txCursor{active: true}
	t := r.slot(seq)
	*t = wrTrack{wrid: wr.WRID, op: wr.Opcode.CompletionOpcode(), signaled: signaled}
	q.buildWR(b, wr, t, length) // one frame, into an empty batch: it fits
	r.cur = txCursor{}
	r.built(t, length)
	c.executed(b)
	return true
}

// buildWR builds the frames of wr (length bytes of r.local) into b,
// continuing from the cursor: built once all are; fail is the status of
// a WR that cannot be built (an opcode the transport lacks).
func (q *qp) buildWR(b *txBatch, wr *driver.SendWR, t *wrTrack, length uint64) (built bool, fail driver.WCStatus) {
	r := &q.req
	switch wr.Opcode {
	case driver.OpSend, driver.OpSendWithImm, driver.OpSendWithInv:
		if wr.Opcode == driver.OpSendWithImm && !r.cur.immOut {
			if !b.room(wire.ImmDataLen, 0) {
				return false, driver.WCSuccess
			}
			r.msn[wire.QNSend]++
			wire.ImmData(b.header(wire.ImmDataLen)).Set(wr.Flags&driver.SendSolicited != 0, r.msn[wire.QNSend], wr.Imm, wire.ImmWithSend)
			b.endFrame(nil, 0, 0)
			t.untagged, t.qn, t.msn0 = true, wire.QNSend, r.msn[wire.QNSend]
			r.cur.immOut = true
		}
		if !q.sendMessage(b, wr, t, length) {
			return false, driver.WCSuccess
		}
	case driver.OpRDMAWrite, driver.OpRDMAWriteWithImm:
		if !r.cur.msgOut {
			if !q.writeMessage(b, wr, t, length) {
				return false, driver.WCSuccess
			}
			r.cur.msgOut = true
		}
		if wr.Opcode == driver.OpRDMAWriteWithImm {
			if !b.room(wire.ImmDataLen, 0) {
				return false, driver.WCSuccess
			}
			r.msn[wire.QNSend]++
			wire.ImmData(b.header(wire.ImmDataLen)).Set(wr.Flags&driver.SendSolicited != 0, r.msn[wire.QNSend], wr.Imm, 0)
			b.endFrame(nil, 0, 0)
			t.untagged, t.qn, t.msn0, t.msn1 = true, wire.QNSend, r.msn[wire.QNSend], r.msn[wire.QNSend]
		}
	case driver.OpRDMARead:
		if !b.room(wire.ReadRequestLen, 0) {
			return false, driver.WCSuccess
		}
		e := r.pushORQ(orqRead)
		e.size = uint32(length)
		e.sinkSTag, e.sinkTO = 0, 0
		if len(wr.SGList) > 0 {
			e.sinkSTag, e.sinkTO = wr.SGList[0].LKey, wr.SGList[0].Addr
		}
		e.setSink(r)
		r.msn[wire.QNRead]++
		wire.ReadRequest(b.header(wire.ReadRequestLen)).Set(r.msn[wire.QNRead], e.sinkSTag, e.sinkTO, e.size, wr.RKey, wr.RemoteAddr)
		b.endFrame(nil, 0, 0)
		t.response, t.byteLen = true, uint32(length)
		t.untagged, t.qn, t.msn0, t.msn1 = true, wire.QNRead, r.msn[wire.QNRead], r.msn[wire.QNRead]
	case driver.OpAtomicCmpAndSwp, driver.OpAtomicFetchAndAdd:
		if !b.room(wire.AtomicReqLen, 0) {
			return false, driver.WCSuccess
		}
		e := r.pushORQ(orqAtomic)
		e.setSink(r)
		r.atomicID++
		e.id = r.atomicID
		r.msn[wire.QNAtomic]++
		a := wire.AtomicRequest(b.header(wire.AtomicReqLen))
		if wr.Opcode == driver.OpAtomicFetchAndAdd {
			a.Set(r.msn[wire.QNAtomic], wire.AtomicFetchAdd, e.id, wr.RKey, wr.RemoteAddr, wr.CompareAdd, 0, 0, 0)
		} else {
			a.Set(r.msn[wire.QNAtomic], wire.AtomicCmpSwap, e.id, wr.RKey, wr.RemoteAddr, wr.Swap, ^uint64(0), wr.CompareAdd, ^uint64(0))
		}
		b.endFrame(nil, 0, 0)
		t.response, t.byteLen = true, 8
		t.untagged, t.qn, t.msn0, t.msn1 = true, wire.QNAtomic, r.msn[wire.QNAtomic], r.msn[wire.QNAtomic]
	default:
		return false, driver.WCLocQPOpErr
	}
	return true, driver.WCSuccess
}

// resolveLocal maps the slot's local SG list (or inline payload) into
// r.local: the source of Sends and Writes, the sink of Reads and
// atomics (which need AccessLocalWrite); false on a bad lkey, PD, right
// or range.
func (q *qp) resolveLocal(s *swq.Slot) bool {
	l := &q.req.local
	l.Reset()
	if s.IsInline {
		l.One(s.Inline)
		return true
	}
	need := driver.AccessFlags(0)
	if !s.WR.Opcode.ReadsLocal() {
		need = driver.AccessLocalWrite
	}
	return q.resolveSGL(s.WR.SGList, need)
}

// resolveSGL maps sg, whose regions must grant need, into r.local (reset
// by the caller) and their regions into r.localMR; false on a bad lkey,
// PD, right or range.
func (q *qp) resolveSGL(sg []driver.SGE, need driver.AccessFlags) bool {
	l := &q.req.local
	q.req.nlocalMR = 0
	for i := range sg {
		b, m, e := q.localSpan(&sg[i], need)
		if e != accessOK || !l.Add(b) {
			return false
		}
		q.req.localMR[i] = m
		q.req.nlocalMR++
	}
	return true
}

// failWR records a local failure of the WR at the head: it completes with
// status after the WRs before it, and the QP then fails.
func (q *qp) failWR(s *swq.Slot, status driver.WCStatus) (driver.WCStatus, uint32) {
	r := &q.req
	t := r.slot(r.execSeq)
	*t = wrTrack{wrid: s.WR.WRID, op: s.WR.Opcode.CompletionOpcode(), signaled: true, status: status}
	r.cur = txCursor{}
	r.execSeq++
	r.failing = true
	return swq.Pending, 0
}

// sendMessage builds the Send message of wr (length bytes of r.local),
// continuing from the cursor; false when the batch filled first.
func (q *qp) sendMessage(b *txBatch, wr *driver.SendWR, t *wrTrack, length uint64) bool {
	r := &q.req
	op := wire.OpSend
	inv := uint32(0)
	switch {
	case wr.Opcode == driver.OpSendWithInv && wr.Flags&driver.SendSolicited != 0:
		op, inv = wire.OpSendSEInv, wr.InvalidateRKey
	case wr.Opcode == driver.OpSendWithInv:
		op, inv = wire.OpSendInv, wr.InvalidateRKey
	case wr.Flags&driver.SendSolicited != 0:
		op = wire.OpSendSE
	}
	if r.cur.off == 0 {
		r.msn[wire.QNSend]++
		if !t.untagged {
			t.untagged, t.qn, t.msn0 = true, wire.QNSend, r.msn[wire.QNSend]
		}
		t.msn1 = r.msn[wire.QNSend]
	}
	msn := r.msn[wire.QNSend]
	for first := true; first || r.cur.off < length; first = false {
		n := min(length-r.cur.off, uint64(maxPayload))
		if !b.room(wire.UntaggedLen, int(n)) {
			if r.cur.off == 0 && first {
				// Nothing of the message is out yet: take the MSN back.
				r.msn[wire.QNSend]--
			}
			return false
		}
		last := r.cur.off+n == length
		wire.Hdr(b.header(wire.UntaggedLen)).SetUntagged(op, last, inv, wire.QNSend, msn, uint32(r.cur.off), int(n))
		b.endFrame(&r.local, r.cur.off, int(n))
		r.cur.off += n
	}
	return true
}

// writeMessage builds the RDMA Write message of wr, continuing from the
// cursor; false when the batch filled first.
func (q *qp) writeMessage(b *txBatch, wr *driver.SendWR, t *wrTrack, length uint64) bool {
	r := &q.req
	t.tagged, t.stag, t.to, t.toEnd = true, wr.RKey, wr.RemoteAddr, wr.RemoteAddr+length
	for first := true; first || r.cur.off < length; first = false {
		n := min(length-r.cur.off, uint64(maxPayload))
		if !b.room(wire.TaggedLen, int(n)) {
			return false
		}
		last := r.cur.off+n == length
		wire.Hdr(b.header(wire.TaggedLen)).SetTagged(wire.OpWrite, last, wr.RKey, wr.RemoteAddr+r.cur.off, int(n))
		b.endFrame(&r.local, r.cur.off, int(n))
		r.cur.off += n
	}
	return true
}

// pushORQ appends an outstanding request of kind k.
func (r *requester) pushORQ(k orqKind) *orqEntry {
	e := &r.orq[r.orqTail%maxRdAtomic]
	r.orqTail++
	clear(e.segs[:e.nseg]) // nothing of the last occupant's sink stays reachable
	clear(e.mrs[:e.nmr])
	e.kind, e.sinkSTag, e.seq, e.cover, e.sinkTO, e.size, e.id, e.sent, e.nseg, e.nmr = k, 0, 0, 0, 0, 0, 0, monotime(), 0, 0
	return e
}

// appRequestsOutstanding reports whether a Read or atomic of the
// application is outstanding (what a fence waits for).
func (r *requester) appRequestsOutstanding() bool {
	for i := r.orqHead; i != r.orqTail; i++ {
		if r.orq[i%maxRdAtomic].kind != orqConfirm {
			return true
		}
	}
	return false
}
