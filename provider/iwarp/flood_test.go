package iwarp_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
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

// TestFloodDoesNotStarveSharedCQ: of a CQ shared by many QPs, whose
// pollers read the connections that have something to read (the CQ's
// ready set), one connection that a peer floods without pause does not
// keep the others from being read: Writes on each of the others
// complete while the flood goes on.
func TestFloodDoesNotStarveSharedCQ(t *testing.T) {
	const others, writes = iwarp.ManyQPs, 200
	v := newVictimN(t, 4, 1+others)
	h := dialHostile(t, v, false, false, false)
	go io.Copy(io.Discard, h.nc)
	stop := make(chan struct{})
	fdone := flood(h, stop)
	defer func() {
		close(stop)
		h.nc.Close()
		<-fdone
	}()
	// The peer of the others, one QP each on a CQ of its own.
	qpCap := verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}
	peer := openEnd(t, 64, false, qpCap, 4096)
	for i := range others {
		qp := peer.qp
		if i > 0 {
			var err error
			if qp, err = peer.pd.CreateQP(verbs.QPInitAttr{SendCQ: peer.cq, RecvCQ: peer.cq, Cap: qpCap}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { qp.Destroy() })
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := cm.Dial(ctx, v.l.Addr(), qp, nil)
		cancel()
		if err != nil {
			t.Fatalf("dial the victim: %v", err)
		}
		t.Cleanup(func() { c.Close() })
		if err := <-v.accepted; err != nil {
			t.Fatalf("victim accept: %v", err)
		}
	}
	src, err := v.e.PD.AllocMR(64, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Dereg()
	untilFrames(t, v, 10000)
	flooded := iwarp.FramesReceived(v.e.QPs[0].Driver())

	done := make([]int, 1+others)
	wc := make([]verbs.WorkCompletion, 16)
	deadline := time.Now().Add(60 * time.Second)
	for i := 1; i <= others; i++ {
		if _, err := v.e.QPs[i].PostSend([]verbs.SendWR{{WRID: uint64(i), Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
			SGList: []verbs.SGE{src.SGE(0, 8)}, RemoteAddr: peer.mr.Addr() + uint64(8*i), RKey: peer.mr.RKey()}}); err != nil {
			t.Fatal(err)
		}
	}
	for left := others; left > 0; {
		if time.Now().After(deadline) {
			t.Fatalf("Writes completed per QP while one connection was flooded: %v of %d", done[1:], writes)
		}
		n := v.e.SendCQ.Poll(wc)
		for _, w := range wc[:n] {
			if w.Status != verbs.WCSuccess {
				t.Fatalf("a Write completed with %v", w.Status)
			}
			i := int(w.WRID)
			if done[i]++; done[i] == writes {
				left--
				continue
			}
			if _, err := v.e.QPs[i].PostSend([]verbs.SendWR{{WRID: uint64(i), Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
				SGList: []verbs.SGE{src.SGE(0, 8)}, RemoteAddr: peer.mr.Addr() + uint64(8*i), RKey: peer.mr.RKey()}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if iwarp.FramesReceived(v.e.QPs[0].Driver()) == flooded {
		t.Fatal("the flood stopped before the Writes were done")
	}
	if iwarp.ReadyConns(v.e.QPs[0].Driver()) != 1+others {
		t.Fatalf("%d of %d connections in the victim's ready set", iwarp.ReadyConns(v.e.QPs[0].Driver()), 1+others)
	}
}
