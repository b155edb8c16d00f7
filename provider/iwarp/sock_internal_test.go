package iwarp

import (
	"context"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// sockTestQP is a tcp0 QP on a context of its own.
func sockTestQP(t *testing.T) *verbs.QP {
	ctx, err := verbs.Open("tcp0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Close() })
	pd, err := ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := ctx.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	q, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq,
		Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// TestConcurrentAbortWaitsForWriter: while one abort (a Close, Destroy or
// Modify to the error state) waits for a system call announced on the
// socket (a writev between sock.enter and its call), the receive
// goroutine ends (a poller's kick finds the connection aborted). Its own
// abort must wait too: rxLoop closes the socket's descriptor right after
// it, which would leave the writev to run on a closed, or reused,
// descriptor number. Before the fix, the second abort returned at once
// and the descriptor was closed under the writer in every run.
func TestConcurrentAbortWaitsForWriter(t *testing.T) {
	qa, qb := sockTestQP(t), sockTestQP(t)
	l, err := cm.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	accepted := make(chan *cm.Conn, 1)
	go func() {
		defer close(accepted)
		req, err := l.Accept(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		cb, err := req.Accept(qb, nil)
		if err != nil {
			t.Error(err)
			return
		}
		accepted <- cb
	}()
	ca, err := cm.Dial(ctx, l.Addr(), qa, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	cb := <-accepted
	if cb == nil {
		t.FailNow()
	}
	defer cb.Close()
	c := qb.Driver().(*qp).live.Load()
	if c == nil || !c.sk.enter() { // the transmitter, before its writev
		t.Fatal("no live connection to hold a system call on")
	}
	aborted := make(chan struct{})
	go func() { c.abort(); close(aborted) }() // waits for the writer
	for !c.sk.closed.Load() {
		runtime.Gosched()
	}
	c.kickRx() // the receive goroutine finds the connection aborted and ends
	fd := c.sk.fd
	// Nothing signals that the descriptor was not closed: look for a while
	// (the receive goroutine, unblocked, ends within microseconds).
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); runtime.Gosched() {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err != nil {
			t.Errorf("descriptor %d closed while a system call on it was announced: %v", fd, err)
			break
		}
	}
	select {
	case <-aborted:
		t.Error("the first abort returned while a system call on the socket was announced")
	default:
	}
	c.sk.exit()
	<-aborted
}
