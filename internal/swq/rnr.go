package swq

import (
	"time"

	"github.com/goverbs/goverbs/verbs/driver"
)

// RNR handles receiver-not-ready for the WR at the head of a queue: it
// counts the retries against the QP's RNRRetry and times the wait before
// each. Its one timer is made at the first wait and re-armed after, so
// that a wait allocates nothing. The lock that guards the queue guards
// it.
type RNR struct {
	fire    func()
	retries int
	timer   *time.Timer
	due     time.Time // when the pending retry is due
	waiting bool      // a retry is pending
}

// Init sets what runs, on a timer goroutine, when a wait ends: fire must
// take the queue's lock, call Expired and, if it reports true, progress
// the queue. Call it once, when the QP is made.
func (r *RNR) Init(fire func()) { r.fire = fire }

// Answered ends the run of retries of the WR at the head of the queue:
// the responder answered it with anything but RNRWait.
func (r *RNR) Answered() { r.retries = 0 }

// Wait handles an RNRWait from the responder. While the WR may be
// retried under rnrRetry (driver.RNRRetryInfinite: forever), it returns
// RNRWait, and the retry is due after d, when Init's function runs. Once
// the retries are spent, Wait returns WCRNRRetryExcErr.
func (r *RNR) Wait(rnrRetry uint8, d time.Duration) driver.WCStatus {
	if rnrRetry != driver.RNRRetryInfinite && r.retries >= int(rnrRetry) {
		r.retries = 0
		return driver.WCRNRRetryExcErr
	}
	r.retries++
	r.due, r.waiting = time.Now().Add(d), true
	if r.timer == nil {
		r.timer = time.AfterFunc(d, r.fire)
	} else {
		r.timer.Reset(d)
	}
	return RNRWait
}

// Waiting reports whether a retry is pending: execution must wait (the
// Engine's Stalled).
func (r *RNR) Waiting() bool { return r.waiting }

// Retrying reports whether the WR at the head of the queue has met
// receiver-not-ready and not been answered since: it is under way.
func (r *RNR) Retrying() bool { return r.retries > 0 }

// ExecState is the state a queue executes in (the Engine's State) for a
// QP in state st: a QP moved to SQD while the WR at the head retries
// receiver-not-ready goes on retrying it, as a WR under way that the
// drain waits for, and starts no other.
func (r *RNR) ExecState(st driver.QPState) driver.QPState {
	if st == driver.QPSSQD && r.Retrying() {
		return driver.QPSRTS
	}
	return st
}

// Expired is called by Init's function, under the queue's lock: it reports
// whether the pending retry is due, and ends the wait if so. A firing
// that Stop came too late for finds nothing pending; one left over from
// an earlier wait, when the WR has had to wait again since, re-arms the
// timer for the rest of the new wait. Both report false.
func (r *RNR) Expired() bool {
	if !r.waiting {
		return false
	}
	if left := time.Until(r.due); left > 0 {
		r.timer.Reset(left)
		return false
	}
	r.waiting = false
	return true
}

// Stop cancels a pending retry.
func (r *RNR) Stop() {
	if r.timer != nil {
		r.timer.Stop()
	}
	r.waiting = false
}

// Reset cancels a pending retry and clears the retry count, as when the
// QP is reset.
func (r *RNR) Reset() {
	r.Stop()
	r.Answered()
}
