package shm

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs/verbs/driver"
)

// TestDialCancelEndsHandshake: a Dial to a listener that never answers
// returns once its context is cancelled, wherever in the handshake the
// cancellation falls (readHello's deadline could undo one that came just
// before it, and Dial hung until the listener answered).
func TestDialCancelEndsHandshake(t *testing.T) {
	addr := fmt.Sprintf("@goverbs-dial-cancel-%d", os.Getpid())
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: addr, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var mu sync.Mutex
	var held []net.Conn // accepted and never answered
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	}()
	q := victimQP(t)
	for i := range 200 {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := (&provider{}).Dial(ctx, addr, q, driver.ConnParam{})
			done <- err
		}()
		for range i % 50 { // the cancellation falls at a different point each round
			runtime.Gosched()
		}
		cancel()
		select {
		case err := <-done:
			if err == nil {
				t.Fatalf("round %d: Dial to a listener that never answered succeeded", i)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: Dial still blocked 5 s after its context was cancelled", i)
		}
	}
}
