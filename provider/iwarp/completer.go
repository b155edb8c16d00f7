package iwarp

import (
	"encoding/binary"
	"io"

	"github.com/goverbs/goverbs/internal/sglist"
	"github.com/goverbs/goverbs/provider/iwarp/wire"
	"github.com/goverbs/goverbs/verbs/driver"
)

// The completer: the answers to this side's own requests (Read and
// Atomic Responses, or a Terminate from the peer) and the in-order
// completion of the WRs they confirm. What runs on the QP runs with q.mu
// held.

// oversizedAnswerMax bounds what tcp0 reads and drops of the answer to a
// zero-length Read. Linux siw (6.1) queues a Read Request that arrives
// while it is sending something else, and when it starts the Read
// Response (siw_activate_tx) copies the request's SGE only if its length
// is not zero: for a zero-length Read the SGE of the work request sent
// before stays, and siw sends that buffer, up to the 32 bits of an SGE's
// length, to the zero-length Read's sink. RFC 5040 makes a Read Response
// exactly as long as its Read; tcp0 accepts this one longer answer to a
// zero-length Read only, from a peer other than goverbs, as one message in
// order from the sink's Tagged Offset, and places none of it. Under MPA
// CRC it does not check the CRCs of that answer either: siw sends the
// stale buffer without copying it (a Read Response is an unsignaled WR,
// which siw transmits from the pages themselves), so when the buffer's
// owner writes it meanwhile, as an application that reads into it does,
// the bytes that leave no longer match the CRC siw computed.
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

