package rsock

import (
	"bytes"
	"errors"
	"os"
	"testing"
	"time"
)

// TestZeroCopyWriteThatTimesOutReturnsAReadBuffer checks a zero-copy
// Write whose deadline passes after it posted part of its buffer, while
// the peer does not read: it returns the bytes it sent with the deadline
// error only once the device has read them (a completion says so), or
// else after it ended the connection, so that the caller may reuse the
// buffer at once. The connection, still up, then delivers the stream
// whole, the caller's later changes to the buffer included.
func TestZeroCopyWriteThatTimesOutReturnsAReadBuffer(t *testing.T) {
	for _, scheme := range providers {
		for _, mode := range []struct {
			name string
			cfg  Config
		}{
			{"default", Config{RingSize: MinRingSize, ZeroCopyMin: MinRingSize}},
			{"send", Config{RingSize: MinRingSize, ZeroCopyMin: MinRingSize, noImm: true}},
		} {
			t.Run(scheme+"/"+mode.name, func(t *testing.T) {
				d, a := pair(t, scheme, &mode.cfg)
				defer d.Close()
				defer a.Close()
				b := bytes.Repeat([]byte{'a'}, 4*MinRingSize)
				// A deadline that passes before the Write posted anything
				// (a loaded machine) is tried again, longer.
				var n int
				var err error
				for wait := 50 * time.Millisecond; n == 0 && wait < time.Minute; wait *= 2 {
					d.SetWriteDeadline(time.Now().Add(wait))
					n, err = d.Write(b)
				}
				if !errors.Is(err, os.ErrDeadlineExceeded) || n == 0 || n == len(b) {
					t.Fatalf("Write to a peer that does not read: %d, %v; want part of %d bytes and a deadline error", n, err, len(b))
				}
				d.mu.Lock()
				retired, posted, failed := d.retired, d.posted, d.err != nil
				d.mu.Unlock()
				if failed {
					// Allowed, though the completion had the time to come.
					t.Logf("the Write ended the connection")
					return
				}
				if retired < posted {
					t.Fatalf("the Write returned its buffer with %d send queue slots that read it not retired", posted-retired)
				}
				// The caller reuses the buffer: the peer gets the new bytes
				// after the ones sent.
				for i := range b {
					b[i] = 'b'
				}
				d.SetWriteDeadline(time.Time{})
				a.SetReadDeadline(time.Now().Add(time.Minute))
				errc := make(chan error, 1)
				go func() {
					_, err := d.Write(b)
					if err == nil {
						err = d.CloseWrite()
					}
					errc <- err
				}()
				expectStream(t, a, errc, append(bytes.Repeat([]byte{'a'}, n), b...))
			})
		}
	}
}
