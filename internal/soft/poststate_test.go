package soft

import (
	"errors"
	"testing"

	"github.com/goverbs/goverbs/verbs/driver"
)

// TestPostStateErrs checks the states in which every provider takes send
// and receive work requests: sends from RTS on (the error state flushes
// them), receives from Init on.
func TestPostStateErrs(t *testing.T) {
	for s := driver.QPSReset; s < driver.QPSErr+1; s++ {
		sendOK := s != driver.QPSReset && s != driver.QPSInit && s != driver.QPSRTR
		if err := PostSendStateErr(s); sendOK != (err == nil) || (err != nil && !errors.Is(err, driver.ErrInvalidState)) {
			t.Errorf("PostSendStateErr(%v) = %v; want nil: %v", s, err, sendOK)
		}
		recvOK := s != driver.QPSReset
		if err := PostRecvStateErr(s); recvOK != (err == nil) || (err != nil && !errors.Is(err, driver.ErrInvalidState)) {
			t.Errorf("PostRecvStateErr(%v) = %v; want nil: %v", s, err, recvOK)
		}
	}
	if !errors.Is(ErrRecvOnSRQ, driver.ErrInvalidArg) {
		t.Errorf("ErrRecvOnSRQ is not driver.ErrInvalidArg")
	}
}