// rxAtomicResponse completes the atomic at the head of the ORQ.
func (c *conn) rxAtomicResponse(h wire.Hdr) error {
	q := c.q
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

// rxTerminateBegin keeps what fits of a Terminate's payload, the
// terminated headers, behind its own headers.
func (c *conn) rxTerminateBegin(h wire.Hdr) error {
	rx := &c.rx
	rx.dst[0] = rx.hdr[wire.TerminateLen : wire.TerminateLen+terminateKept(h)]
	rx.ndst = 1
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

// responseDone completes the request at the head of the ORQ once its
// response has fully arrived (called by the receiver) (n bytes of a Read), confirming the slots
// it covers, and completes what can complete.
func (q *qp) responseDone(n uint32) {
	r := &q.req
	if r.orqHead == r.orqTail {
		return
	}
	e := &r.orq[r.orqHead%maxRdAtomic]
	r.orqHead++
	switch e.kind {
	case orqRead, orqAtomic:
		t := r.slot(e.seq)
		t.responded = true
		if e.kind == orqRead {
			t.byteLen = n
		}
	}
	r.confSeq = max(r.confSeq, e.cover)
	q.completeInOrder()
	if c := q.c; c != nil && q.attr.State == driver.QPSRTS {
		// A request slot is free: the receiver that got the response
		// transmits what waited for it (WRs not yet executed, or a
		// confirmation not yet asked for), once its round is over. The
		// receiver holds rxMu, under which c.rx is.
		if q.sq.Waiting() || r.coverSeq < r.execSeq {
			c.rx.owe = true
		}
		return
	}
	q.kick()
}

// completeInOrder completes the executed WRs from doneSeq on, in order,
// as far as they are done: confirmed Sends and Writes, Reads and atomics
// whose response arrived.
func (q *qp) completeInOrder() {
	r := &q.req
	for r.doneSeq < r.execSeq {
		t := r.slot(r.doneSeq)
		switch {
		case t.status != driver.WCSuccess:
			return // completed by the failure that follows
		case t.response && !t.responded:
			return
		case !t.response && !t.confirmed && r.doneSeq >= r.confSeq:
			return
		}
		seq := r.doneSeq
		r.doneSeq++
		if t.signaled {
			q.Complete(seq, driver.WorkCompletion{WRID: t.wrid, Status: driver.WCSuccess, Opcode: t.op, ByteLen: t.byteLen})
		}
	}
	q.sqDrained()
}

// flush completes every executed WR not yet completed, as the move to
// the error state does: with its own error if it failed, with success if
// it is known done, else with WCWRFlushErr; and forgets the ORQ and the
// transmitter's place. A window operation whose invalidation or rebind
// has taken effect is done once its old binding is quiesced: flush
// completes the WRs before it and reports false (flushHeld), the outcome
// of those after it settled; qp.unbound completes it, with success, and
// calls flush again for the rest.
func (r *requester) flush(q *qp) bool {
	for seq := r.doneSeq; seq < r.execSeq; seq++ {
		t := r.slot(seq)
		if t.status != driver.WCSuccess || t.unbinding() {
			continue
		}
		if done := (t.response && t.responded) || (!t.response && (t.confirmed || seq < r.confSeq)); !done {
			t.status = driver.WCWRFlushErr
		}
	}
	r.orqHead, r.orqTail = 0, 0
	r.cur = txCursor{}
	r.coverSeq, r.confSeq = r.execSeq, r.execSeq
	r.failing = false
	for r.doneSeq < r.execSeq {
		t := r.slot(r.doneSeq)
		if t.unbinding() {
			r.flushHeld = true
			return false
		}
		seq := r.doneSeq
		r.doneSeq++
		if t.status != driver.WCSuccess || t.signaled {
			q.Complete(seq, driver.WorkCompletion{WRID: t.wrid, Status: t.status, Opcode: t.op, ByteLen: t.byteLen})
		}
	}
	r.flushHeld = false
	return true
}

// creditSent takes every executed Send and Write for confirmed (see
// creditOrderlyEnd).
func (r *requester) creditSent() {
	for i := r.doneSeq; i < r.execSeq; i++ {
		if t := r.slot(i); !t.response {
			t.confirmed = true
		}
	}
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
	if q.c != c || c.txLeft() || q.req.cur.active {
		return
	}
	if n, ok := c.sk.unacked(); !ok || n != 0 {
		return
	}
	q.req.creditSent()
}

// timedOut gives the first WR the peer has not confirmed the status of a
// request whose transport retries ran out: the connection timed out
// (TCP_USER_TIMEOUT). That is the first executed WR not confirmed, or
// else the one the transmitter is in the middle of (toErr completes it
// in order). The caller then fails the QP, flushing the rest.
func (r *requester) timedOut() {
	if k := max(r.doneSeq, r.confSeq); k < r.execSeq {
		if t := r.slot(k); t.status == driver.WCSuccess {
			t.status = driver.WCRetryExcErr
		}
		return
	}
	r.expired = r.cur.active
}

// terminated applies a Terminate from the peer to the WR it names: that
// WR gets status, the Sends and Writes before it are confirmed, and the
// caller then fails the QP. hdr is the copy of the terminated segment's
// headers, nil when the Terminate carries none.
func (q *qp) terminated(hdr wire.Hdr, status driver.WCStatus) {
	r := &q.req
	k := r.execSeq
	if hdr != nil {
		for i := r.doneSeq; i < r.execSeq; i++ {
			t := r.slot(i)
			if hdr.Tagged() {
				// The terminated segment lies within the WR's range
				// (toEnd is past its end; a zero-length Write's segment
				// is at to), which tells a Write from an earlier one to
				// the same place that was placed whole, unless the two
				// have the same range too.
				to, n := hdr.TO(), uint64(max(hdr.PayloadLen(), 0))
				if t.tagged && t.stag == hdr.STag() && to >= t.to && (to < t.toEnd || to == t.to) && to+n <= max(t.toEnd, t.to) {
					k = i
					break
				}
			} else if t.untagged && t.qn == hdr.QN() && hdr.MSN()-t.msn0 <= t.msn1-t.msn0 {
				k = i
				break
			}
		}
	}
	if k == r.execSeq && hdr != nil && !hdr.Tagged() && hdr.QN() == wire.QNRead && r.orqHead != r.orqTail {
		// A Read Request no WR matches by its MSN (a confirming Read
		// has no WR; Linux siw copies a header with a wrong MSN into
		// the Terminate it sends when it fails to answer a zero-length
		// Read, see oversizedAnswerMax): a responder takes messages and
		// answers Reads in order, so it is the oldest Read not
		// answered, and every Send and Write before it was placed.
		e := &r.orq[r.orqHead%maxRdAtomic]
		if e.kind != orqAtomic {
			r.confSeq = max(r.confSeq, e.cover)
			if e.kind == orqConfirm {
				return // the WRs after it are flushed
			}
			k = e.seq
		}
	}
	if k == r.execSeq {
		// No WR matches: blame the first one the responder had not
		// confirmed.
		k = max(r.doneSeq, r.confSeq)
	}
	if k < r.execSeq {
		for i := r.doneSeq; i < k; i++ {
			if t := r.slot(i); !t.response {
				t.confirmed = true
			}
		}
		r.slot(k).status = status
	}
}

// terminateStatus maps the error a Terminate reports to the status of
// the WR it terminated.
func terminateStatus(layer wire.Layer, etype, ecode uint8) driver.WCStatus {
	switch layer {
	case wire.LayerRDMAP:
		switch etype {
		case wire.RDMAPRemoteProtect:
			return driver.WCRemAccessErr
		case wire.RDMAPRemoteOperation:
			if ecode == wire.RDMAPCatastrophicLocal || ecode == wire.RDMAPCatastrophicAll {
				return driver.WCRemOpErr
			}
			return driver.WCRemInvReqErr
		}
	case wire.LayerDDP:
		switch etype {
		case wire.DDPTaggedError:
			return driver.WCRemAccessErr
		case wire.DDPUntaggedError:
			switch ecode {
			case wire.DDPNoBuffer:
				// No receive was posted: what InfiniBand reports once RNR
				// retries run out, without the retries.
				return driver.WCRNRRetryExcErr
			case wire.DDPTooLong:
				return driver.WCRemInvReqErr
			}
		}
	}
	return driver.WCRemOpErr
}

// atomicDone places the original value of the atomic at the head of the
// ORQ into its result buffer and completes it; ok is false when the head
// is not the atomic id. revoked: the result buffer was deregistered or
// invalidated meanwhile, nothing was written there, and the WR failed
// with WCLocProtErr, which the QP's move to the error state (the
// caller's) completes.
func (q *qp) atomicDone(id uint32, value uint64) (ok, revoked bool) {
	r := &q.req
	if r.orqHead == r.orqTail {
		return false, false
	}
	e := &r.orq[r.orqHead%maxRdAtomic]
	if e.kind != orqAtomic || e.id != id {
		return false, false
	}
	for _, m := range e.mrs[:e.nmr] {
		if m.ext.Revoked() {
			// Dereg takes q.mu after it revokes.
			r.slot(e.seq).status = driver.WCLocProtErr
			q.responseDone(8)
			return true, true
		}
	}
	binary.NativeEndian.PutUint64(r.result[:], value)
	var src, dst sglist.List
	src.One(r.result[:])
	for i := range e.nseg {
		dst.Add(e.segs[i])
	}
	sglist.Copy(&dst, &src)
	q.responseDone(8)
	return true, false
}
