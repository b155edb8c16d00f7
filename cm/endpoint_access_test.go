package cm_test

import (
	"context"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// TestEndpointAccessKeptAfterConnecting: an endpoint made with
// NewEndpointAccess keeps its access flags through Accept, so its peer's
// RDMA Write is refused even into a region that allows remote writes.
func TestEndpointAccessKeptAfterConnecting(t *testing.T) {
	for _, dev := range []string{"loop0", "shm0", "tcp0"} {
		t.Run(dev, func(t *testing.T) {
			srv, cli := newEndpointSide(t, dev), newEndpointSide(t, dev)
			target, err := srv.pd.AllocMR(endpointMsgLen, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
			if err != nil {
				t.Fatal(err)
			}
			defer target.Dereg()
			attr := verbs.QPInitAttr{SendCQ: srv.cq, RecvCQ: srv.cq,
				Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}}
			sep, err := cm.NewEndpointAccess(srv.pd, attr, verbs.AccessLocalWrite)
			if err != nil {
				t.Fatal(err)
			}
			defer sep.Destroy()
			cep := cli.endpoint(t)
			defer cep.Destroy()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			l, err := cm.Listen(reuseAddr(dev))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			accepted := make(chan *cm.Conn, 1)
			go func() {
				defer close(accepted)
				req, err := l.Accept(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				conn, err := sep.Accept(req, nil)
				if err != nil {
					t.Error(err)
					return
				}
				accepted <- conn
			}()
			conn, err := cep.Dial(ctx, l.Addr(), nil)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			sconn := <-accepted
			if sconn == nil {
				t.FailNow()
			}
			defer sconn.Close()
			if a, err := sep.QP().Query(); err != nil || a.AccessFlags != verbs.AccessLocalWrite {
				t.Fatalf("the accepted QP's access: %v, %v; want %v", a.AccessFlags, err, verbs.AccessLocalWrite)
			}
			copy(cli.mr.Bytes(), "peer")
			if _, err := cep.QP().PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
				SGList: []verbs.SGE{cli.mr.SGE(0, 4)}, RemoteAddr: target.Addr(), RKey: target.RKey()}}); err != nil {
				t.Fatal(err)
			}
			wc := make([]verbs.WorkCompletion, 1)
			if _, err := cli.cq.Wait(ctx, wc); err != nil {
				t.Fatal(err)
			}
			if wc[0].Status == verbs.WCSuccess {
				t.Fatal("the peer's RDMA Write succeeded on a QP without remote write access")
			}
			if string(target.Bytes()[:4]) == "peer" {
				t.Fatal("the peer wrote the region through a QP without remote write access")
			}
		})
	}
}
