package rsock

import (
	"errors"
	"testing"
	"time"

	"github.com/goverbs/goverbs/verbs"
)

// TestLocalCompletionErrorAbortsConnection checks what a completion
// error of this side's own making does: a Write whose staging buffer is
// no longer registered (a local protection error, which the device
// reports in the completion of the RDMA Write) ends the connection with
// ErrAborted, which says this side ended it, not ErrProtocol or
// ErrReset, which blame the peer.
func TestLocalCompletionErrorAbortsConnection(t *testing.T) {
	forCopiedPairs(t, func(t *testing.T, d, a *Conn) {
		if err := d.stageMR.Dereg(); err != nil {
			t.Fatal(err)
		}
		// Larger than a Send carries inline: the bytes go by RDMA Write
		// from the staging buffer. A Write may return before the
		// completion is polled; once the ring's credits are spent, the
		// next waits and polls. (The deadline bounds a wait that finds
		// nothing: it fails the test.)
		d.SetWriteDeadline(time.Now().Add(10 * time.Second))
		var err error
		for range 8 {
			if _, err = d.Write(make([]byte, MinRingSize/2)); err != nil {
				break
			}
		}
		if !errors.Is(err, ErrAborted) || errors.Is(err, ErrProtocol) || errors.Is(err, ErrReset) {
			t.Errorf("Write from a staging buffer no longer registered: %v; want ErrAborted, neither ErrProtocol nor ErrReset", err)
		}
	})
}

// TestTransmitFailureIsReset checks the status with which the kernel's
// devices (siw, rxe) complete a send whose transmission failed because
// the connection or its path is gone, a local QP operation error: the
// connection ends with ErrReset, the peer gone, not ErrAborted.
func TestTransmitFailureIsReset(t *testing.T) {
	d, a := pair(t, "loop", &Config{RingSize: MinRingSize})
	defer d.Close()
	defer a.Close()
	d.mu.Lock()
	d.completeOne(&verbs.WorkCompletion{WRID: 1, Status: verbs.WCLocQPOpErr, Opcode: verbs.WCSend})
	err := d.err
	d.mu.Unlock()
	if !errors.Is(err, ErrReset) || errors.Is(err, ErrAborted) {
		t.Errorf("a send completed with %v: %v; want ErrReset", verbs.WCLocQPOpErr, err)
	}
}
