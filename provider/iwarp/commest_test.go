package iwarp_test

import (
	"context"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// TestAcceptedQPRaisesNoCommEst: a QP that Accept moves on to RTS (no
// HoldRTR) raises no EventCommEst, even for a request that reaches it
// while Accept is still finishing: the initiator posts a Send the moment
// Dial returns, which can arrive right behind its RTR, before the
// accepting side's QP has left RTR.
func TestAcceptedQPRaisesNoCommEst(t *testing.T) {
	for range 10 {
		acceptThenSend(t)
	}
}

func acceptThenSend(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	spd, scq, sqp := verbstest.QPOn(t, "tcp0", 4)
	inbox, err := spd.AllocMR(64, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	init := verbs.QPAttr{State: verbs.QPSInit, Port: 1, AccessFlags: verbs.AccessLocalWrite}
	if err := sqp.Modify(&init, verbs.QPAttrState|verbs.QPAttrPort|verbs.QPAttrAccessFlags); err != nil {
		t.Fatal(err)
	}
	if _, err := sqp.PostRecv([]verbs.RecvWR{{WRID: 7, SGList: []verbs.SGE{inbox.SGE(0, 64)}}}); err != nil {
		t.Fatal(err)
	}
	l, err := cm.Listen("tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan *cm.Conn, 1)
	acceptErr := make(chan error, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err == nil {
			var c *cm.Conn
			if c, err = req.Accept(sqp, nil); err == nil {
				accepted <- c
			}
		}
		acceptErr <- err
	}()
	cpd, _, cqp := verbstest.QPOn(t, "tcp0", 4)
	buf, err := cpd.AllocMR(64, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := cm.Dial(ctx, l.Addr(), cqp, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := cqp.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.OpSend, SGList: []verbs.SGE{buf.SGE(0, 8)}}}); err != nil {
		t.Fatal(err)
	}
	if err := <-acceptErr; err != nil {
		t.Fatalf("accept: %v", err)
	}
	defer (<-accepted).Close()
	wc := make([]verbs.WorkCompletion, 1)
	if n, err := scq.Wait(ctx, wc); err != nil || n != 1 || wc[0].Status != verbs.WCSuccess {
		t.Fatalf("the accepting side's receive: %d completions %v (error %v)", n, wc[:n], err)
	}
	// An event is queued before the request that raised it is placed.
	for {
		select {
		case ev := <-sqp.PD().Context().Events():
			if ev.Type == verbs.EventCommEst {
				t.Fatalf("%v raised for a QP that Accept moved on to RTS", ev.Type)
			}
			continue
		default:
		}
		break
	}
}
