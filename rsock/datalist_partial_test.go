package rsock

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/goverbs/goverbs/verbs"
)

// TestPartlyTakenPostAbortsTheConnection checks what follows when the
// device takes only part of a Write's list of work requests (its send
// queue is smaller than the connection plans for): the Write fails with
// ErrAborted, wrapping the device's refusal (verbs.ErrQueueFull) — a
// failure of this side, not ErrReset, which blames the peer — instead of
// waiting for credits or completions that will not come, and returns the
// bytes of the data messages the device took, not those of the whole
// list; the reader, whose peer dropped the connection, gets a prefix of
// them and then ErrReset, and Close returns at once on both sides,
// copied and zero-copy, with immediate data and with Sends.
func TestPartlyTakenPostAbortsTheConnection(t *testing.T) {
	for _, scheme := range providers {
		for _, mode := range []struct {
			name string
			cfg  Config
		}{
			{"copy", Config{RingSize: MinRingSize, ZeroCopyMin: -1, qpSendWR: 3}},
			{"zerocopy", Config{RingSize: MinRingSize, ZeroCopyMin: MinRingSize, qpSendWR: 3}},
			{"copy-send", Config{RingSize: MinRingSize, ZeroCopyMin: -1, noImm: true, qpSendWR: 3}},
			{"zerocopy-send", Config{RingSize: MinRingSize, ZeroCopyMin: MinRingSize, noImm: true, qpSendWR: 3}},
		} {
			t.Run(scheme+"/"+mode.name, func(t *testing.T) {
				d, a := pair(t, scheme, &mode.cfg)
				defer a.Close()
				// A stream that stalls fails at the deadline.
				dl := time.Now().Add(time.Minute)
				d.SetDeadline(dl)
				a.SetDeadline(dl)
				want := make([]byte, 4*MinRingSize)
				for i := range want {
					want[i] = byte(i*7 + i>>12)
				}
				// The first post is a list of 4 data messages of a quarter
				// of the ring each, of 1 or 2 work requests; the device
				// takes as many work requests as its queue holds.
				attr, err := d.qp.Query()
				if err != nil {
					t.Fatal(err)
				}
				wrs := 1
				if !d.useImm {
					wrs = 2
				}
				took := int(attr.Cap.MaxSendWR)
				if took >= 4*wrs {
					t.Skipf("the device's send queue holds %d work requests, the whole list", took)
				}
				sent := took / wrs * int(maxChunk(MinRingSize))
				n, werr := d.Write(want)
				var op *net.OpError
				if !errors.As(werr, &op) || !errors.Is(werr, ErrAborted) || !errors.Is(werr, verbs.ErrQueueFull) || errors.Is(werr, ErrReset) || n != sent {
					t.Errorf("Write of a list the device takes in part: %d, %v; want the %d bytes it took and a *net.OpError with ErrAborted wrapping verbs.ErrQueueFull, not ErrReset", n, werr, sent)
				}
				if _, err := d.Write([]byte("x")); !errors.Is(err, ErrAborted) || !errors.Is(err, verbs.ErrQueueFull) {
					t.Errorf("Write after it: %v, want ErrAborted wrapping verbs.ErrQueueFull", err)
				}
				got, rerr := io.ReadAll(a)
				if !errors.Is(rerr, ErrReset) {
					t.Errorf("Read: %v, want ErrReset", rerr)
				}
				if len(got) > sent || !bytes.Equal(got, want[:len(got)]) {
					t.Errorf("read %d bytes, not the first of the %d the device took", len(got), sent)
				}
				start := time.Now()
				if err := d.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
				if took := time.Since(start); took >= closeLinger {
					t.Errorf("Close of the reset connection took %v", took)
				}
			})
		}
	}
}
