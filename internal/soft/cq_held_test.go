package soft

import (
	"sync"
	"testing"

	"github.com/goverbs/goverbs/verbs/driver"
)

// A waiter woken by an armed CQ's notification looks at Held before it
// takes the lock (iwarp's poll does): the completion that fired the
// notification must already count there.
func TestCQNotificationFollowsHeld(t *testing.T) {
	var mu sync.Mutex
	ev := NewEventQueue()
	var c CQ
	c.Init(4, nil, &mu, &ev)
	if err := c.ReqNotify(false); err != nil {
		t.Fatal(err)
	}
	woken := make(chan uint32)
	go func() {
		<-c.Notify()
		woken <- c.Held()
	}()
	mu.Lock()
	if _, woke := c.PushLocked(&Entry{WC: driver.WorkCompletion{WRID: 7}}); !woke {
		mu.Unlock()
		t.Fatal("the armed CQ was not woken")
	}
	// The waiter may run before the pusher lets go of the lock.
	held := <-woken
	mu.Unlock()
	if held != 1 {
		t.Fatalf("the woken waiter saw Held %d, want 1", held)
	}
	wc := make([]driver.WorkCompletion, 2)
	if n := c.Poll(wc); n != 1 || wc[0].WRID != 7 || c.Held() != 0 {
		t.Fatalf("Poll returned %d (WRID %d), Held %d after", n, wc[0].WRID, c.Held())
	}
}
