package coreprobe

import (
	"runtime"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

func twoProcessors(t *testing.T) unix.CPUSet {
	t.Helper()
	var allowed unix.CPUSet
	if err := unix.SchedGetaffinity(0, &allowed); err != nil {
		t.Fatal(err)
	}
	if allowed.Count() < 2 {
		t.Skip("this process may run on one processor only")
	}
	return allowed
}

func TestRoundTripMeasuresAHandoff(t *testing.T) {
	twoProcessors(t)
	d, err := RoundTrip(10_000)
	if err != nil {
		t.Fatal(err)
	}
	if d <= 0 || d >= giveUp {
		t.Fatalf("a round trip of %v: want more than 0 and less than %v", d, giveUp)
	}
}

func TestRoundTripRefusesNoRounds(t *testing.T) {
	if _, err := RoundTrip(0); err == nil {
		t.Fatal("RoundTrip(0) succeeded: want an error")
	}
}

// The measuring threads are pinned; none of them may be handed to other
// goroutines afterwards, and the caller's thread keeps its processors.
func TestRoundTripLeavesNoThreadPinned(t *testing.T) {
	allowed := twoProcessors(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for range 3 {
		if _, err := RoundTrip(1000); err != nil {
			t.Fatal(err)
		}
	}
	var mine unix.CPUSet
	if err := unix.SchedGetaffinity(0, &mine); err != nil {
		t.Fatal(err)
	}
	if mine != allowed {
		t.Fatalf("the caller's thread may now run on %d processors, %d before", mine.Count(), allowed.Count())
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	narrowed := 0
	for range 64 {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			var set unix.CPUSet
			if err := unix.SchedGetaffinity(0, &set); err != nil || set != allowed {
				mu.Lock()
				narrowed++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if narrowed > 0 {
		t.Fatalf("%d of 64 threads handed to goroutines after RoundTrip were pinned", narrowed)
	}
}
