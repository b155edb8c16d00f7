package cm_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"

	_ "github.com/goverbs/goverbs/provider/iwarp" // device tcp0, addresses tcp://host:port
)

// The portable order: each side makes an endpoint, posts its receive,
// then connects, so the peer's first Send finds it — also on tcp0, which
// has no RNR retry. The server sends the moment Accept returns.
func ExampleEndpoint() {
	must := func(err error) {
		if err != nil {
			log.Fatal(err)
		}
	}
	// side opens tcp0 and makes an endpoint with a 64-byte receive posted.
	side := func() (*verbs.Context, *verbs.CQ, *verbs.MR, *cm.Endpoint) {
		dev, err := verbs.Open("tcp0")
		must(err)
		pd, err := dev.AllocPD()
		must(err)
		cq, err := dev.CreateCQ(8)
		must(err)
		mr, err := pd.AllocMR(128, verbs.AccessLocalWrite)
		must(err)
		ep, err := cm.NewEndpoint(pd, verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq,
			Cap: verbs.QPCap{MaxSendWR: 2, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}})
		must(err)
		_, err = ep.QP().PostRecv([]verbs.RecvWR{{WRID: 1, SGList: []verbs.SGE{mr.SGE(0, 64)}}})
		must(err)
		return dev, cq, mr, ep
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	l, err := cm.Listen("tcp://127.0.0.1:0")
	must(err)
	defer l.Close()
	sdev, scq, smr, sep := side()
	defer sdev.Close()
	served := make(chan *cm.Conn)
	go func() {
		req, err := l.Accept(ctx)
		must(err)
		conn, err := sep.Accept(req, nil)
		must(err)
		n := copy(smr.Bytes()[64:], "hello from the server")
		_, err = sep.QP().PostSend([]verbs.SendWR{{WRID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
			SGList: []verbs.SGE{smr.SGE(64, n)}}})
		must(err)
		wc := make([]verbs.WorkCompletion, 1)
		_, err = scq.Wait(ctx, wc)
		must(err)
		fmt.Println("server:", wc[0].Opcode, wc[0].Status)
		served <- conn
	}()

	cdev, ccq, cmr, cep := side()
	defer cdev.Close()
	conn, err := cep.Dial(ctx, l.Addr(), nil)
	must(err)
	wc := make([]verbs.WorkCompletion, 1)
	_, err = ccq.Wait(ctx, wc)
	must(err)
	sconn := <-served // after the server's line
	fmt.Printf("client: %v %v %q\n", wc[0].Opcode, wc[0].Status, cmr.Bytes()[:wc[0].ByteLen])
	conn.Close()
	sconn.Close()
	// Output:
	// server: SEND success
	// client: RECV success "hello from the server"
}
