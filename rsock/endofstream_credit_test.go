package rsock

import (
	"testing"
	"time"
)

// TestEndOfStreamTakesTheLastCredit checks that CloseWrite sends the end
// of the stream on the last credit, which no data message takes, rather
// than wait for the reader to return credits, and that this stalls
// nothing (see CloseWrite): the reader gets the bytes and then io.EOF,
// and a stream of several rings in the other direction, for which both
// sides must return ring bytes and receives to each other, reaches the
// side that ended its stream whole, and then its end.
func TestEndOfStreamTakesTheLastCredit(t *testing.T) {
	forCopiedPairs(t, func(t *testing.T, d, a *Conn) {
		// Down to the one credit that data messages leave.
		want := spendCredits(t, d, 1)
		// With the deadline passed, CloseWrite fails rather than
		// wait for a credit.
		d.SetWriteDeadline(time.Now())
		if err := d.CloseWrite(); err != nil {
			t.Fatalf("CloseWrite with one credit left: %v; want the end of the stream sent on it", err)
		}
		if n := credits(d); n != 0 {
			t.Fatalf("CloseWrite with one credit left leaves %d", n)
		}
		a.SetReadDeadline(time.Now().Add(time.Minute))
		d.SetReadDeadline(time.Now().Add(time.Minute))
		a.SetWriteDeadline(time.Now().Add(time.Minute))
		ended := make(chan error, 1)
		ended <- nil
		expectStream(t, a, ended, want)
		back := make([]byte, 4*MinRingSize+100)
		for i := range back {
			back[i] = byte(i*13 + i>>10)
		}
		errc := make(chan error, 1)
		go func() {
			_, err := a.Write(back)
			if err == nil {
				err = a.CloseWrite()
			}
			errc <- err
		}()
		expectStream(t, d, errc, back)
	})
}
