// Package swq is the send queue engine the software providers share: the
// ring of posted send work requests, their validation and inline copy at
// post time, the in-order execution loop with its flush and RNR handling,
// and the retirement of slots as completions are polled. A provider
// supplies the transport through the Engine interface.
//
// A Queue is not safe for concurrent use: its provider serialises Post,
// Progress, Reset, and Idle, Room and Commit for the WRs it performs at
// once, and, apart from them, the poller of the QP's send CQ serialises
// Retire.
package swq

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"

	"github.com/goverbs/goverbs/internal/atomicrel"
	"github.com/goverbs/goverbs/internal/sglist"
	"github.com/goverbs/goverbs/verbs/driver"
)

// Slot is a posted send work request: a copy of the WR whose SG list
// points into the slot's own array, and the inline payload copied at post
// time.
type Slot struct {
	WR       driver.SendWR
	Inline   []byte
	IsInline bool
	Signaled bool
	sge      []driver.SGE
}

// Queue is a send queue. Its slots are indexed by three monotonically
// increasing counters: head is the oldest slot not yet retired (its
// completion, or a later one, has not been polled), next the next WR to
// execute, and tail the next free slot.
type Queue struct {
	slots  []Slot // a power of two of them, indexed by counter&mask
	mask   uint64
	head   atomic.Uint64 // advanced by pollers
	next   atomic.Uint64 // read by pollers
	tail   uint64
	cap    driver.QPCap
	sigAll bool
	busy   bool

	// MW makes Post take the memory window opcodes (OpLocalInv,
	// OpBindMW, OpSendWithInv), which CheckSendWR otherwise refuses; a
	// provider that sets it refuses the ones it lacks itself. New makes
	// a queue without them.
	MW bool
}

// New makes a send queue with the capacities of cap.
func New(cap driver.QPCap, sigAll bool) *Queue {
	n := 1
	for n < int(cap.MaxSendWR) {
		n <<= 1
	}
	q := &Queue{slots: make([]Slot, n), mask: uint64(n - 1), cap: cap, sigAll: sigAll}
	for i := range q.slots {
		q.slots[i].sge = make([]driver.SGE, 0, cap.MaxSendSGE)
		q.slots[i].Inline = make([]byte, 0, cap.MaxInlineData)
	}
	return q
}

// Memory finds a QP's local memory: the bytes an SGE names, if they lie
// inside a region registered on the QP's protection domain that grants
// need; false otherwise.
type Memory interface {
	LocalSpan(g *driver.SGE, need driver.AccessFlags) ([]byte, bool)
}

// Check validates wr against the queue's capacities, as Post does
// (driver.CheckSendWR).
func (q *Queue) Check(wr *driver.SendWR) error { return driver.CheckSendWR(wr, &q.cap, q.MW) }

// Post validates wr and queues it, copying an inline payload from mem.
func (q *Queue) Post(wr *driver.SendWR, mem Memory) error {
	if err := q.Check(wr); err != nil {
		return err
	}
	if q.tail-q.head.Load() >= uint64(q.cap.MaxSendWR) {
		return driver.ErrQueueFull
	}
	s := &q.slots[q.tail&q.mask]
	s.WR = *wr
	s.sge = append(s.sge[:0], wr.SGList...)
	s.WR.SGList = s.sge
	s.Signaled = q.sigAll || wr.Flags&driver.SendSignaled != 0
	s.IsInline = wr.Flags&driver.SendInline != 0
	s.Inline = s.Inline[:0]
	if s.IsInline {
		for i := range wr.SGList {
			b, ok := mem.LocalSpan(&wr.SGList[i], 0)
			if !ok {
				return fmt.Errorf("%w: inline SGE %d is not inside a region registered on this PD", driver.ErrInvalidArg, i)
			}
			s.Inline = append(s.Inline, b...)
		}
	}
	q.tail++
	return nil
}

