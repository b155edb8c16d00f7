package soft

import (
	"sync"

	"github.com/goverbs/goverbs/internal/recvq"
	"github.com/goverbs/goverbs/verbs/driver"
)

// QPHooks is what a transport does when the QP skeleton (Modify) moves a
// QP. The provider's lock of the QP is held in every call.
type QPHooks interface {
	// VetoModify may refuse a Modify that leads to next, before any
	// attribute changes.
	VetoModify(next driver.QPState, attr *driver.QPAttr) error
	// Modified runs once a Modify has applied the attributes of mask
	// and the QP has entered its new state.
	Modified(mask driver.QPAttrMask)
	// EnterReset empties the queues without completions and drops the
	// connection; it leaves the attributes at their zero values.
	EnterReset()
	// EnterRTR makes the QP take the peer's requests.
	EnterRTR()
	// EnterRTS makes the send queue progress.
	EnterRTS()
	// DrainSQ starts the drain of a QP moved from RTS to SQD, whose
	// sqdPending the skeleton has set; EventSQDrained is the
	// transport's to raise when the drain is over.
	DrainSQ()
	// EnterErr moves the QP to the error state and flushes what is
	// outstanding; the QP's state is still the one it had before.
	EnterErr()
}

// RecvHooks is how PostRecv and FlushRecvs complete a QP's receives. The
// provider's lock of the QP is held in every call.
type RecvHooks interface {
	// CompleteRecv reports a receive completion of the QP.
	CompleteRecv(wc driver.WorkCompletion)
}

// Modify is the skeleton of QP.Modify for a QP whose attributes are cur
// (cur.State its state): it checks and applies the move
// (Transition), then has h do what entering the new state means.
// sqdPending is the QP's flag of a drain to SQD under way; any state but
// SQD clears it.
func Modify(h QPHooks, cur *driver.QPAttr, sqdPending *bool, destroyed bool, attr *driver.QPAttr, mask driver.QPAttrMask) error {
	if destroyed {
		return driver.ErrClosed
	}
	prev, err := Transition(cur, attr, mask, func(next driver.QPState) error { return h.VetoModify(next, attr) })
	if err != nil {
		return err
	}
	if cur.State != driver.QPSSQD {
		*sqdPending = false
	}
	switch cur.State {
	case driver.QPSReset:
		h.EnterReset()
	case driver.QPSRTR:
		h.EnterRTR()
	case driver.QPSRTS:
		h.EnterRTS()
	case driver.QPSSQD:
		if prev == driver.QPSRTS {
			*sqdPending = true
			h.DrainSQ()
		}
	case driver.QPSErr:
		cur.State = prev
		h.EnterErr()
	}
	h.Modified(mask)
	return nil
}

// PostRecv is the skeleton of QP.PostRecv for a QP whose own receive
// queue is rq (nil when it takes its receives from an SRQ) and whose
// state is st: it checks each WR and queues it or, in the error state,
// completes it flushed through h. It returns how many WRs were posted.
func PostRecv(h RecvHooks, rq *recvq.Queue, destroyed bool, st driver.QPState, wrs []driver.RecvWR) (int, error) {
	for i := range wrs {
		if err := postRecv(h, rq, destroyed, st, &wrs[i]); err != nil {
			return i, err
		}
	}
	return len(wrs), nil
}

func postRecv(h RecvHooks, rq *recvq.Queue, destroyed bool, st driver.QPState, wr *driver.RecvWR) error {
	switch {
	case destroyed:
		return driver.ErrClosed
	case rq == nil:
		return ErrRecvOnSRQ
	}
	if err := PostRecvStateErr(st); err != nil {
		return err
	}
	if err := rq.Check(wr); err != nil {
		return err
	}
	if st == driver.QPSErr {
		h.CompleteRecv(driver.WorkCompletion{WRID: wr.WRID, Status: driver.WCWRFlushErr, Opcode: driver.WCRecv})
		return nil
	}
	rq.Push(wr)
	return nil
}

