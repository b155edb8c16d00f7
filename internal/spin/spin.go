// Package spin is a mutual-exclusion lock for the short critical sections
// of the data path (posting a work request, polling a completion queue),
// the counterpart of the pthread spinlocks that rdma-core's providers take
// there.
//
// An uncontended Lock and Unlock cost one locked instruction (an
// exchange, which needs no comparison), where sync.Mutex costs two:
// Unlock is a release store, since no waiter sleeps on the lock that it
// would have to wake. A waiter spins briefly, then
// yields its processor, then sleeps in short naps, so a holder that is
// descheduled or blocked does not leave it burning a core. Use it only
// where the lock is held for a bounded, short time; sync.Mutex is the
// right lock everywhere else.
package spin

import (
	"runtime"
	"sync/atomic"
	"time"

	"github.com/goverbs/goverbs/internal/atomicrel"
)

// Lock is a spin lock. The zero value is unlocked. A Lock must not be
// copied after first use.
type Lock struct {
	state atomic.Uint32 // 1 while held
}

// Waiting for a held lock: spins loads, then yields, then naps, each nap
// twice as long as the one before, from minNap up to maxNap.
const (
	spins  = 64
	yields = 64
	minNap = 10 * time.Microsecond
	maxNap = time.Millisecond
)

// Lock locks l, waiting until it is free.
func (l *Lock) Lock() {
	if l.state.Swap(1) != 0 {
		l.lockSlow()
	}
}

func (l *Lock) lockSlow() {
	nap := minNap
	for i := 0; ; i++ {
		if l.state.Load() == 0 && l.state.Swap(1) == 0 {
			return
		}
		switch {
		case i < spins:
		case i < spins+yields:
			runtime.Gosched()
		default:
			time.Sleep(nap)
			nap = min(2*nap, maxNap)
		}
	}
}

// TryLock locks l if it is free and reports whether it did.
func (l *Lock) TryLock() bool {
	// A held lock is seen with a load: a failed try does not take the
	// lock's cache line from its holder.
	return l.state.Load() == 0 && l.state.Swap(1) == 0
}

// TrySwap is TryLock without its load: it swaps the lock held at once
// and reports whether it was free. It suits a lock that is expected to be
// free and whose caller, if the swap finds it held, waits for it (Lock),
// as Lock's own first swap does.
func (l *Lock) TrySwap() bool { return l.state.Swap(1) == 0 }

// Unlock unlocks l. Unlocking a lock that is not held is a run-time
// error, as with sync.Mutex.
func (l *Lock) Unlock() {
	if l.state.Load() != 1 {
		panic("spin: unlock of unlocked lock")
	}
	atomicrel.StoreUint32(&l.state, 0)
}
