package loop

import (
	"github.com/goverbs/goverbs/internal/grant"
	"github.com/goverbs/goverbs/internal/sglist"
	"github.com/goverbs/goverbs/internal/soft"
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

// State implements swq.Engine (see swq.RNR.ExecState).
func (q *qp) State() driver.QPState { return q.rnr.ExecState(q.attr.State) }

// sqDrained raises EventSQDrained once a QP moved to SQD has drained its
// send queue: the WR retrying receiver-not-ready, if any, is done.
func (q *qp) sqDrained() {
	soft.SQDrained(&q.sqdPending, q.attr.State, q.rnr.Retrying(), q.ctx.EventQueue, q.userCtx)
}

// Stalled implements swq.Engine: an RNR retry is pending.
func (q *qp) Stalled() bool { return q.rnr.Waiting() }

// Complete implements swq.Engine.
func (q *qp) Complete(seq uint64, wc driver.WorkCompletion) { q.completeSend(seq, wc) }

// Fail implements swq.Engine.
func (q *qp) Fail() { q.toErr() }

// Execute implements swq.Engine: it performs one WR against the peer.
func (q *qp) Execute(s *swq.Slot) (driver.WCStatus, uint32) {
	// The memory window operations are local: they need no peer.
	switch s.WR.Opcode {
	case driver.OpBindMW:
		st, _, _ := grant.ExecuteBind(&q.ctx.mrs, &s.WR, q, q.pd, nil)
		return st, 0
	case driver.OpLocalInv:
		st, _ := grant.LocalInvalidate(&q.ctx.mrs, s.WR.InvalidateRKey, q, q.pd)
		return st, 0
	}
	p := q.peer
	if p == nil || p.destroyed || p.ctx.closed || !p.accepts() || p.peer != q {
		// Nobody answers — no QP, or one that is now connected to
		// another (reset and reused since), which takes nothing from a
		// stale requester, as RC's QP number and PSN checks refuse it:
		// the transport retries run out.
		return driver.WCRetryExcErr, 0
	}
	wr := &s.WR
	var local sglist.List
	if !swq.ResolveLocal(&local, s, q) {
		return driver.WCLocProtErr, 0
	}
	length := local.Len()
	if length > deviceAttr.MaxMsgSize {
		return driver.WCLocLenErr, 0
	}
	// The request leaves: a WR that failed at its requester reached
	// nobody.
	p.RequestArrived(p.ctx.EventQueue, p.userCtx)
	switch wr.Opcode {
	case driver.OpSend, driver.OpSendWithImm, driver.OpSendWithInv:
		return q.rnrCheck(p.receive(q, wr, &local)), 0

	case driver.OpRDMAWrite, driver.OpRDMAWriteWithImm:
		return q.rnrCheck(p.write(q, wr, &local)), 0
	case driver.OpRDMARead:
		return p.read(wr, &local), uint32(length)
	case driver.OpAtomicCmpAndSwp, driver.OpAtomicFetchAndAdd:
		old, st := p.atomic(wr)
		if st == driver.WCSuccess {
			swq.PlaceResult(&local, &q.result, old)
		}
		return st, 8
	}
	return driver.WCLocQPOpErr, 0
}

// LocalSpan implements swq.Memory: the SGE's bytes in a region of q's PD
// that grants need.
func (q *qp) LocalSpan(g *driver.SGE, need driver.AccessFlags) ([]byte, bool) {
	return q.ctx.span(g.LKey, q.pd, nil, g.Addr, uint64(g.Length), need)
}

// rnrCheck turns the responder's answer into the requester's: a receiver
// not ready is retried after the responder's RNR timer, up to the QP's
// RNRRetry count, then fails with WCRNRRetryExcErr.
func (q *qp) rnrCheck(st driver.WCStatus) driver.WCStatus {
	if st != swq.RNRWait {
		q.rnr.Answered()
		return st
	}
	return q.rnr.Wait(q.attr.RNRRetry, q.peer.attr.MinRNRTimer.Duration())
}

// rnrExpired retries the stalled WR once its RNR wait is over.
func (q *qp) rnrExpired() {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	if !q.destroyed && q.rnr.Expired() {
		q.progress()
		q.sqDrained()
	}
}