// FlushRecvs completes every receive posted to rq (nil: none) with
// WCWRFlushErr, oldest first, as a QP entering the error state does.
func FlushRecvs(h RecvHooks, rq *recvq.Queue) {
	if rq == nil {
		return
	}
	for r := rq.Peek(); r != nil; r = rq.Peek() {
		rq.Pop()
		h.CompleteRecv(driver.WorkCompletion{WRID: r.WRID, Status: driver.WCWRFlushErr, Opcode: driver.WCRecv})
	}
}

// Accepts reports whether a QP in state st takes its peer's requests:
// RTR onwards, short of the error state.
func Accepts(st driver.QPState) bool {
	switch st {
	case driver.QPSRTR, driver.QPSRTS, driver.QPSSQD, driver.QPSSQE:
		return true
	}
	return false
}

// QP is the verbs face of a QP that the skeleton serves: Num, Query,
// Modify and PostRecv, over the provider's own fields, which Init points
// it to. The provider embeds it and implements QPHooks.
type QP struct {
	num        uint32
	mu         sync.Locker
	hooks      QPHooks
	recv       RecvHooks
	attr       *driver.QPAttr
	destroyed  *bool
	sqdPending *bool
	rq         **recvq.Queue
	// commEst: the QP raised EventCommEst since it last left Reset.
	commEst bool
}

// Init points q at its QP: number num, guarded by mu, transport h, its
// attributes, destroyed and sqdPending flags, and its own receive queue
// rq (nil *rq with an SRQ), whose receives complete through recv. A
// provider that posts receives itself, overriding PostRecv, passes nil
// recv and rq.
func (q *QP) Init(num uint32, mu sync.Locker, h QPHooks, recv RecvHooks, attr *driver.QPAttr, destroyed, sqdPending *bool, rq **recvq.Queue) {
	*q = QP{num: num, mu: mu, hooks: h, recv: recv, attr: attr, destroyed: destroyed, sqdPending: sqdPending, rq: rq}
}

// Num is the QP's number.
func (q *QP) Num() uint32 { return q.num }

// Query reports the QP's attributes, or ErrClosed once it is destroyed.
func (q *QP) Query() (driver.QPAttr, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return QueryQP(*q.attr, *q.destroyed)
}

// Modify moves the QP (see the function Modify).
func (q *QP) Modify(attr *driver.QPAttr, mask driver.QPAttrMask) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	err := Modify(q.hooks, q.attr, q.sqdPending, *q.destroyed, attr, mask)
	if q.attr.State == driver.QPSReset {
		q.commEst = false
	}
	return err
}

// RequestArrived is what the QP's transport calls when a request of its
// peer reaches the QP, before it serves or refuses it: if the QP is in
// RTR, the first such request raises EventCommEst about userCtx on
// events (the IB specification's communication established event,
// which tells a passive side whose QP is still in RTR that the peer has
// begun to send). Every request counts — a Send, an RDMA Write with or
// without immediate data, a Read, an atomic — as the devices that raise
// the event raise it on the first packet of any request, and the
// specification names none. A QP raises it at most once between two
// moves to Reset, and never once it has reached RTS. RequestArrived
// reports whether the QP is past the point where a request could raise
// it (the event raised, or the QP beyond RTR), so that a transport may
// stop calling. The provider's lock of the QP is held.
func (q *QP) RequestArrived(events EventQueue, userCtx any) (settled bool) {
	switch q.attr.State {
	case driver.QPSReset, driver.QPSInit:
		return false
	case driver.QPSRTR:
		if !q.commEst {
			q.commEst = true
			events.Event(driver.EventCommEst, userCtx)
		}
	}
	return true
}

// PostRecv posts receives to the QP's own queue (see the function
// PostRecv).
func (q *QP) PostRecv(wrs []driver.RecvWR) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return PostRecv(q.recv, *q.rq, *q.destroyed, q.attr.State, wrs)
}

// SQDrained raises EventSQDrained on events, once, when a QP in state st
// that was moved from RTS to SQD (pending, which it clears) has drained
// its send queue: busy says a WR is still under way.
func SQDrained(pending *bool, st driver.QPState, busy bool, events EventQueue, userCtx any) {
	if *pending && st == driver.QPSSQD && !busy {
		*pending = false
		events.Event(driver.EventSQDrained, userCtx)
	}
}
