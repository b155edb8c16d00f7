package rsock

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// TestZeroCopyWrites sends Writes at and above Config.ZeroCopyMin, mixed
// with small ones, across ring wraps, on every provider and in both
// notification modes: a buffer written again whole and in part (the kept
// registration), and a buffer written once. Each buffer is overwritten
// as soon as its Write returns, so a device still reading it would send
// the new bytes, and the reader checks every byte it gets against the
// bytes written.
func TestZeroCopyWrites(t *testing.T) {
	for _, scheme := range providers {
		for _, mode := range []struct {
			name string
			cfg  Config
		}{
			{"default", Config{RingSize: MinRingSize, ZeroCopyMin: 2 * MinRingSize}},
			{"send", Config{RingSize: MinRingSize, ZeroCopyMin: 2 * MinRingSize, noImm: true}},
		} {
			t.Run(scheme+"/"+mode.name, func(t *testing.T) {
				d, a := pair(t, scheme, &mode.cfg)
				defer d.Close()
				defer a.Close()
				reused := make([]byte, 5*MinRingSize+123)
				var want bytes.Buffer
				seq := byte(0)
				fill := func(b []byte) {
					for i := range b {
						b[i] = seq + byte(i*31/7)
					}
					seq++
				}
				writes := []func() []byte{
					func() []byte { return reused },
					func() []byte { return reused[:2*MinRingSize] },        // the least that goes without a copy
					func() []byte { return reused[:2*MinRingSize-1] },      // copied
					func() []byte { return make([]byte, 3*MinRingSize+7) }, // another buffer, registered anew
					func() []byte { return reused[:100] },
					func() []byte { return reused },
				}
				got := make(chan []byte, 1)
				go func() {
					b, err := io.ReadAll(a)
					if err != nil {
						t.Error(err)
					}
					got <- b
				}()
				for round := range 3 {
					for _, w := range writes {
						b := w()
						fill(b)
						want.Write(b)
						if n, err := d.Write(b); n != len(b) || err != nil {
							t.Fatalf("round %d: Write of %d bytes: %d, %v", round, len(b), n, err)
						}
						clear(b)
					}
				}
				if err := d.CloseWrite(); err != nil {
					t.Fatal(err)
				}
				if b := <-got; !bytes.Equal(b, want.Bytes()) {
					t.Errorf("the reader got %d bytes, not the %d written (or not the same)", len(b), want.Len())
				}
			})
		}
	}
}

// TestZeroCopyDefault checks which Writes a zero Config sends without a
// copy: from DefaultZeroCopyMin bytes, and on iWARP (tcp), where such a
// Write waits for the peer's confirmation, from DefaultZeroCopyMinIWARP.
func TestZeroCopyDefault(t *testing.T) {
	for _, scheme := range providers {
		t.Run(scheme, func(t *testing.T) {
			d, a := pair(t, scheme, &Config{})
			defer d.Close()
			defer a.Close()
			least := DefaultZeroCopyMin
			if scheme == "tcp" {
				least = DefaultZeroCopyMinIWARP
			}
			drained := make(chan error, 1)
			go func() {
				_, err := io.Copy(io.Discard, a)
				drained <- err
			}()
			for _, n := range []int{DefaultZeroCopyMin, DefaultZeroCopyMinIWARP} {
				if _, err := d.Write(make([]byte, n)); err != nil {
					t.Fatal(err)
				}
				d.writeMu.Lock()
				zc := d.zcMR != nil && len(d.zcBuf) == n
				d.writeMu.Unlock()
				if zc != (n >= least) {
					t.Errorf("a Write of %d bytes: sent without a copy %v, want %v", n, zc, n >= least)
				}
			}
			d.CloseWrite()
			if err := <-drained; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestZeroCopyWriteAfterClose checks that a zero-copy Write on a closed
// connection fails with net.ErrClosed and leaves nothing registered.
func TestZeroCopyWriteAfterClose(t *testing.T) {
	for _, scheme := range providers {
		t.Run(scheme, func(t *testing.T) {
			cfg := Config{RingSize: MinRingSize, ZeroCopyMin: MinRingSize / 2}
			d, a := pair(t, scheme, &cfg)
			defer a.Close()
			// The ring takes it: no reader is needed.
			if _, err := d.Write(make([]byte, MinRingSize)); err != nil {
				t.Fatal(err)
			}
			if d.zcMR == nil {
				t.Fatal("a Write of twice ZeroCopyMin was copied")
			}
			d.Close()
			if d.zcMR != nil {
				t.Error("Close left the zero-copy buffer registered")
			}
			if _, err := d.Write(make([]byte, MinRingSize)); !errors.Is(err, net.ErrClosed) {
				t.Errorf("Write after Close: %v, want net.ErrClosed", err)
			}
		})
	}
}

// TestZeroCopyUnfinishedEndsConnection checks what a zero-copy Write does
// when its deadline passes, or its connection is closed, before the
// device has read its buffer (a completion that never comes stands for
// a device that is slow to read it): the Write fails with the cause, the
// connection is aborted (this side ended it: ErrAborted, not ErrReset,
// which blames the peer), and the buffer is no longer registered.
func TestZeroCopyUnfinishedEndsConnection(t *testing.T) {
	for _, scheme := range providers {
		t.Run(scheme+"/deadline", func(t *testing.T) {
			cfg := Config{RingSize: MinRingSize, ZeroCopyMin: MinRingSize / 2}
			d, a := pair(t, scheme, &cfg)
			defer d.Close()
			defer a.Close()
			d.writeMu.Lock()
			if d.zeroCopySource(make([]byte, MinRingSize)) == nil {
				t.Fatal("no zero-copy registration")
			}
			d.SetWriteDeadline(time.Now().Add(10 * time.Millisecond))
			err := d.awaitRetired(d.posted + 1)
			gone := d.zcMR == nil
			d.writeMu.Unlock()
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("got %v, want a deadline error", err)
			}
			if !gone {
				t.Error("the buffer is still registered")
			}
			d.SetWriteDeadline(time.Time{})
			if _, err := d.Write([]byte("x")); !errors.Is(err, ErrAborted) || errors.Is(err, ErrReset) {
				t.Errorf("Write after it: %v, want ErrAborted (this side ended the connection), not ErrReset", err)
			}
		})
		t.Run(scheme+"/close", func(t *testing.T) {
			cfg := Config{RingSize: MinRingSize, ZeroCopyMin: MinRingSize / 2}
			d, a := pair(t, scheme, &cfg)
			defer a.Close()
			res := make(chan error, 1)
			d.writeMu.Lock()
			if d.zeroCopySource(make([]byte, MinRingSize)) == nil {
				t.Fatal("no zero-copy registration")
			}
			go func() { res <- d.Close() }()
			err := d.awaitRetired(d.posted + 1)
			d.writeMu.Unlock()
			if !errors.Is(err, net.ErrClosed) {
				t.Errorf("got %v, want net.ErrClosed", err)
			}
			if err := <-res; err != nil {
				t.Errorf("Close: %v", err)
			}
		})
	}
}
