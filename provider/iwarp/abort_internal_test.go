package iwarp

import (
	"errors"
	"net"
	"testing"
)

// TestSysReadAbortedFirst: a read into the application's memory on an
// aborted connection reports net.ErrClosed, as place does, even when its
// destination was revoked meanwhile: a revoked destination is a protocol
// error, which the receive goroutine would report (protocolError: an
// access error event, and toErr before finish can give a WR that timed
// out WCRetryExcErr).
func TestSysReadAbortedFirst(t *testing.T) {
	c := &conn{}
	m := &mr{}
	m.ext.Revoke()
	c.rx.dstMR[0], c.rx.ndstMR = m, 1
	c.aborted.Store(true)
	if err := c.place([]byte{1}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("place: %v", err)
	}
	if _, _, err := c.sysRead(nil); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("sysRead on an aborted connection: %v, want net.ErrClosed (as place)", err)
	}
}
