// Package recvq is a queue of posted receive work requests, as the
// providers that keep receives in their own memory (loop, iwarp) keep one
// for each QP's receive queue and each SRQ: bounded, in order, each entry
// a copy of the WR's scatter/gather list, with an SRQ's limit event. It
// does no locking; its user does.
package recvq

import "github.com/goverbs/goverbs/verbs/driver"

// WR is a posted receive: its WRID and a copy of its scatter/gather list.
type WR struct {
	WRID uint64
	SGE  []driver.SGE
}

// Queue is a bounded queue of posted receives.
type Queue struct {
	slots      []WR
	head, tail uint64
	maxSGE     uint32
	// Limit arms the SRQ limit event (ibv_modify_srq's srq_limit): when a
	// receive taken leaves fewer than Limit posted, Pop reports it and
	// Limit returns to 0. 0 is unarmed.
	Limit uint32
}

// New makes a queue of n receives of at most maxSGE entries each, their
// lists allocated now.
func New(n int, maxSGE uint32) *Queue {
	q := &Queue{slots: make([]WR, n), maxSGE: maxSGE}
	for i := range q.slots {
		q.slots[i].SGE = make([]driver.SGE, 0, maxSGE)
	}
	return q
}

// Cap is the number of receives the queue holds.
func (q *Queue) Cap() int { return len(q.slots) }

// Check reports why wr cannot be posted: the queue is full
// (ErrQueueFull), or wr is malformed (driver.CheckRecvWR).
func (q *Queue) Check(wr *driver.RecvWR) error {
	if q.tail-q.head == uint64(len(q.slots)) {
		return driver.ErrQueueFull
	}
	return driver.CheckRecvWR(wr, q.maxSGE)
}

// Push queues wr, which Check accepted.
func (q *Queue) Push(wr *driver.RecvWR) {
	s := &q.slots[q.tail%uint64(len(q.slots))]
	s.WRID = wr.WRID
	s.SGE = append(s.SGE[:0], wr.SGList...)
	q.tail++
}

// Post checks and queues wr.
func (q *Queue) Post(wr *driver.RecvWR) error {
	if err := q.Check(wr); err != nil {
		return err
	}
	q.Push(wr)
	return nil
}

// Peek returns the oldest receive, or nil when none is posted. It stays
// valid until the next Push.
func (q *Queue) Peek() *WR {
	if q.head == q.tail {
		return nil
	}
	return &q.slots[q.head%uint64(len(q.slots))]
}

// Pop removes the oldest receive, and reports whether that leaves fewer
// than the armed Limit posted (disarming it).
func (q *Queue) Pop() (limitReached bool) {
	q.head++
	if q.Limit > 0 && q.tail-q.head < uint64(q.Limit) {
		q.Limit = 0
		return true
	}
	return false
}

// Take copies the oldest receive into dst and removes it: ok is false when
// none is posted.
func (q *Queue) Take(dst *WR) (ok, limitReached bool) {
	w := q.Peek()
	if w == nil {
		return false, false
	}
	dst.WRID = w.WRID
	dst.SGE = append(dst.SGE[:0], w.SGE...)
	return true, q.Pop()
}

// Reset empties the queue.
func (q *Queue) Reset() { q.head, q.tail = 0, 0 }