// Idle reports whether every posted WR has been executed, and Progress
// is not under way: a WR posted now may be performed at once, in the
// poster's goroutine, straight from its WR (Commit).
func (q *Queue) Idle() bool { return !q.busy && q.next.Load() == q.tail }

// Room reports whether a slot is free for one more WR.
func (q *Queue) Room() bool { return q.tail-q.head.Load() < uint64(q.cap.MaxSendWR) }

// Commit accounts for a WR that the provider performed at once, while
// the queue was Idle and had Room, and validated as Post would have (a
// WR Post would refuse, or whose execution fails, goes through Post
// instead): it takes a slot, which the send queue's depth counts until
// its completion (or a later one) is polled, without copying the WR
// into it, and returns the slot's sequence number for the completion. It
// also reports whether the WR is signaled, counting the QP's SignalAll.
func (q *Queue) Commit(wr *driver.SendWR) (seq uint64, signaled bool) {
	seq = q.tail
	q.tail++
	atomicrel.StoreUint64(&q.next, q.tail)
	return seq, q.sigAll || wr.Flags&driver.SendSignaled != 0
}

// Retire frees the slots up to and including seq, once a completion for
// seq has been polled. Values that cannot name an executed slot are
// ignored, so a forged completion cannot free a slot still in use. Calls
// are serialised (a QP's send completions are polled from one CQ, under
// its lock), so head has one writer and a release store publishes it.
func (q *Queue) Retire(seq uint64) {
	if seq >= q.head.Load() && seq < q.next.Load() {
		atomicrel.StoreUint64(&q.head, seq+1)
	}
}

// Reset empties the queue without completions. The counters go on from
// where they were rather than back to 0: completions made before the
// reset may still be in the QP's CQ, and polling one after it must not
// free the slots of WRs posted since (Retire ignores numbers below head).
// Besides the provider's own lock, the caller holds the lock under which
// the QP's send CQ is polled, since Retire's release store must not land
// after the reset.
func (q *Queue) Reset() {
	q.head.Store(q.tail)
	q.next.Store(q.tail)
}

// Depth is how many slots are taken: WRs posted and not yet retired.
func (q *Queue) Depth() uint64 { return q.tail - q.head.Load() }

// Queued is how many WRs are posted and not yet executed.
func (q *Queue) Queued() uint64 { return q.tail - q.next.Load() }

// Tail is the number the next WR posted will have.
func (q *Queue) Tail() uint64 { return q.tail }

// ResolveLocal maps the local side of slot s into l: its inline payload,
// or its SG list — the source of Sends and Writes, or the sink of Reads and
// atomics, which needs AccessLocalWrite. It reports false on a bad lkey,
// PD, right or range (the WR then completes with WCLocProtErr).
func ResolveLocal(l *sglist.List, s *Slot, mem Memory) bool {
	l.Reset()
	if s.IsInline {
		l.One(s.Inline)
		return true
	}
	return ResolveSGL(l, s.WR.SGList, NeedOf(s.WR.Opcode), mem)
}

// NeedOf is the right a WR of op needs of its local memory:
// AccessLocalWrite where it writes it (Reads and atomics).
func NeedOf(op driver.Opcode) driver.AccessFlags {
	if op.ReadsLocal() {
		return 0
	}
	return driver.AccessLocalWrite
}

// ResolveSGL maps a scatter/gather list into l, requiring need of every
// region; false on a bad lkey, PD, right or range.
func ResolveSGL(l *sglist.List, sg []driver.SGE, need driver.AccessFlags, mem Memory) bool {
	l.Reset()
	for i := range sg {
		b, ok := mem.LocalSpan(&sg[i], need)
		if !ok || !l.Add(b) {
			return false
		}
	}
	return true
}

// PlaceResult writes an atomic's previous value, in host byte order,
// into the WR's local buffer l: with one store when l is one 8-byte
// segment, as it usually is, else through the QP's scratch word.
func PlaceResult(l *sglist.List, scratch *[8]byte, old uint64) {
	if l.N() == 1 && len(l.Seg(0)) == 8 {
		binary.NativeEndian.PutUint64(l.Seg(0), old)
		return
	}
	binary.NativeEndian.PutUint64(scratch[:], old)
	l.Fill(scratch[:])
}

