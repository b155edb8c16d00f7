package shm

import (
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/goverbs/goverbs/verbs"
)

// threads counts this process's threads.
func threads(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

// TestArmedCQsHoldNoThreads: CQs armed with ReqNotify, each with a
// goroutine waiting on its completion channel, park those goroutines
// and their notification goroutines, the latter in Go's network poller
// on the CQ's notification socket: the process does not gain a thread
// per CQ.
// (Notifications themselves: TestSleepersLeaveNotifierAlone and the
// conformance suite's waits.)
func TestArmedCQsHoldNoThreads(t *testing.T) {
	const n = 64
	ctx, err := verbs.Open(DeviceName)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Close()
	before, old := threads(t), notifiers()
	cqs := make([]*verbs.CQ, 0, n)
	done := make(chan struct{})
	defer func() {
		close(done)
		for _, cq := range cqs {
			cq.Destroy()
		}
	}()
	for range n {
		cq, err := ctx.CreateCQ(4)
		if err != nil {
			t.Fatal(err)
		}
		cqs = append(cqs, cq)
		if err := cq.ReqNotify(false); err != nil {
			t.Fatal(err)
		}
		go func() {
			select {
			case <-cq.Notify():
			case <-done:
			}
		}()
	}
	for deadline := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
		atRest := 0
		for id, st := range notifiers() {
			if _, ok := old[id]; ok {
				continue
			}
			switch st {
			case "IO wait":
				atRest++
			case "runnable", "running", "syscall": // (syscall: the read before it parks)
			default:
				t.Fatalf("an armed CQ's notification goroutine is in state %q, want IO wait (parked on the CQ's notification socket)", st)
			}
		}
		if atRest == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d armed CQs' notification goroutines came to rest", atRest, n)
		}
	}
	if grown := threads(t) - before; grown >= n/4 {
		t.Fatalf("%d CQs armed and waited on: the process has %d more threads", n, grown)
	}
}
