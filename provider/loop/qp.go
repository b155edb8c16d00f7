package loop

import (
	"fmt"

	"github.com/goverbs/goverbs/internal/recvq"
	"github.com/goverbs/goverbs/internal/swq"
	"github.com/goverbs/goverbs/verbs/driver"
)

// rwqe is a posted receive.
type rwqe = recvq.WR

// qp is a loop queue pair. Its fields are guarded by fab.mu.
type qp struct {
	ctx     *devCtx
	pd      *pd
	num     uint32
	userCtx any
	sendCQ  *cq
	recvCQ  *cq
	srq     *srq
	sigAll  bool
	cap     driver.QPCap
	attr    driver.QPAttr

	sq *swq.Queue

	rq *recvq.Queue // nil with an SRQ

	peer *qp   // the connected QP, set on the move to RTR
	link *link // the cm connection, if any

	rnr       swq.RNR
	result    [8]byte // an atomic's result on its way to the local buffer
	destroyed bool
	// sqdPending: the QP moved to SQD while a Send retried
	// receiver-not-ready, and EventSQDrained waits for it (sqDrained).
	sqdPending bool
}

func (p *pd) CreateQP(a driver.QPInitAttr) (driver.QP, error) {
	scq, rcq, s, err := driver.CheckQPInit[*cq, *srq](a, "loop", maxSGE, deviceAttr.MaxInlineData)
	if err != nil {
		return nil, err
	}
	c := a.Cap
	q := &qp{ctx: p.ctx, pd: p, userCtx: a.UserCtx, sendCQ: scq, recvCQ: rcq, srq: s, sigAll: a.SigAll, cap: c}
	q.rnr.Init(q.rnrExpired)
	q.sq = swq.New(c, a.SigAll)
	q.sq.MW = true
	if s == nil {
		q.rq = recvq.New(int(c.MaxRecvWR), c.MaxRecvSGE)
	}
	q.attr.Cap = c
	fab.mu.Lock()
	defer fab.mu.Unlock()
	if p.ctx.closed || p.released {
		return nil, driver.ErrClosed
	}
	if len(fab.qps) >= deviceAttr.MaxQP {
		return nil, driver.ErrNoResources
	}
	for fab.qps[fab.nextQPN] != nil || fab.nextQPN < 0x11 {
		fab.nextQPN = (fab.nextQPN + 1) & 0xffffff
	}
	q.num = fab.nextQPN
	fab.nextQPN = (fab.nextQPN + 1) & 0xffffff
	fab.qps[q.num] = q
	p.ctx.qps = append(p.ctx.qps, q)
	return q, nil
}

func (q *qp) Num() uint32 { return q.num }

func (q *qp) Query() (driver.QPAttr, error) {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	return driver.QueryQP(q.attr, q.destroyed)
}

