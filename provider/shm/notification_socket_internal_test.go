package shm

import (
	"testing"
	"time"
)

// TestNotificationSocketWakes: a CQ's notification socket wakes its
// waiter for the owner's own notification (a byte to its own address)
// and for a peer's (a byte through a notifier made for it), and a wait
// with nothing sent ends at its bound.
func TestNotificationSocketWakes(t *testing.T) {
	e, err := newCQEvent()
	if err != nil {
		t.Fatal(err)
	}
	defer e.close()
	n, err := e.peerSocket()
	if err != nil {
		t.Fatal(err)
	}
	defer closeFDs([]int{n})
	const long = time.Minute
	for _, c := range []struct {
		who  string
		send func()
	}{{"the owner", e.self().send}, {"a peer", notifier{fd: n}.send}} {
		c.send()
		if !e.wait(long) {
			t.Fatalf("a notification from %s did not wake the waiter", c.who)
		}
	}
	start := time.Now()
	if e.wait(10 * time.Millisecond) {
		t.Fatal("a wait with nothing sent reported a byte")
	}
	if d := time.Since(start); d < 10*time.Millisecond {
		t.Fatalf("a wait with nothing sent (the socket drained) returned after %v", d)
	}
}