// Engine is the transport a provider plugs into Progress.
type Engine interface {
	// State is the QP's state.
	State() driver.QPState
	// Stalled reports that execution must wait (an RNR retry is pending).
	Stalled() bool
	// Execute performs the WR and returns its status and, for Reads and
	// atomics, the bytes placed locally; RNRWait says the WR met a
	// receiver-not-ready condition and stays at the head of the queue;
	// Pending says the WR is under way and the engine completes it later.
	Execute(s *Slot) (driver.WCStatus, uint32)
	// Complete reports the completion of slot seq.
	Complete(seq uint64, wc driver.WorkCompletion)
	// Fail moves the QP to the error state after a failed WR.
	Fail()
}

// RNRWait is the status Execute returns for a WR that waits for an RNR
// retry.
const RNRWait driver.WCStatus = 255

// Pending is the status Execute returns for a WR it has started whose
// outcome comes later (a transport that waits for the responder):
// Progress moves on to the next WR without a completion, and the provider
// completes the WR itself, in order, through its own Complete.
const Pending driver.WCStatus = 254

// Progress executes the queue in order as far as it can: every WR while
// the QP is in RTS, flushing them with WCWRFlushErr once it is in the
// error state, and stopping at a WR that waits. An error completes the WR
// (signaled or not) and moves the QP to the error state. A nested call —
// Fail that calls Progress again — returns at once and the running loop
// carries on.
func (q *Queue) Progress(e Engine) {
	if q.busy {
		return
	}
	q.busy = true
	// next is published to pollers (Retire) before each completion is
	// reported, and when the loop ends: a run of WRs that complete
	// unsignaled publishes it once. (No closures: seq stays in a
	// register.)
	seq := q.next.Load()
	pub := seq
	for seq != q.tail {
		s := &q.slots[seq&q.mask]
		if st := e.State(); st == driver.QPSErr {
			seq++
			pub = seq
			q.report(e, s, seq, driver.WCWRFlushErr, 0)
			continue
		} else if st != driver.QPSRTS || e.Stalled() {
			break
		}
		st, n := e.Execute(s)
		if st == RNRWait {
			break
		}
		seq++
		switch {
		case st == Pending:
			// The provider completes it later, perhaps before this
			// loop ends.
			atomicrel.StoreUint64(&q.next, seq)
			pub = seq
		case st != driver.WCSuccess:
			pub = seq
			q.report(e, s, seq, st, n)
			e.Fail()
		case s.Signaled:
			pub = seq
			q.report(e, s, seq, st, n)
		}
	}
	if pub != seq {
		atomicrel.StoreUint64(&q.next, seq)
	}
	q.busy = false
}

// FailNext completes the WR at the head of the unexecuted ones — the one
// Execute returned RNRWait for, part done — with st, as if Execute had
// returned st, for a transport that gave up on it (its retries ran out).
// It does nothing inside Progress or with nothing queued. The caller
// moves the QP to the error state, flushing the rest.
func (q *Queue) FailNext(e Engine, st driver.WCStatus) {
	seq := q.next.Load()
	if q.busy || seq == q.tail {
		return
	}
	q.report(e, &q.slots[seq&q.mask], seq+1, st, 0)
}

// report publishes next, seq, and reports the completion of slot s, just
// before it.
func (q *Queue) report(e Engine, s *Slot, seq uint64, st driver.WCStatus, n uint32) {
	atomicrel.StoreUint64(&q.next, seq)
	e.Complete(seq-1, driver.WorkCompletion{WRID: s.WR.WRID, Status: st, Opcode: s.WR.Opcode.CompletionOpcode(), ByteLen: n})
}

// Waiting reports whether WRs are posted that have not been executed.
// The caller serialises it with Post and Progress.
func (q *Queue) Waiting() bool { return q.next.Load() != q.tail }