func (q *qp) Modify(attr *driver.QPAttr, mask driver.QPAttrMask) error {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	if q.destroyed {
		return driver.ErrClosed
	}
	var peer *qp
	prev, err := driver.Transition(&q.attr, attr, mask, func(next driver.QPState) error {
		if next == driver.QPSRTR && q.attr.State == driver.QPSInit {
			if peer = fab.qps[attr.DestQPNum]; peer == nil || peer == q {
				return fmt.Errorf("%w: no loop QP %d to connect to", driver.ErrInvalidArg, attr.DestQPNum)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if q.attr.State != driver.QPSSQD {
		q.sqdPending = false
	}
	switch q.attr.State {
	case driver.QPSReset:
		q.reset()
	case driver.QPSRTR:
		if peer != nil {
			q.peer = peer
		}
	case driver.QPSRTS:
		q.progress()
	case driver.QPSSQD:
		if prev == driver.QPSRTS {
			// Execution is synchronous: only a Send retrying
			// receiver-not-ready can be under way (sqDrained).
			q.sqdPending = true
			q.sqDrained()
		}
	case driver.QPSErr:
		q.attr.State = prev
		q.toErr()
	}
	return nil
}

// reset empties both queues without completions, as the move to Reset
// does, and ends the QP's cm connection: the peer's QP fails, and the
// link no longer names q, which a later connection may reuse (fab.mu is
// held).
func (q *qp) reset() {
	if l := q.link; l != nil {
		q.link = nil
		for i, x := range l.qps {
			if x == q {
				l.qps[i] = nil
			}
		}
		l.breakLocked()
	}
	q.rnr.Reset()
	q.sq.Reset()
	if q.rq != nil {
		q.rq.Reset()
	}
	q.peer = nil
	q.attr = driver.QPAttr{Cap: q.cap}
}

// toErr moves the QP to the error state and flushes every outstanding
// send and receive with WCWRFlushErr.
func (q *qp) toErr() {
	if q.attr.State == driver.QPSErr {
		return
	}
	q.attr.State = driver.QPSErr
	q.rnr.Stop()
	for q.rq != nil && q.rq.Peek() != nil {
		r := q.rq.Peek()
		q.rq.Pop()
		q.completeRecv(driver.WorkCompletion{WRID: r.WRID, Status: driver.WCWRFlushErr, Opcode: driver.WCRecv})
	}
	if q.srq != nil {
		// It takes no more receives from its SRQ.
		q.ctx.Event(driver.EventQPLastWQEReached, q.userCtx)
	}
	q.progress()
}

func (q *qp) PostSend(wrs []driver.SendWR) (int, error) {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	for i := range wrs {
		if err := q.postSend(&wrs[i]); err != nil {
			q.progress()
			return i, err
		}
	}
	q.progress()
	return len(wrs), nil
}

// postSend queues one WR.
func (q *qp) postSend(wr *driver.SendWR) error {
	if q.destroyed {
		return driver.ErrClosed
	}
	if err := driver.PostSendStateErr(q.attr.State); err != nil {
		return err
	}
	return q.sq.Post(wr, q)
}

func (q *qp) PostRecv(wrs []driver.RecvWR) (int, error) {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	for i := range wrs {
		if err := q.postRecv(&wrs[i]); err != nil {
			return i, err
		}
	}
	return len(wrs), nil
}

func (q *qp) postRecv(wr *driver.RecvWR) error {
	switch {
	case q.destroyed:
		return driver.ErrClosed
	case q.srq != nil:
		return driver.ErrRecvOnSRQ
	}
	if err := driver.PostRecvStateErr(q.attr.State); err != nil {
		return err
	}
	if err := q.rq.Check(wr); err != nil {
		return err
	}
	if q.attr.State == driver.QPSErr {
		q.completeRecv(driver.WorkCompletion{WRID: wr.WRID, Status: driver.WCWRFlushErr, Opcode: driver.WCRecv})
		return nil
	}
	q.rq.Push(wr)
	return nil
}

// completeRecv reports a receive completion; a lost one (CQ overrun)
// moves the QP to the error state.
func (q *qp) completeRecv(wc driver.WorkCompletion) {
	wc.QPNum = q.num
	if !q.recvCQ.push(cqe{wc: wc, solicited: wc.Flags&driver.WCSolicited != 0}) {
		q.fatal()
	}
}

// completeSend reports the completion of the send slot seq.
func (q *qp) completeSend(seq uint64, wc driver.WorkCompletion) {
	wc.QPNum = q.num
	if !q.sendCQ.push(cqe{wc: wc, q: q, retire: seq}) {
		q.fatal()
	}
}

// fatal moves the QP to the error state on its own, with EventQPFatal.
func (q *qp) fatal() {
	if q.attr.State != driver.QPSErr {
		q.ctx.Event(driver.EventQPFatal, q.userCtx)
		q.toErr()
	}
}

func (q *qp) Destroy() error {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	if q.destroyed {
		return driver.ErrClosed
	}
	q.destroy()
	return nil
}

// destroy removes the QP from the fabric and breaks its cm connection.
func (q *qp) destroy() {
	q.rnr.Stop()
	q.destroyed = true
	delete(fab.qps, q.num)
	if q.link != nil {
		q.link.breakLocked()
	}
	for i, x := range q.ctx.qps {
		if x == q {
			q.ctx.qps = append(q.ctx.qps[:i], q.ctx.qps[i+1:]...)
			break
		}
	}
}
