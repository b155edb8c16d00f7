package ibverbs_test

import (
	"context"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// TestAcceptAbandonedQPStateHolds checks an accept whose requester gave
// up (its Dial cancelled once the request reached the listener): Accept
// fails (on iWARP it may succeed before the kernel sees the requester
// leave, and the connection then ends by itself, its QP in the error
// state), and the state the QP it was given reports is true: if it looks
// connectable (Reset or Init), it connects. On iWARP the kernel may move
// the QP on by itself in rdma_accept and reports no state; siw never
// takes a QP out of the error state, and accepting on one there upsets
// the kernel.
func TestAcceptAbandonedQPStateHolds(t *testing.T) {
	device, addr := harnessEnv(t)
	vctx, err := verbs.Open(device)
	if err != nil {
		t.Fatal(err)
	}
	defer vctx.Close()
	pd, err := vctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Dealloc()
	cq, err := vctx.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	defer cq.Destroy()
	qpCap := verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}
	var qps [3]*verbs.QP
	for i := range qps {
		if qps[i], err = pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: qpCap}); err != nil {
			t.Fatal(err)
		}
		defer qps[i].Destroy()
	}
	a := addr(t)
	l, err := cm.Listen(a)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dctx, dcancel := context.WithCancel(ctx)
	dialled := make(chan error, 1)
	go func() {
		c, err := cm.Dial(dctx, a, qps[0], nil)
		if c != nil {
			c.Close()
		}
		dialled <- err
	}()
	req, err := l.Accept(ctx)
	if err != nil {
		dcancel()
		<-dialled
		t.Fatal(err)
	}
	dcancel()
	if err := <-dialled; err == nil {
		t.Fatal("Dial succeeded with no Accept")
	}
	c, err := req.Accept(qps[1], nil)
	if err == nil {
		// On iWARP the kernel may complete the accept before it sees the
		// requester leave: the MPA reply goes out on a TCP stream whose
		// end has not reached this side yet. The connection it made must
		// then end by itself, and leave the QP in the error state.
		defer c.Close()
		if vctx.QueryDevice().Transport != "iwarp" {
			t.Fatal("Accept of a request whose requester gave up succeeded")
		}
		select {
		case <-c.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("Accept of a request whose requester gave up succeeded, and the connection did not end in 10 s")
		}
		attr, err := qps[1].Query()
		if err != nil {
			t.Fatal(err)
		}
		if attr.State != verbs.QPSErr {
			t.Fatalf("the connection of an abandoned request ended, and its QP reports %v, not the error state", attr.State)
		}
		t.Logf("Accept succeeded before the kernel saw the requester leave; the connection ended")
		return
	}
	t.Logf("Accept: %v", err)
	attr, err := qps[1].Query()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the QP after the failed Accept: %v", attr.State)
	if attr.State != verbs.QPSReset && attr.State != verbs.QPSInit {
		return
	}
	accepted := make(chan error, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err == nil {
			var c *cm.Conn
			if c, err = req.Accept(qps[1], nil); err == nil {
				c.Close()
			}
		}
		accepted <- err
	}()
	d, err := cm.Dial(ctx, a, qps[2], nil)
	if err == nil {
		d.Close()
	}
	if aerr := <-accepted; err != nil || aerr != nil {
		t.Errorf("the QP reports %v after the failed Accept, yet connecting it again failed: dial: %v, accept: %v", attr.State, err, aerr)
	}
}
