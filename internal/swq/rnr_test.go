package swq

import (
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs/verbs/driver"
)

// TestRNR: retries are counted against the QP's RNRRetry, a wait's end
// runs Init's function, and a firing for a cancelled or older wait does
// not retry.
func TestRNR(t *testing.T) {
	var mu sync.Mutex
	var r RNR
	fired := make(chan bool, 4)
	r.Init(func() {
		mu.Lock()
		defer mu.Unlock()
		fired <- r.Expired()
	})
	mu.Lock()
	if st := r.Wait(2, time.Microsecond); st != RNRWait || !r.Waiting() {
		t.Fatalf("first wait: %v, waiting %v; want RNRWait, waiting", st, r.Waiting())
	}
	mu.Unlock()
	if !<-fired {
		t.Fatal("the first wait's end did not report the retry due")
	}
	mu.Lock()
	if r.Waiting() {
		t.Fatal("still waiting after the retry was due")
	}
	if st := r.Wait(2, time.Microsecond); st != RNRWait {
		t.Fatalf("second wait: %v, want RNRWait", st)
	}
	mu.Unlock()
	<-fired
	mu.Lock()
	if st := r.Wait(2, time.Hour); st != driver.WCRNRRetryExcErr {
		t.Fatalf("third wait with RNRRetry 2: %v, want WCRNRRetryExcErr", st)
	}
	// Answered starts the count again.
	r.Answered()
	if st := r.Wait(2, time.Hour); st != RNRWait {
		t.Fatalf("wait after an answer: %v, want RNRWait", st)
	}
	// A firing for this wait before it is due (as one left from an
	// earlier wait is) re-arms instead of retrying.
	if r.Expired() || !r.Waiting() {
		t.Fatal("Expired reported an hour's wait over at once")
	}
	r.Stop()
	if r.Waiting() || r.Expired() {
		t.Fatal("a stopped wait is still pending")
	}
	// Infinite retries never run out.
	r.Reset()
	for i := range 20 {
		if st := r.Wait(driver.RNRRetryInfinite, time.Hour); st != RNRWait {
			t.Fatalf("wait %d with infinite retries: %v", i, st)
		}
	}
	r.Stop()
	mu.Unlock()
}
