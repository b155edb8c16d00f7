package cm_test

import (
	"context"
	"fmt"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"

	_ "github.com/goverbs/goverbs/provider/loop" // device loop0, addresses loop://name
)

// A passive side that holds its QP in RTR (Param.HoldRTR): it takes the
// requester's messages at once, and moves the QP to RTS, to send its
// own, when the first of them raises EventCommEst — as an rdma_cm server
// that manages its own QP does.
func ExampleParam_holdRTR() {
	qpCap := verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}
	srv, err := verbs.Open("loop0")
	check(err)
	defer srv.Close()
	spd, err := srv.AllocPD()
	check(err)
	inbox, err := spd.AllocMR(64, verbs.AccessLocalWrite)
	check(err)
	scq, err := srv.CreateCQ(16)
	check(err)
	sqp, err := spd.CreateQP(verbs.QPInitAttr{SendCQ: scq, RecvCQ: scq, Cap: qpCap})
	check(err)
	l, err := cm.Listen("loop://example-hold-rtr")
	check(err)
	defer l.Close()
	accepted := make(chan *cm.Conn)
	go func() {
		req, err := l.Accept(context.Background())
		check(err)
		init := verbs.QPAttr{State: verbs.QPSInit, Port: 1, AccessFlags: verbs.AccessLocalWrite}
		check(sqp.Modify(&init, verbs.QPAttrState|verbs.QPAttrPort|verbs.QPAttrAccessFlags))
		_, err = sqp.PostRecv([]verbs.RecvWR{{WRID: 7, SGList: []verbs.SGE{inbox.SGE(0, 64)}}})
		check(err)
		conn, err := req.Accept(sqp, &cm.Param{HoldRTR: true})
		check(err)
		accepted <- conn
	}()

	cli, err := verbs.Open("loop0")
	check(err)
	defer cli.Close()
	pd, err := cli.AllocPD()
	check(err)
	buf, err := pd.AllocMR(64, verbs.AccessLocalWrite)
	check(err)
	cq, err := cli.CreateCQ(16)
	check(err)
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: qpCap})
	check(err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := cm.Dial(ctx, "loop://example-hold-rtr", qp, nil)
	check(err)
	defer conn.Close()
	sconn := <-accepted
	defer sconn.Close()
	fmt.Println("server QP:", sqp.State())

	// The client, in RTS, sends at once.
	n := copy(buf.Bytes(), "hello")
	_, err = qp.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.OpSend, SGList: []verbs.SGE{buf.SGE(0, n)}}})
	check(err)

	// The server's QP, in RTR, takes it and says so.
	ev := <-srv.Events()
	fmt.Println(ev.Type, ev.Element == sqp)
	wc := make([]verbs.WorkCompletion, 1)
	_, err = scq.Wait(ctx, wc)
	check(err)
	fmt.Println(wc[0].Opcode, wc[0].Status, string(inbox.Bytes()[:wc[0].ByteLen]))

	// Now it may send: RTR to RTS, with the attributes that move takes.
	rts := verbs.QPAttr{State: verbs.QPSRTS, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1}
	check(sqp.Modify(&rts, verbs.QPAttrState|verbs.QPAttrSQPSN|verbs.QPAttrTimeout|verbs.QPAttrRetryCnt|
		verbs.QPAttrRNRRetry|verbs.QPAttrMaxQPRdAtomic))
	fmt.Println("server QP:", sqp.State())
	// Output:
	// server QP: RTR
	// communication established true
	// RECV success hello
	// server QP: RTS
}
