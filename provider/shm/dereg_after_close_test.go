package shm_test

import (
	"context"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// newLifeSide is one end of the lifecycle tests: a shm0 QP with its PD
// and CQ.
func newLifeSide(t *testing.T) *verbstest.Side { return verbstest.NewSide(t, "shm0", 16) }

// TestDeregAfterDestroyWaitsForPeer: Y's region, Go memory, is being
// written by X's RDMA Write when Y destroys its QP (or resets it) and
// deregisters the region. Dereg returns only once X's Write is done with
// it: no byte of it lands after. (Destroy and Reset forgot the
// connection at once, so Dereg asked no peer to confirm.)
func TestDeregAfterDestroyWaitsForPeer(t *testing.T) {
	const size = 64 << 20
	for _, how := range []string{"destroy", "reset"} {
		t.Run(how, func(t *testing.T) {
			y, x := newLifeSide(t), newLifeSide(t)
			verbstest.Connect(t, addr(t), y.QP, x.QP)
			buf := make([]byte, size) // process memory: the peer writes it with process_vm_writev
			ymr, err := y.PD.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
			if err != nil {
				t.Fatal(err)
			}
			src, err := x.PD.AllocMR(size, verbs.AccessLocalWrite)
			if err != nil {
				t.Fatal(err)
			}
			for i := range src.Bytes() {
				src.Bytes()[i] = 0xab
			}
			posted := make(chan error, 1)
			go func() {
				_, err := x.QP.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
					SGList: []verbs.SGE{src.SGE(0, size)}, RemoteAddr: ymr.Addr(), RKey: ymr.RKey()}})
				posted <- err
			}()
			for deadline := time.Now().Add(10 * time.Second); volatileByte(&buf[0]) != 0xab; {
				if time.Now().After(deadline) {
					t.Fatal("X's Write did not start")
				}
			}
			switch how {
			case "destroy":
				if err := y.QP.Destroy(); err != nil {
					t.Fatal(err)
				}
			case "reset":
				for _, st := range []verbs.QPState{verbs.QPSErr, verbs.QPSReset} {
					if err := y.QP.Modify(&verbs.QPAttr{State: st}, verbs.QPAttrState); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := ymr.Dereg(); err != nil {
				t.Fatal(err)
			}
			last := volatileByte(&buf[size-1])
			if err := <-posted; err != nil {
				t.Fatal(err)
			}
			wc := make([]verbs.WorkCompletion, 1)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := x.CQ.Wait(ctx, wc); err != nil {
				t.Fatal(err)
			}
			if after := volatileByte(&buf[size-1]); after != last {
				t.Fatalf("X's Write (%v) changed Y's memory after Y's Dereg returned: last byte %#x then, %#x now", wc[0].Status, last, after)
			}
		})
	}
}

// volatileByte reads *p from memory each time it is called.
//
//go:noinline
func volatileByte(p *byte) byte { return *p }

// TestStalePeerAfterResetReconnect: X's large Send is being copied into
// Y's receive when Y moves to the error state, resets, and connects to Z;
// X's next Send, posted with it, must not take the receive Y then posts
// for Z (a peer of an earlier connection takes a QP reset since for
// gone), nor may anything of X's reach Y's new receive.
func TestStalePeerAfterResetReconnect(t *testing.T) {
	const size = 64 << 20
	y, x, z := newLifeSide(t), newLifeSide(t), newLifeSide(t)
	verbstest.Connect(t, addr(t), y.QP, x.QP)
	old, err := y.PD.RegMR(make([]byte, size), verbs.AccessLocalWrite) // process memory: copied with process_vm_writev
	if err != nil {
		t.Fatal(err)
	}
	if _, err := y.QP.PostRecv([]verbs.RecvWR{{WRID: 100, SGList: []verbs.SGE{old.SGE(0, size)}}}); err != nil {
		t.Fatal(err)
	}
	src, err := x.PD.AllocMR(size+8, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	for i := range src.Bytes() {
		src.Bytes()[i] = 0xab
	}
	copy(src.Bytes()[size:], "STALE!!!")
	posted := make(chan error, 1)
	go func() {
		_, err := x.QP.PostSend([]verbs.SendWR{
			{WRID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{src.SGE(0, size)}},
			{WRID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{src.SGE(size, 8)}},
		})
		posted <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); volatileByte(&old.Bytes()[0]) != 0xab; {
		if time.Now().After(deadline) {
			t.Fatal("X's Send did not start")
		}
	}
	for _, st := range []verbs.QPState{verbs.QPSErr, verbs.QPSReset} {
		if err := y.QP.Modify(&verbs.QPAttr{State: st}, verbs.QPAttrState); err != nil {
			t.Fatal(err)
		}
	}
	verbstest.Connect(t, addr(t), z.QP, y.QP)
	fresh, err := y.PD.RegMR(make([]byte, 64), verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := y.QP.PostRecv([]verbs.RecvWR{{WRID: 200, SGList: []verbs.SGE{fresh.SGE(0, 64)}}}); err != nil {
		t.Fatal(err)
	}
	<-posted
	// Once X has completed both Sends, whatever they did to Y is done.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wc := make([]verbs.WorkCompletion, 2)
	for got := 0; got < 2; {
		n, err := x.CQ.Wait(ctx, wc[got:])
		if err != nil {
			t.Fatalf("X's completions: %v", err)
		}
		got += n
	}
	ywc := make([]verbs.WorkCompletion, 16)
	for _, w := range ywc[:y.CQ.Poll(ywc)] {
		if w.WRID == 200 {
			t.Errorf("Y's receive for Z completed with %v from QP %d (X is %d, Z %d)", w.Status, w.SrcQP, x.QP.Num(), z.QP.Num())
		}
	}
	if string(fresh.Bytes()[:8]) == "STALE!!!" {
		t.Error("X's Send landed in the receive Y posted for Z")
	}
}

// TestFailedSetupClosesAtOnce: a connection that fails before it starts
// (a Dial with a QP already connected) is closed at once, not after the
// wait for a peer's confirmation that only a started connection can
// receive.
func TestFailedSetupClosesAtOnce(t *testing.T) {
	y, x := newLifeSide(t), newLifeSide(t)
	verbstest.Connect(t, addr(t), y.QP, x.QP)
	l, err := cm.Listen(addr(t))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	z := newLifeSide(t)
	go func() {
		if req, err := l.Accept(context.Background()); err == nil {
			if c, err := req.Accept(z.QP, nil); err == nil {
				c.Close()
			}
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := cm.Dial(ctx, l.Addr(), x.QP, nil); err == nil {
		t.Fatal("Dial with a QP already connected succeeded")
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("a Dial that failed before its connection started took %v", d)
	}
}
