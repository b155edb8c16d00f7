package driver

import "fmt"

// Pieces every provider needs the same way: the asynchronous event queue
// of a device context, the notification arming of a CQ, and the parts of
// QP and SRQ Query and Modify that do not depend on the transport.

// EventQueue is a device context's queue of asynchronous events
// (ibv_get_async_event): Events is the channel the application reads, and
// Event delivers one, dropping it when the queue is full rather than
// blocking the data path.
type EventQueue struct{ ch chan AsyncEvent }

// eventQueueLen is how many events wait for the application at most.
const eventQueueLen = 64

// NewEventQueue makes an empty event queue.
func NewEventQueue() EventQueue { return EventQueue{ch: make(chan AsyncEvent, eventQueueLen)} }

// Events is the channel of the queue's events.
func (q EventQueue) Events() <-chan AsyncEvent { return q.ch }

// Event delivers an event of type t about element (a QP's, CQ's or
// SRQ's user context), or drops it if nobody reads them.
func (q EventQueue) Event(t EventType, element any) {
	select {
	case q.ch <- AsyncEvent{Type: t, Element: element}:
	default:
	}
}

// Arm is the notification arming of a CQ (ibv_req_notify_cq): none, the
// next completion, or the next solicited one.
type Arm uint8

// Armings.
const (
	Unarmed Arm = iota
	ArmedAny
	ArmedSolicited
)

// Request arms for the next completion or, with solicitedOnly, for the
// next solicited or failed one; an arming for any completion stays.
func (a *Arm) Request(solicitedOnly bool) {
	switch {
	case !solicitedOnly:
		*a = ArmedAny
	case *a != ArmedAny:
		*a = ArmedSolicited
	}
}

// Fire reports whether a completion wakes the waiter — any completion
// when armed for any, a solicited or failed one when armed for those —
// and if so disarms.
func (a *Arm) Fire(wc *WorkCompletion, solicited bool) bool {
	if *a == ArmedAny || (*a == ArmedSolicited && (solicited || wc.Status != WCSuccess)) {
		*a = Unarmed
		return true
	}
	return false
}

// QueryQP is Query of a QP whose attributes are attr: attr with
// CurState, or ErrClosed once the QP is destroyed.
func QueryQP(attr QPAttr, destroyed bool) (QPAttr, error) {
	if destroyed {
		return QPAttr{}, ErrClosed
	}
	attr.CurState = attr.State
	return attr, nil
}

// Transition is the state part of Modify of a QP whose attributes are
// cur: it checks the move (CheckModify) and lets veto, if not nil, refuse
// it knowing the state it leads to; then cur takes the attributes mask
// names and the new state. It returns the state the QP leaves; the
// provider does what entering cur.State means.
func Transition(cur, attr *QPAttr, mask QPAttrMask, veto func(next QPState) error) (prev QPState, err error) {
	next, err := CheckModify(cur.State, attr, mask)
	if err != nil {
		return cur.State, err
	}
	if veto != nil {
		if err := veto(next); err != nil {
			return cur.State, err
		}
	}
	ApplyAttr(cur, attr, mask)
	prev, cur.State = cur.State, next
	return prev, nil
}

// SRQLimit checks Modify of an SRQ of entries work requests, which cannot
// be resized, named provider in errors: it returns the new limit when
// mask sets one.
func SRQLimit(a SRQAttr, mask SRQAttrMask, entries uint32, provider string) (limit uint32, set bool, err error) {
	if mask&SRQAttrMaxWR != 0 {
		return 0, false, fmt.Errorf("%w: %s SRQs cannot be resized; create a larger one", ErrUnsupported, provider)
	}
	if mask&SRQAttrLimit == 0 {
		return 0, false, nil
	}
	if a.Limit > entries {
		return 0, false, fmt.Errorf("%w: limit %d above the SRQ's %d entries", ErrInvalidArg, a.Limit, entries)
	}
	return a.Limit, true, nil
}

// CheckQPInit checks the parts of CreateQP that depend only on the
// provider's types and limits: an RC QP, CQs (and an SRQ, if any) of the
// provider's own types C and S, and capacities within maxSGE
// scatter/gather entries and maxInline inline bytes. It returns the CQs
// and the SRQ (the zero S without one); provider names the provider in
// errors.
func CheckQPInit[C, S any](a QPInitAttr, provider string, maxSGE, maxInline int) (send, recv C, srq S, err error) {
	if a.Type != QPTypeRC {
		return send, recv, srq, fmt.Errorf("%w: %s supports only RC QPs", ErrUnsupported, provider)
	}
	var ok1, ok2 bool
	send, ok1 = a.SendCQ.(C)
	recv, ok2 = a.RecvCQ.(C)
	if !ok1 || !ok2 {
		return send, recv, srq, fmt.Errorf("%w: CQs of another provider", ErrInvalidArg)
	}
	if a.SRQ != nil {
		if srq, ok1 = a.SRQ.(S); !ok1 {
			return send, recv, srq, fmt.Errorf("%w: SRQ of another provider", ErrInvalidArg)
		}
	}
	if c := a.Cap; c.MaxSendSGE > uint32(maxSGE) || c.MaxRecvSGE > uint32(maxSGE) || c.MaxInlineData > uint32(maxInline) {
		return send, recv, srq, fmt.Errorf("%w: capacities %+v beyond the device's (%d SGEs, %d inline bytes)", ErrInvalidArg, c, maxSGE, maxInline)
	}
	return send, recv, srq, nil
}
