package loop

import (
	"fmt"

	"github.com/goverbs/goverbs/internal/recvq"
	"github.com/goverbs/goverbs/internal/soft"
	"github.com/goverbs/goverbs/internal/swq"
	"github.com/goverbs/goverbs/verbs/driver"
)

// rwqe is a posted receive.
type rwqe = recvq.WR

// qp is a loop queue pair. Its fields are guarded by fab.mu.
type qp struct {
	soft.QP // Num, Query, Modify, PostRecv
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

	peer    *qp   // the connected QP, set on the move to RTR
	rtrPeer *qp   // the peer a Modify to RTR found (VetoModify)
	link    *link // the cm connection, if any

	rnr       swq.RNR
	result    [8]byte // an atomic's result on its way to the local buffer
	destroyed bool
	// sqdPending: the QP moved to SQD while a Send retried
	// receiver-not-ready, and EventSQDrained waits for it (sqDrained).
	sqdPending bool
}

func (p *pd) CreateQP(a driver.QPInitAttr) (driver.QP, error) {
	scq, rcq, s, err := soft.CheckQPInit[*cq, *srq](a, "loop", maxSGE, deviceAttr.MaxInlineData)
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
	if err := soft.Admit(p.ctx.closed || p.Released(), len(fab.qps), deviceAttr.MaxQP); err != nil {
		return nil, err
	}
	for fab.qps[fab.nextQPN] != nil || fab.nextQPN < 0x11 {
		fab.nextQPN = (fab.nextQPN + 1) & 0xffffff
	}
	q.num = fab.nextQPN
	fab.nextQPN = (fab.nextQPN + 1) & 0xffffff
	q.QP.Init(q.num, &fab.mu, q, q, &q.attr, &q.destroyed, &q.sqdPending, &q.rq)
	fab.qps[q.num] = q
	p.ctx.qps = append(p.ctx.qps, q)
	return q, nil
}

// VetoModify implements soft.QPHooks: the move to RTR needs the peer QP
// that attr names.
func (q *qp) VetoModify(next driver.QPState, attr *driver.QPAttr) error {
	if next == driver.QPSRTR && q.attr.State == driver.QPSInit {
		if q.rtrPeer = fab.qps[attr.DestQPNum]; q.rtrPeer == nil || q.rtrPeer == q {
			q.rtrPeer = nil
			return fmt.Errorf("%w: no loop QP %d to connect to", driver.ErrInvalidArg, attr.DestQPNum)
		}
	}
	return nil
}

// Modified implements soft.QPHooks.
func (q *qp) Modified(driver.QPAttrMask) {}

// EnterReset implements soft.QPHooks.
func (q *qp) EnterReset() { q.reset() }

// EnterRTR implements soft.QPHooks: the QP is connected to the peer
// VetoModify found.
func (q *qp) EnterRTR() {
	if q.rtrPeer != nil {
		q.peer, q.rtrPeer = q.rtrPeer, nil
	}
}

// EnterRTS implements soft.QPHooks.
func (q *qp) EnterRTS() { q.progress() }

// DrainSQ implements soft.QPHooks: execution is synchronous, so only a
// Send retrying receiver-not-ready can be under way (sqDrained).
func (q *qp) DrainSQ() { q.sqDrained() }

// EnterErr implements soft.QPHooks.
func (q *qp) EnterErr() { q.toErr() }

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
	soft.FlushRecvs(q, q.rq)
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
	return soft.PostSend(q.sq, q, q.destroyed, q.attr.State, wr)
}

// CompleteRecv implements soft.RecvHooks: it reports a receive completion;
// a lost one (CQ overrun) moves the QP to the error state.
func (q *qp) CompleteRecv(wc driver.WorkCompletion) {
	wc.QPNum = q.num
	if ok, _ := q.recvCQ.PushLocked(&soft.Entry{WC: wc}); !ok {
		q.fatal()
	}
}

// completeSend reports the completion of the send slot seq.
func (q *qp) completeSend(seq uint64, wc driver.WorkCompletion) {
	wc.QPNum = q.num
	if ok, _ := q.sendCQ.PushLocked(&soft.Entry{WC: wc, SQ: q.sq, Retire: seq}); !ok {
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
