package kv

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// TestServerWithoutTheSecretIsCaught: a listener that squats a kv
// server's address without its secret accepts a client that proves a
// credential and answers its proof with statusOK and a MAC it could not
// make; the client's Dial fails with ErrServerUnproven instead of
// trusting it with its writes.
func TestServerWithoutTheSecretIsCaught(t *testing.T) {
	a := addrs()["loop"]()
	l, err := cm.Listen(a)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dev, _ := cm.Device(a)
	vctx, err := verbs.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer vctx.Close()
	pd, err := vctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	cq, err := vctx.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	maxMsg := requestHeader + MaxKey + 64
	mr, err := pd.AllocMR(2*maxMsg, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := cm.NewEndpoint(pd, verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	qp := ep.QP()
	if _, err := qp.PostRecv([]verbs.RecvWR{{WRID: 1, SGList: []verbs.SGE{mr.SGE(0, maxMsg)}}}); err != nil {
		t.Fatal(err)
	}
	index, err := pd.AllocMR(SlotSize*4, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}

	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // a hang guard
		defer cancel()
		req, err := l.Accept(ctx)
		if err != nil {
			done <- err
			return
		}
		acc := indexInfo{slotsPerBucket: 4, buckets: 1, maxMsg: maxMsg, addr: index.Addr()}.encode(qp.Num(), make([]byte, 16))
		conn, err := req.Accept(qp, &cm.Param{PrivateData: acc})
		if err != nil {
			done <- err
			return
		}
		defer conn.Close()
		wcs := make([]verbs.WorkCompletion, 4)
		for {
			n, err := cq.Wait(ctx, wcs)
			if err != nil {
				done <- err
				return
			}
			for _, wc := range wcs[:n] {
				if wc.Opcode != verbs.WCRecv {
					continue
				}
				b, _ := verbs.Received(&wc, mr.Bytes()[:maxMsg])
				q := request(b)
				if q.valid() && q.op() == opGrant {
					// The squatter grants the region's own key.
					var g [grantHeader + 4]byte
					gn := putGrant(g[:], false, index.RKey(), []uint32{index.RKey()})
					n := putReply(mr.Bytes()[maxMsg:], statusOK, q.id(), g[:gn])
					if _, err := qp.PostRecv([]verbs.RecvWR{{WRID: 1, SGList: []verbs.SGE{mr.SGE(0, maxMsg)}}}); err != nil {
						done <- err
						return
					}
					if _, err := qp.PostSend([]verbs.SendWR{{WRID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{mr.SGE(maxMsg, n)}}}); err != nil {
						done <- err
						return
					}
					continue
				}
				if !q.valid() || q.op() != opAuth {
					done <- errors.New("the client's request after its grant is not its proof")
					return
				}
				// The squatter cannot check the proof, so it says yes,
				// with a MAC of its own making.
				n := putReply(mr.Bytes()[maxMsg:], statusOK, q.id(), make([]byte, 32))
				if _, err := qp.PostSend([]verbs.SendWR{{WRID: 2, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{mr.SGE(maxMsg, n)}}}); err != nil {
					done <- err
					return
				}
				<-conn.Done() // until the client hangs up
				done <- nil
				return
			}
		}
	}()
	err = dialErr(a, DialConfig{Credential: TokenCredential([]byte("the shared secret"))})
	if !errors.Is(err, ErrServerUnproven) {
		t.Fatalf("Dial of a server without the secret: %v, want ErrServerUnproven", err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the squatter: %v", err)
	}
}
