package shm

import (
	"testing"

	"github.com/goverbs/goverbs/verbs/driver"
)

// TestCompletionRingProducersTrustOnlyTheirHead: a producer of a
// receive completion ring knows that a slot is free from the consumer's
// head, never from the slot. The peer's view reads the shared head,
// which the ring's owner writes: a full ring, or a head ahead of the tail
// or a ring or more behind it, makes its produce fail (the owner's CQ
// overrun) instead of writing over a completion or spinning. The owner's
// own view (its flushes) reads the head its Poll keeps privately,
// whatever the shared one says.
func TestCompletionRingProducersTrustOnlyTheirHead(t *testing.T) {
	const n = 4
	mem := make([]byte, ringSize(n, cqSlotSize))
	own := initCQRing(mem, n)
	peer := viewCQRing(mem, n)
	wc := &driver.WorkCompletion{Opcode: driver.WCRecv, ByteLen: 8}
	produce := func(r *cqRing, want bool, what string) {
		t.Helper()
		if got := r.produce(wc, nil); got != want {
			t.Fatalf("%s: produce reported %v, want %v", what, got, want)
		}
	}
	take := func() {
		t.Helper()
		if !own.ready() {
			t.Fatal("no completion to take")
		}
		var got driver.WorkCompletion
		own.take(&got)
	}
	for range n {
		produce(peer, true, "a ring with room")
	}
	produce(peer, false, "a full ring")
	take()
	produce(peer, true, "a slot the consumer took")
	produce(peer, false, "a full ring again")

	tail := own.h.tail.Load()
	for _, h := range []uint64{tail + 1, tail + 1<<40, tail - n - 1, 0} {
		own.h.head.Store(h) // what a hostile owner may write
		produce(peer, false, "a shared head that makes no sense")
	}

	take()
	own.h.head.Store(tail + 1<<40)
	produce(own, true, "the owner's flush, with room its Poll made")
	produce(own, false, "the owner's flush into a full ring")
	if got := own.h.tail.Load(); got != tail+1 {
		t.Fatalf("tail %d after one produce, want %d", got, tail+1)
	}
}
