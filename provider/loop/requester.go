package loop

import (
	"encoding/binary"
	"time"

	"github.com/goverbs/goverbs/verbs/driver"
)

// rnrWait is the outcome of a WR that met a receiver-not-ready condition
// and waits for its retry.
const rnrWait driver.WCStatus = 255

// progress executes the send queue in order as far as it can: every WR
// when the QP is in RTS, flushing them when it is in the error state, and
// stopping at a WR that waits for an RNR retry. It is re-entrant safe: a
// call made while progress runs on the same QP (an error moving the QP to
// Err) returns at once and the running loop carries on.
func (q *qp) progress() {
	if q.inProgress || q.destroyed {
		return
	}
	q.inProgress = true
	defer func() { q.inProgress = false }()
	for q.sqNext != q.sqTail {
		seq := q.sqNext
		s := &q.sq[seq%uint64(len(q.sq))]
		if q.attr.State == driver.QPSErr {
			q.sqNext++
			q.completeSend(seq, driver.WorkCompletion{WRID: s.wr.WRID, Status: driver.WCWRFlushErr, Opcode: s.wr.Opcode.CompletionOpcode()})
			continue
		}
		if q.attr.State != driver.QPSRTS || q.rnrTimer != nil {
			return
		}
		wc := driver.WorkCompletion{WRID: s.wr.WRID, Opcode: s.wr.Opcode.CompletionOpcode()}
		wc.Status, wc.ByteLen = q.execute(s)
		if wc.Status == rnrWait {
			return
		}
		q.sqNext++
		if wc.Status != driver.WCSuccess {
			q.completeSend(seq, wc)
			q.toErr()
			continue
		}
		if s.signaled {
			q.completeSend(seq, wc)
		}
	}
}

// execute performs one WR against the peer and returns its status and,
// for Reads, the bytes read.
func (q *qp) execute(s *swqe) (driver.WCStatus, uint32) {
	p := q.peer
	if p == nil || p.destroyed || p.ctx.closed || !p.accepts() {
		// Nobody answers: the transport retries run out.
		return driver.WCRetryExcErr, 0
	}
	wr := &s.wr
	var local sgList
	if s.isInline {
		local.one(s.inline)
	} else {
		need := driver.AccessFlags(0)
		if !wr.Opcode.ReadsLocal() {
			need = driver.AccessLocalWrite
		}
		if !local.resolve(q, wr.SGList, need) {
			return driver.WCLocProtErr, 0
		}
	}
	length := local.len()
	if length > deviceAttr.MaxMsgSize {
		return driver.WCLocLenErr, 0
	}
	switch wr.Opcode {
	case driver.OpSend, driver.OpSendWithImm:
		return q.rnr(p.receive(q, wr, &local)), 0
	case driver.OpRDMAWrite, driver.OpRDMAWriteWithImm:
		return q.rnr(p.write(q, wr, &local)), 0
	case driver.OpRDMARead:
		st := p.read(wr, &local)
		return st, uint32(length)
	case driver.OpAtomicCmpAndSwp, driver.OpAtomicFetchAndAdd:
		old, st := p.atomic(wr)
		if st == driver.WCSuccess {
			var b [8]byte
			binary.NativeEndian.PutUint64(b[:], old)
			var src sgList
			src.one(b[:])
			copySG(&local, &src)
		}
		return st, 8
	}
	return driver.WCLocQPOpErr, 0
}

// rnr turns the responder's answer into the requester's: a receiver not
// ready is retried after the responder's RNR timer, up to the QP's
// RNRRetry count (7: forever), then fails with WCRNRRetryExcErr.
func (q *qp) rnr(st driver.WCStatus) driver.WCStatus {
	if st != rnrWait {
		q.rnrRetries = 0
		return st
	}
	if q.attr.RNRRetry != driver.RNRRetryInfinite && q.rnrRetries >= int(q.attr.RNRRetry) {
		q.rnrRetries = 0
		return driver.WCRNRRetryExcErr
	}
	q.rnrRetries++
	gen := q.rnrGen
	q.rnrTimer = time.AfterFunc(q.peer.attr.MinRNRTimer.Duration(), func() {
		fab.mu.Lock()
		defer fab.mu.Unlock()
		if q.rnrGen == gen && !q.destroyed {
			q.rnrTimer = nil
			q.progress()
		}
	})
	return rnrWait
}
