// Package atomicrel has release stores for the lock-free queues of the
// data path. sync/atomic's stores are sequentially consistent, which on
// amd64 costs a locked instruction (XCHG); a queue that publishes an index
// or frees a slot needs only release order — what the goroutine wrote
// before the store is seen by whoever loads the new value with
// sync/atomic — and on amd64 every plain store has it (x86-TSO orders a
// store after all earlier loads and stores).
//
// A release store is not a fence: a later load of the same goroutine may
// be performed before the store is visible. Where a handshake needs that
// order (a producer that checks whether a consumer armed a wake-up after
// publishing), use sync/atomic's Store, or have the other side, the one
// that arms the wake-up and then checks for work, call Fence between the
// two. Load what StoreUint64 and StoreUint32 store with the atomic type's
// Load.
package atomicrel

import "sync/atomic"

// fullFence orders the caller's earlier stores before its later loads: a
// sequentially consistent read-modify-write of a word of its own, a locked
// instruction.
func fullFence() {
	var w uint32
	atomic.SwapUint32(&w, 1)
}
