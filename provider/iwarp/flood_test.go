package iwarp_test

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/goverbs/goverbs/provider/iwarp"
	"github.com/goverbs/goverbs/verbs"
)

// flood has h send zero-length RDMA Writes (which name no STag) as fast
// as it can, until stop closes; the returned channel closes when it has
// stopped.
func flood(h *hostile, stop chan struct{}) chan struct{} {
	done := make(chan struct{})
	burst := bytes.Repeat(h.write(0, 0, nil), 1<<16)
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			h.nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			if _, err := h.nc.Write(burst); err != nil {
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					continue
				}
				return
			}
		}
	}()
	return done
}

// untilFrames waits until q's connection has received more than n FPDUs.
func untilFrames(t *testing.T, v *victim, n uint64) {
	t.Helper()
	q := v.e.QPs[0].Driver()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for iwarp.FramesReceived(q) <= n {
		if time.Now().After(deadline) {
			t.Fatalf("the flood never reached the victim (%d FPDUs)", iwarp.FramesReceived(q))
		}
		<-tick.C
	}
}

// TestCloseWhilePeerFloods: a peer that keeps the socket full must not
// keep a disconnect waiting: the receive goroutine's rounds are bounded
// (rxBudget), so Close gets the receive lock it takes to stop receiving.
func TestCloseWhilePeerFloods(t *testing.T) {
	v := newVictim(t, 4)
	h := dialHostile(t, v, false, false, false)
	go io.Copy(io.Discard, h.nc)
	stop := make(chan struct{})
	fdone := flood(h, stop)
	defer func() {
		close(stop)
		h.nc.Close()
		<-fdone
	}()
	untilFrames(t, v, 100000)
	closed := make(chan struct{})
	go func() { v.conn.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return within 10 s while the peer streamed zero-length Writes")
	}
}

// TestDeregWhilePeerFloods: the same for a Dereg that must cut a Read
// Response still owed from the region (revokeRead takes the receive
// lock too).
func TestDeregWhilePeerFloods(t *testing.T) {
	v := newVictim(t, 4)
	g := guard(t, v, 32<<20, verbs.AccessLocalWrite|verbs.RemoteAccess)
	h := dialHostile(t, v, false, false, false)
	h.send(h.readRequest(uint32(g.r.Len), g.r.RKey, g.r.Addr)) // an answer the peer does not read yet
	stop := make(chan struct{})
	fdone := flood(h, stop)
	untilFrames(t, v, 100000)
	done := make(chan error, 1)
	go func() { done <- v.e.DeregRegion(g.r.ID) }()
	var err error
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Error("Dereg did not return within 10 s while the peer streamed zero-length Writes")
		close(stop)
		go io.Copy(io.Discard, h.nc)
		h.nc.Close()
		err = <-done
	}
	if err != nil {
		t.Errorf("Dereg: %v", err)
	}
	select {
	case <-stop:
	default:
		close(stop)
		h.nc.Close()
	}
	<-fdone
}
