package spin

import (
	"sync"
	"testing"
	"time"
)

// TestExclusion: goroutines that increment a plain counter under the lock
// lose no increment (and the race detector sees the lock order them).
func TestExclusion(t *testing.T) {
	const goroutines, rounds = 4, 20000
	var l Lock
	n := 0
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range rounds {
				l.Lock()
				n++
				l.Unlock()
			}
		})
	}
	wg.Wait()
	if n != goroutines*rounds {
		t.Fatalf("counter %d, want %d", n, goroutines*rounds)
	}
}

// TestWaitsForLongHolder: a waiter gets the lock once a holder that keeps
// it for milliseconds — past the waiter's spinning and yielding, into its
// naps — lets go, and not before.
func TestWaitsForLongHolder(t *testing.T) {
	var l Lock
	l.Lock()
	got := make(chan struct{})
	go func() {
		l.Lock()
		l.Unlock()
		// Closed once the lock is free again, so that TryLock below
		// finds it free.
		close(got)
	}()
	time.Sleep(5 * time.Millisecond)
	select {
	case <-got:
		t.Fatal("the waiter took a held lock")
	default:
	}
	if l.TryLock() {
		t.Fatal("TryLock took a held lock")
	}
	l.Unlock()
	<-got
	if !l.TryLock() {
		t.Fatal("TryLock failed on a free lock")
	}
	l.Unlock()
}

func TestUnlockOfUnlocked(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Unlock of an unlocked lock did not panic")
		}
	}()
	var l Lock
	l.Unlock()
}

func BenchmarkLockUnlock(b *testing.B) {
	var l Lock
	for b.Loop() {
		l.Lock()
		l.Unlock()
	}
}

// TestTrySwap: TrySwap takes a free lock, and on a held one fails and
// leaves it held by its holder, whose Unlock then frees it.
func TestTrySwap(t *testing.T) {
	var l Lock
	if !l.TrySwap() {
		t.Fatal("TrySwap failed on a free lock")
	}
	if l.TrySwap() || l.TryLock() {
		t.Fatal("a held lock was taken again")
	}
	l.Unlock()
	if !l.TryLock() {
		t.Fatal("the lock is not free after its holder's Unlock")
	}
	l.Unlock()
}
