package soft

import "github.com/goverbs/goverbs/verbs/driver"

// EventQueue is a device context's queue of asynchronous events
// (ibv_get_async_event): Events is the channel the application reads, and
// Event delivers one, dropping it when the queue is full rather than
// blocking the data path.
type EventQueue struct{ ch chan driver.AsyncEvent }

// eventQueueLen is how many events wait for the application at most.
const eventQueueLen = 64

// NewEventQueue makes an empty event queue.
func NewEventQueue() EventQueue { return EventQueue{ch: make(chan driver.AsyncEvent, eventQueueLen)} }

// Events is the channel of the queue's events.
func (q EventQueue) Events() <-chan driver.AsyncEvent { return q.ch }

// Event delivers an event of type t about element (a QP's, CQ's or
// SRQ's user context), or drops it if nobody reads them.
func (q EventQueue) Event(t driver.EventType, element any) {
	select {
	case q.ch <- driver.AsyncEvent{Type: t, Element: element}:
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
func (a *Arm) Fire(wc *driver.WorkCompletion, solicited bool) bool {
	if *a == ArmedAny || (*a == ArmedSolicited && (solicited || wc.Status != driver.WCSuccess)) {
		*a = Unarmed
		return true
	}
	return false
}
