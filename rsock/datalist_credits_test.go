package rsock

import (
	"bytes"
	"errors"
	"os"
	"testing"
	"time"
)

// TestCopiedPostLeavesACreditForCredits checks a copied Write whose
// planned post loses a credit while it copies into the staging buffer (a
// Read spends it on a credit message): the post sends only the data
// messages that still leave a credit for a credit message, as the plan
// did, and the rest waits for credits; the stream stays whole.
func TestCopiedPostLeavesACreditForCredits(t *testing.T) {
	forCopiedPairs(t, func(t *testing.T, d, a *Conn) {
		want := spendCredits(t, d, 3)
		var spent bool
		afterStage = func(c *Conn) {
			if c != d || spent {
				return
			}
			spent = true
			c.mu.Lock()
			c.postCtrl(opCredit, 0)
			c.mu.Unlock()
		}
		defer func() { afterStage = nil }()
		// Two data messages planned with 3 credits; one is left
		// once the credit message took one.
		big := bytes.Repeat([]byte{'x'}, int(maxChunk(uint64(MinRingSize)))+100)
		// A deadline that passes before the Write planned anything
		// (a loaded machine) is tried again, longer.
		var n int
		var err error
		for wait := 50 * time.Millisecond; !spent && wait < time.Minute; wait *= 2 {
			d.SetWriteDeadline(time.Now().Add(wait))
			n, err = d.Write(big)
		}
		afterStage = nil
		if !spent {
			t.Fatal("the Write did not copy into the staging buffer")
		}
		if n := credits(d); n < 1 {
			t.Errorf("the Write left %d credits: a data message took the last, which only a credit message may take", n)
		}
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatal(err)
		}
		want = append(want, big[:n]...)
		// The rest goes once the reader returns credits.
		d.SetWriteDeadline(time.Time{})
		a.SetReadDeadline(time.Now().Add(time.Minute))
		errc := make(chan error, 1)
		go func() {
			_, err := d.Write(big[n:])
			if err == nil {
				err = d.CloseWrite()
			}
			errc <- err
		}()
		want = append(want, big[n:]...)
		expectStream(t, a, errc, want)
	})
}

func credits(c *Conn) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.credits
}

// forCopiedPairs runs f as a subtest on a connected pair (d dialled, a
// accepted) of every provider, with rings of MinRingSize and every Write
// copied, carrying data with immediate data and with Sends.
func forCopiedPairs(t *testing.T, f func(t *testing.T, d, a *Conn)) {
	for _, scheme := range providers {
		for _, mode := range []struct {
			name string
			cfg  Config
		}{
			{"default", Config{RingSize: MinRingSize, ZeroCopyMin: -1}},
			{"send", Config{RingSize: MinRingSize, ZeroCopyMin: -1, noImm: true}},
		} {
			t.Run(scheme+"/"+mode.name, func(t *testing.T) {
				d, a := pair(t, scheme, &mode.cfg)
				defer d.Close()
				defer a.Close()
				f(t, d, a)
			})
		}
	}
}

// spendCredits writes small messages on d until it has left credits
// and returns the bytes written. The peer must not poll: it then
// acknowledges nothing, and each Write spends one of d's credits.
func spendCredits(t *testing.T, d *Conn, left int) []byte {
	var want []byte
	small := []byte("0123456789")
	for credits(d) > left {
		if _, err := d.Write(small); err != nil {
			t.Fatal(err)
		}
		want = append(want, small...)
	}
	return want
}
