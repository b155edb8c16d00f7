package driver

import (
	"errors"
	"testing"
)

// TestPostStateErrs checks the states in which every provider takes send
// and receive work requests: sends from RTS on (the error state flushes
// them), receives from Init on.
func TestPostStateErrs(t *testing.T) {
	for s := QPSReset; s < numQPStates; s++ {
		sendOK := s != QPSReset && s != QPSInit && s != QPSRTR
		if err := PostSendStateErr(s); sendOK != (err == nil) || (err != nil && !errors.Is(err, ErrInvalidState)) {
			t.Errorf("PostSendStateErr(%v) = %v; want nil: %v", s, err, sendOK)
		}
		recvOK := s != QPSReset
		if err := PostRecvStateErr(s); recvOK != (err == nil) || (err != nil && !errors.Is(err, ErrInvalidState)) {
			t.Errorf("PostRecvStateErr(%v) = %v; want nil: %v", s, err, recvOK)
		}
	}
	if !errors.Is(ErrRecvOnSRQ, ErrInvalidArg) {
		t.Errorf("ErrRecvOnSRQ is not ErrInvalidArg")
	}
}
