package kv

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/provider/iwarp/wire"
	"github.com/goverbs/goverbs/verbs"
)

// TestStalledHandshake: a tcp0 initiator that asks for peer-to-peer mode
// and never sends its RTR holds a client slot of the server until the
// RTR's timeout (listenwait.Timeout, which TestMain makes 10 s); another
// client connects meanwhile, and Close does not wait for the stalled
// handshake.
func TestStalledHandshake(t *testing.T) {
	a := addrs()["iwarp"]()
	srv, err := Listen(a, small())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	nc, err := net.Dial("tcp", strings.TrimPrefix(a, "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	f := make(wire.Frame, wire.FrameHeaderLen+wire.V2Len)
	f.SetHeader(wire.KeyReq, wire.FlagEnhanced, wire.Revision2, wire.V2Len)
	wire.V2(f[wire.FrameHeaderLen:]).Set(4, 4, true, wire.RTRWrite)
	if _, err := nc.Write(f); err != nil {
		t.Fatal(err)
	}
	// The MPA Reply: the server has accepted and now waits for the RTR,
	// which never comes.
	if _, err := io.ReadFull(nc, make([]byte, wire.FrameHeaderLen)); err != nil {
		t.Fatalf("no MPA Reply: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := Dial(ctx, a)
	if err != nil {
		t.Fatalf("a client could not connect while another stalls its handshake: %v", err)
	}
	if err := c.Put([]byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	c.Close()
	start := time.Now()
	srv.Close()
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %v: it waited for the stalled handshake", d)
	}
}

// TestRecvDepthBounded: a client that sends as fast as it can, without
// waiting for replies, on a server configured with more receives per
// client than its CQs could hold for 64 clients, cannot overrun them:
// RecvDepth is capped, and the server goes on serving.
func TestRecvDepthBounded(t *testing.T) {
	a := addrs()["loop"]()
	srv := startServer(t, a, Config{Buckets: 64, MaxValue: 64, HeapBytes: 1 << 16, RecvDepth: 512, Spin: -1})
	if srv.cfg.RecvDepth != maxRecvDepth {
		t.Fatalf("RecvDepth %d, want it capped at %d", srv.cfg.RecvDepth, maxRecvDepth)
	}
	dev, err := cm.Device(a)
	if err != nil {
		t.Fatal(err)
	}
	vctx, err := verbs.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer vctx.Close()
	pd, err := vctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	const clients, sends = 10, 512
	cq, err := vctx.CreateCQ(2 * clients * sends)
	if err != nil {
		t.Fatal(err)
	}
	mr, err := pd.AllocMR(1<<16, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	n := putRequest(mr.Bytes()[:64], opGet, 1, []byte("absent"), nil)
	var qps []*verbs.QP
	for range clients {
		qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq,
			Cap: verbs.QPCap{MaxSendWR: sends, MaxRecvWR: sends, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		conn, err := cm.Dial(ctx, a, qp, nil)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		for range sends {
			if _, err := qp.PostRecv([]verbs.RecvWR{{SGList: []verbs.SGE{mr.SGE(1024, 1024)}}}); err != nil {
				t.Fatal(err)
			}
		}
		qps = append(qps, qp)
	}
	for range sends {
		for _, qp := range qps {
			if _, err := qp.PostSend([]verbs.SendWR{{Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{mr.SGE(0, n)}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Every Send completes, delivered or refused for want of a receive
	// (the server posts RecvDepth of them).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wcs := make([]verbs.WorkCompletion, 256)
	for done := 0; done < clients*sends; {
		k, err := cq.Wait(ctx, wcs)
		if err != nil {
			t.Fatalf("after %d of %d send completions: %v", done, clients*sends, err)
		}
		for _, wc := range wcs[:k] {
			if wc.Opcode == verbs.WCSend {
				done++
			}
		}
	}
	c := dial(t, a)
	if err := c.Put([]byte("k"), []byte("v")); err != nil {
		t.Fatalf("a PUT after the flood: %v", err)
	}
	if err := srv.recvCQ.Err(); err != nil {
		t.Fatalf("the server's receive CQ: %v", err)
	}
}

// TestClosedClient: a closed client's operations fail with ErrClosed;
// it does not dial the server again.
func TestClosedClient(t *testing.T) {
	a := addrs()["loop"]()
	startServer(t, a, small())
	c := dial(t, a)
	if err := c.Put([]byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, err := c.Get([]byte("k")); !errors.Is(err, ErrClosed) {
		t.Errorf("Get after Close: %v, want ErrClosed", err)
	}
	if err := c.Put([]byte("k"), []byte("w")); !errors.Is(err, ErrClosed) {
		t.Errorf("Put after Close: %v, want ErrClosed", err)
	}
	if n := c.Reconnects.Load(); n != 0 {
		t.Errorf("the closed client dialled %d times", n)
	}
}
