package cm_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"log"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"

	_ "github.com/goverbs/goverbs/provider/loop" // device loop0, addresses loop://name
)

// check ends the example on an error.
func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

// A server and a client as two programs would write them, run here as
// two goroutines of one process on loop0. Across processes on one host
// the address is shm://@name; across hosts, tcp://host:port: each side
// opens the device that serves the address (cm.Device), and nothing else
// changes.
func Example_clientServer() {
	// The server's main: listen, then serve.
	l, err := cm.Listen("loop://example")
	check(err)
	defer l.Close()
	served := make(chan struct{})
	go func() {
		defer close(served)
		server(l)
	}()

	// The client's main.
	client("loop://example")
	<-served
	// Output:
	// client: RDMA_READ success 12 bytes: Hello, RDMA!
	// server: the client says "thanks"
}

// server registers a value peers may read, accepts one connection and
// tells the client in the connection's private data where the value is;
// its CPU takes no part in the client's RDMA Read. It posts a receive
// before it accepts, for the message the client sends when it is done.
func server(l *cm.Listener) {
	name, err := cm.Device(l.Addr()) // loop0, shm0 or tcp0
	check(err)
	dev, err := verbs.Open(name)
	check(err)
	defer dev.Close()
	pd, err := dev.AllocPD()
	check(err)
	value, err := pd.AllocMR(64, verbs.AccessRemoteRead)
	check(err)
	n := copy(value.Bytes(), "Hello, RDMA!")
	inbox, err := pd.AllocMR(64, verbs.AccessLocalWrite)
	check(err)
	cq, err := dev.CreateCQ(16)
	check(err)
	// An endpoint's QP takes receives before it is connected, so that the
	// client's Send finds one on every provider (tcp0 has no
	// receiver-not-ready retry).
	ep, err := cm.NewEndpoint(pd, verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq,
		Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	check(err)
	_, err = ep.QP().PostRecv([]verbs.RecvWR{{WRID: 1, SGList: []verbs.SGE{inbox.SGE(0, 64)}}})
	check(err)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := l.Accept(ctx)
	check(err)
	// Where the value is: address, rkey, length.
	var where [16]byte
	binary.BigEndian.PutUint64(where[0:], value.Addr())
	binary.BigEndian.PutUint32(where[8:], value.RKey())
	binary.BigEndian.PutUint32(where[12:], uint32(n))
	conn, err := ep.Accept(req, &cm.Param{PrivateData: where[:]})
	check(err)
	defer conn.Close()

	wc := make([]verbs.WorkCompletion, 1)
	_, err = cq.Wait(ctx, wc) // sleeps until the client's Send lands
	check(err)
	msg, err := verbs.Received(&wc[0], inbox.Bytes())
	check(err)
	fmt.Printf("server: the client says %q\n", msg)
}

// client dials the server, reads the value with one RDMA Read named by
// the address and rkey the server sent, and tells the server it is done
// with a Send.
func client(addr string) {
	name, err := cm.Device(addr)
	check(err)
	dev, err := verbs.Open(name)
	check(err)
	defer dev.Close()
	pd, err := dev.AllocPD()
	check(err)
	buf, err := pd.AllocMR(64, verbs.AccessLocalWrite)
	check(err)
	cq, err := dev.CreateCQ(16)
	check(err)
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq,
		Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	check(err)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := cm.Dial(ctx, addr, qp, nil)
	check(err)
	defer conn.Close()
	where := conn.PrivateData()
	raddr := binary.BigEndian.Uint64(where[0:])
	rkey := binary.BigEndian.Uint32(where[8:])
	length := binary.BigEndian.Uint32(where[12:])

	wc := make([]verbs.WorkCompletion, 1)
	_, err = qp.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{buf.SGE(0, int(length))}, RemoteAddr: raddr, RKey: rkey}})
	check(err)
	for cq.Poll(wc) == 0 { // busy-polls: no system call, no allocation
	}
	fmt.Printf("client: %v %v %d bytes: %s\n", wc[0].Opcode, wc[0].Status, wc[0].ByteLen, buf.Bytes()[:wc[0].ByteLen])

	n := copy(buf.Bytes(), "thanks")
	_, err = qp.PostSend([]verbs.SendWR{{WRID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{buf.SGE(0, n)}}})
	check(err)
	_, err = cq.Wait(ctx, wc)
	check(err)
	if wc[0].Status != verbs.WCSuccess {
		log.Fatalf("send: %v", wc[0].Status)
	}
}
