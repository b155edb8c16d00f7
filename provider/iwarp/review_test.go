package iwarp_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"

	"github.com/goverbs/goverbs/provider/iwarp/wire"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// Regressions from an adversarial review of the receive path.

// TestPartialReadRequestHoldsNoReceive: a peer that sends a whole Send
// and then the first bytes of a Read Request, and stalls, cannot keep the
// Send's receive from completing (it was held back for the Read Request,
// to answer it first, until that FPDU was done).
func TestPartialReadRequestHoldsNoReceive(t *testing.T) {
	v := newVictim(t, 4)
	g := guard(t, v, 4096, verbs.AccessLocalWrite|verbs.RemoteAccess)
	h := dialHostile(t, v, false, false, false)
	if n, err := v.e.PostRecv(0, []verbs.RecvWR{{WRID: 5, SGList: []verbs.SGE{g.r.SGE(0, 64)}}}); n != 1 {
		t.Fatalf("post receive: %v", err)
	}
	send := h.fpdu(h.untagged(wire.OpSend, wire.QNSend, 32), bytes.Repeat([]byte{1}, 32))
	rr := h.readRequest(0, 0, 0)
	h.send(append(send, rr[:8]...))
	wcs, err := v.e.Completions(verbstest.RecvCQ, 1, 5*time.Second)
	if err != nil || len(wcs) != 1 || wcs[0].Status != verbs.WCSuccess || wcs[0].WRID != 5 {
		t.Fatalf("the Send arrived whole and its receive completed with %+v (%v), want a success", wcs, err)
	}
}

// TestAcceptSeesContextEnd: Accept returns when its context ends even
// while a client that connected says nothing (it waited out the MPA
// Request's 10 s setup timeout).
func TestAcceptSeesContextEnd(t *testing.T) {
	l, err := cm.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	silent, err := net.Dial("tcp", l.Addr()[len("tcp://"):])
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := l.Accept(ctx)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Accept: %v, want the context's end", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept did not return 5 s after its context ended")
	}
}
