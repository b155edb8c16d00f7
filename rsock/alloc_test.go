package rsock

import (
	"io"
	"testing"
)

// TestReadWriteAllocateNothing checks that Read and Write allocate
// nothing once a connection is running, on every provider, in both
// notification modes (the device's default, and Sends), with large
// writes copied and sent without a copy: request/response rounds of small
// messages, and writes several times the ring's size that a reader
// drains, so that ring wraps, credit messages and blocked calls are all
// counted. The count is the process's (the providers' goroutines
// included).
func TestReadWriteAllocateNothing(t *testing.T) {
	for _, scheme := range providers {
		for _, mode := range []struct {
			name string
			cfg  Config
		}{
			{"default", Config{RingSize: MinRingSize}},
			{"send", Config{RingSize: MinRingSize, noImm: true}},
			{"zerocopy", Config{RingSize: MinRingSize, ZeroCopyMin: MinRingSize}},
			{"zerocopy-send", Config{RingSize: MinRingSize, ZeroCopyMin: MinRingSize, noImm: true}},
		} {
			t.Run(scheme+"/"+mode.name, func(t *testing.T) {
				d, a := pair(t, scheme, &mode.cfg)
				defer d.Close()
				defer a.Close()
				small := make([]byte, 64)
				roundTrip := func() {
					if _, err := d.Write(small); err != nil {
						t.Fatal(err)
					}
					if _, err := io.ReadFull(a, small); err != nil {
						t.Fatal(err)
					}
					if _, err := a.Write(small); err != nil {
						t.Fatal(err)
					}
					if _, err := io.ReadFull(d, small); err != nil {
						t.Fatal(err)
					}
				}
				for range 100 {
					roundTrip()
				}
				if n := testing.AllocsPerRun(200, roundTrip); n != 0 {
					t.Errorf("a 64-byte round trip allocates %v times", n)
				}

				// A writer of 4 rings at a time and a reader that drains
				// them, in step: the reader's goroutine is started once.
				big := make([]byte, 4*MinRingSize)
				start, done := make(chan struct{}), make(chan error, 1)
				go func() {
					buf := make([]byte, 1500)
					for range start {
						var err error
						for got := 0; got < len(big) && err == nil; {
							var n int
							n, err = a.Read(buf[:min(len(buf), len(big)-got)])
							got += n
						}
						done <- err
					}
				}()
				defer close(start)
				stream := func() {
					start <- struct{}{}
					if _, err := d.Write(big); err != nil {
						t.Fatal(err)
					}
					if err := <-done; err != nil {
						t.Fatal(err)
					}
				}
				for range 10 {
					stream()
				}
				if n := testing.AllocsPerRun(50, stream); n != 0 {
					t.Errorf("a write of %d bytes, read in pieces, allocates %v times", len(big), n)
				}
			})
		}
	}
}
