package loop

import (
	"encoding/binary"
	"time"

	"github.com/goverbs/goverbs/internal/sglist"
	"github.com/goverbs/goverbs/internal/swq"
	"github.com/goverbs/goverbs/verbs/driver"
)

// The requester: the QP as the swq engine that executes its send queue.

// progress executes the send queue as far as it can.
func (q *qp) progress() {
	if !q.destroyed {
		q.sq.Progress(q)
	}
}

// State implements swq.Engine.
func (q *qp) State() driver.QPState { return q.attr.State }

// Stalled implements swq.Engine: an RNR retry is pending.
func (q *qp) Stalled() bool { return q.rnrTimer != nil }

// Complete implements swq.Engine.
func (q *qp) Complete(seq uint64, wc driver.WorkCompletion) { q.completeSend(seq, wc) }

// Fail implements swq.Engine.
func (q *qp) Fail() { q.toErr() }

// Execute implements swq.Engine: it performs one WR against the peer.
func (q *qp) Execute(s *swq.Slot) (driver.WCStatus, uint32) {
	p := q.peer
	if p == nil || p.destroyed || p.ctx.closed || !p.accepts() {
		// Nobody answers: the transport retries run out.
		return driver.WCRetryExcErr, 0
	}
	wr := &s.WR
	var local sglist.List
	if s.IsInline {
		local.One(s.Inline)
	} else {
		need := driver.AccessFlags(0)
		if !wr.Opcode.ReadsLocal() {
			need = driver.AccessLocalWrite
		}
		if !q.resolve(&local, wr.SGList, need) {
			return driver.WCLocProtErr, 0
		}
	}
	length := local.Len()
	if length > deviceAttr.MaxMsgSize {
		return driver.WCLocLenErr, 0
	}
	switch wr.Opcode {
	case driver.OpSend, driver.OpSendWithImm:
		return q.rnrCheck(p.receive(q, wr, &local)), 0
	case driver.OpRDMAWrite, driver.OpRDMAWriteWithImm:
		return q.rnrCheck(p.write(q, wr, &local)), 0
	case driver.OpRDMARead:
		return p.read(wr, &local), uint32(length)
	case driver.OpAtomicCmpAndSwp, driver.OpAtomicFetchAndAdd:
		old, st := p.atomic(wr)
		if st == driver.WCSuccess {
			binary.NativeEndian.PutUint64(q.result[:], old)
			var src sglist.List
			src.One(q.result[:])
			sglist.Copy(&local, &src)
		}
		return st, 8
	}
	return driver.WCLocQPOpErr, 0
}

// resolve maps a local SG list of q to memory, requiring need on each
// region; false on a bad key, PD, right or range.
func (q *qp) resolve(l *sglist.List, sg []driver.SGE, need driver.AccessFlags) bool {
	l.Reset()
	for i := range sg {
		b, ok := q.ctx.span(sg[i].LKey, q.pd, sg[i].Addr, uint64(sg[i].Length), need)
		if !ok || !l.Add(b) {
			return false
		}
	}
	return true
}

// rnrCheck turns the responder's answer into the requester's: a receiver
// not ready is retried after the responder's RNR timer, up to the QP's
// RNRRetry count, then fails with WCRNRRetryExcErr.
func (q *qp) rnrCheck(st driver.WCStatus) driver.WCStatus {
	if st != swq.RNRWait {
		q.rnr.Reset()
		return st
	}
	if st = q.rnr.Next(q.attr.RNRRetry); st != swq.RNRWait {
		return st
	}
	gen := q.rnrGen
	q.rnrTimer = time.AfterFunc(q.peer.attr.MinRNRTimer.Duration(), func() {
		fab.mu.Lock()
		defer fab.mu.Unlock()
		if q.rnrGen == gen && !q.destroyed {
			q.rnrTimer = nil
			q.progress()
		}
	})
	return st
}
