package cm_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"log"
	"os"
	"slices"
	"strings"
	"testing"
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
// the addresses are shm://@name (device shm0); across hosts,
// tcp://host:port (tcp0): nothing else changes.
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
	dev, err := verbs.Open("loop0")
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
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq,
		Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	check(err)
	// Receives are posted before the connection is up (the QP in Init),
	// so that no Send finds none: tcp0 has no receiver-not-ready retry.
	check(qp.Modify(&verbs.QPAttr{State: verbs.QPSInit, Port: 1, AccessFlags: verbs.AccessRemoteRead},
		verbs.QPAttrState|verbs.QPAttrPort|verbs.QPAttrAccessFlags))
	_, err = qp.PostRecv([]verbs.RecvWR{{WRID: 1, SGList: []verbs.SGE{inbox.SGE(0, 64)}}})
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
	conn, err := req.Accept(qp, &cm.Param{PrivateData: where[:]})
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
	dev, err := verbs.Open("loop0")
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

// TestREADMEExample keeps the example in the README at the root of the
// repository the same as server and client here: the README's first Go
// code block after the marker below must be their source, as it stands
// in this file.
func TestREADMEExample(t *testing.T) {
	const marker = "<!-- example: cm/example_test.go server client -->"
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatalf("read the README: %v", err)
	}
	_, after, ok := strings.Cut(string(readme), marker)
	if !ok {
		t.Fatalf("README.md has no line %q before the example", marker)
	}
	_, block, ok := strings.Cut(after, "```go\n")
	if !ok {
		t.Fatal("README.md has no ```go block after the example marker")
	}
	block, _, _ = strings.Cut(block, "```")

	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "example_test.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, name := range []string{"server", "client"} {
		i := slices.IndexFunc(f.Decls, func(d ast.Decl) bool {
			fd, ok := d.(*ast.FuncDecl)
			return ok && fd.Name.Name == name
		})
		if i < 0 {
			t.Fatalf("example_test.go has no func %s", name)
		}
		fd := f.Decls[i].(*ast.FuncDecl)
		want = append(want, string(src[fset.Position(fd.Doc.Pos()).Offset:fset.Position(fd.End()).Offset]))
	}
	if got, want := strings.TrimSpace(block), strings.Join(want, "\n\n"); got != want {
		t.Errorf("the README's example differs from server and client in cm/example_test.go; copy them into the README.\nREADME:\n%s\nexample:\n%s", got, want)
	}
}
