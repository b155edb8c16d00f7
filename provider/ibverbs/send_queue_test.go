package ibverbs

import (
	"testing"

	"github.com/goverbs/goverbs/verbs/driver"
)

// TestSendQueueRetiresAcrossMarkRing: the send queue's occupancy, kept
// from the marks of signaled WRs in a ring of MaxSendWR, retires each
// successful completion's WR and the unsignaled ones before it, and each
// failed one's own WR, for many times round the ring, with up to
// MaxSendWR marks outstanding.
func TestSendQueueRetiresAcrossMarkRing(t *testing.T) {
	const depth = 3
	q := &qp{cap: driver.QPCap{MaxSendWR: depth}, sqMarks: make([]uint64, depth)}
	signaled := []driver.SendWR{{Opcode: driver.OpSend, Flags: driver.SendSignaled}}
	unsignaled := []driver.SendWR{{Opcode: driver.OpSend}}
	for round := range 4 * depth {
		// An unsignaled WR and a signaled one: the signaled one's
		// completion retires both.
		q.sentWRs(unsignaled)
		q.sentWRs(signaled)
		if room := q.sendRoom(); room != depth-2 {
			t.Fatalf("round %d: room for %d WRs with 2 outstanding, want %d", round, room, depth-2)
		}
		q.sendDone(true)
		if room := q.sendRoom(); room != depth {
			t.Fatalf("round %d: room for %d WRs once the signaled WR completed, want %d", round, room, depth)
		}
		// The ring full of marks, completed in order.
		for range depth {
			q.sentWRs(signaled)
		}
		if q.sendRoom() != 0 || q.sqLen != depth {
			t.Fatalf("round %d: room %d and %d marks with %d signaled WRs outstanding", round, q.sendRoom(), q.sqLen, depth)
		}
		for k := range depth {
			q.sendDone(true)
			if room := q.sendRoom(); room != k+1 {
				t.Fatalf("round %d: room %d after %d of %d completions", round, room, k+1, depth)
			}
		}
		// A flushed unsignaled WR retires itself; the signaled one
		// after it then retires with its mark.
		q.sentWRs(unsignaled)
		q.sentWRs(signaled)
		q.sendDone(false)
		if room, marks := q.sendRoom(), q.sqLen; room != depth-1 || marks != 1 {
			t.Fatalf("round %d: room %d and %d marks after the unsignaled WR's flush, want %d and 1", round, room, marks, depth-1)
		}
		q.sendDone(false)
		if room, marks := q.sendRoom(), q.sqLen; room != depth || marks != 0 {
			t.Fatalf("round %d: room %d and %d marks after both flushed, want %d and 0", round, room, marks, depth)
		}
	}
	if q.sqPosted.Load() != q.sqRetired.Load() {
		t.Fatalf("%d WRs posted, %d retired", q.sqPosted.Load(), q.sqRetired.Load())
	}
}

// TestStaleFlushesAfterResetRetireNothing: the flushes of WRs posted
// before a Reset, which rxe and siw leave in the CQ, find the queues
// counted empty and retire nothing: the room never exceeds the queue.
func TestStaleFlushesAfterResetRetireNothing(t *testing.T) {
	const depth = 4
	q := &qp{cap: driver.QPCap{MaxSendWR: depth}, sqMarks: make([]uint64, depth)}
	sig := []driver.SendWR{{Opcode: driver.OpSend, Flags: driver.SendSignaled}}
	q.sentWRs(sig)
	q.sentWRs(sig)
	q.resetQueues()
	q.sendDone(false)
	q.sendDone(false)
	if room := q.sendRoom(); room != depth {
		t.Fatalf("room for %d send WRs on an empty queue of %d", room, depth)
	}
	q.sentWRs(sig)
	q.sendDone(false)
	if room := q.sendRoom(); room != depth {
		t.Fatalf("room for %d send WRs once the one posted since the reset is retired, on a queue of %d", room, depth)
	}
}
