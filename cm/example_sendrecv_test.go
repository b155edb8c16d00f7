package cm_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"

	_ "github.com/goverbs/goverbs/provider/loop" // device loop0, addresses loop://name
)

// Message semantics: the receiver posts a buffer, the sender's Send lands
// in it, and the receiver sleeps in CQ.Wait until the completion comes,
// which says how many bytes arrived. A fetch-and-add on the receiver's
// counter follows, returning the value from before.
func Example_sendRecv() {
	qpCap := verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}
	// Receiver: a buffer for the message, and an 8-byte counter peers may add to.
	srv, err := verbs.Open("loop0")
	check(err)
	defer srv.Close()
	spd, err := srv.AllocPD()
	check(err)
	inbox, err := spd.AllocMR(64, verbs.AccessLocalWrite)
	check(err)
	counter, err := spd.AllocMR(8, verbs.AccessLocalWrite|verbs.AccessRemoteAtomic)
	check(err)
	binary.LittleEndian.PutUint64(counter.Bytes(), 41)
	rcq, err := srv.CreateCQ(16)
	check(err)
	rqp, err := spd.CreateQP(verbs.QPInitAttr{SendCQ: rcq, RecvCQ: rcq, Cap: qpCap})
	check(err)
	l, err := cm.Listen("loop://example-send")
	check(err)
	defer l.Close()
	accepted := make(chan *cm.Conn)
	go func() {
		req, err := l.Accept(context.Background())
		check(err)
		var where [12]byte
		binary.BigEndian.PutUint64(where[0:], counter.Addr())
		binary.BigEndian.PutUint32(where[8:], counter.RKey())
		// A receive posted before the connection is accepted (the QP
		// moved to Init for it) is there for the first Send.
		init := verbs.QPAttr{State: verbs.QPSInit, Port: 1, AccessFlags: verbs.AccessLocalWrite | verbs.RemoteAccess}
		check(rqp.Modify(&init, verbs.QPAttrState|verbs.QPAttrPort|verbs.QPAttrAccessFlags))
		_, err = rqp.PostRecv([]verbs.RecvWR{{WRID: 7, SGList: []verbs.SGE{inbox.SGE(0, 64)}}})
		check(err)
		conn, err := req.Accept(rqp, &cm.Param{PrivateData: where[:]})
		check(err)
		accepted <- conn
	}()

	// Sender.
	cli, err := verbs.Open("loop0")
	check(err)
	defer cli.Close()
	pd, err := cli.AllocPD()
	check(err)
	out, err := pd.AllocMR(64, verbs.AccessLocalWrite)
	check(err)
	cq, err := cli.CreateCQ(16)
	check(err)
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: qpCap})
	check(err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := cm.Dial(ctx, "loop://example-send", qp, nil)
	check(err)
	defer conn.Close()
	sconn := <-accepted
	defer sconn.Close()

	n := copy(out.Bytes(), "ping")
	_, err = qp.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.OpSend, SGList: []verbs.SGE{out.SGE(0, n)}}})
	check(err)
	wc := make([]verbs.WorkCompletion, 1)
	_, err = rcq.Wait(ctx, wc) // sleeps until the Send has landed
	check(err)
	fmt.Println(wc[0].Opcode, wc[0].WRID, wc[0].Status, wc[0].ByteLen, "bytes:", string(inbox.Bytes()[:wc[0].ByteLen]))

	where := conn.PrivateData()
	_, err = qp.PostSend([]verbs.SendWR{{WRID: 2, Opcode: verbs.OpAtomicFetchAndAdd, Flags: verbs.SendSignaled,
		SGList:     []verbs.SGE{out.SGE(0, 8)},
		RemoteAddr: binary.BigEndian.Uint64(where[0:]), RKey: binary.BigEndian.Uint32(where[8:]),
		CompareAdd: 1}})
	check(err)
	_, err = cq.Wait(ctx, wc)
	check(err)
	fmt.Println(wc[0].Opcode, wc[0].Status, "old value", binary.LittleEndian.Uint64(out.Bytes()),
		"now", binary.LittleEndian.Uint64(counter.Bytes()))
	// Output:
	// RECV 7 success 4 bytes: ping
	// FETCH_ADD success old value 41 now 42
}
