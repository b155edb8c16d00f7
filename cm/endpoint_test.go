package cm_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// endpointSide is one end of an endpoint test: a device context with a
// PD, a CQ, and a region holding the messages it sends and receives.
type endpointSide struct {
	ctx *verbs.Context
	pd  *verbs.PD
	cq  *verbs.CQ
	mr  *verbs.MR
}

const (
	endpointMsgs   = 4  // Sends each side posts the moment it is connected
	endpointMsgLen = 64 // bytes of each
)

func newEndpointSide(t *testing.T, dev string) *endpointSide {
	t.Helper()
	s := &endpointSide{}
	var err error
	if s.ctx, err = verbs.Open(dev); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.ctx.Close() })
	if s.pd, err = s.ctx.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if s.cq, err = s.ctx.CreateCQ(4 * endpointMsgs); err != nil {
		t.Fatal(err)
	}
	if s.mr, err = s.pd.AllocMR(2*endpointMsgs*endpointMsgLen, verbs.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *endpointSide) endpoint(t *testing.T) *cm.Endpoint {
	t.Helper()
	ep, err := cm.NewEndpoint(s.pd, verbs.QPInitAttr{SendCQ: s.cq, RecvCQ: s.cq,
		Cap: verbs.QPCap{MaxSendWR: endpointMsgs, MaxRecvWR: endpointMsgs, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if st := ep.QP().State(); st != verbs.QPSInit {
		t.Fatalf("a new endpoint's QP is in %v, want INIT", st)
	}
	return ep
}

// postRecvs posts the receives, into the region's first half, before
// the endpoint connects.
func (s *endpointSide) postRecvs(ep *cm.Endpoint) error {
	for i := range endpointMsgs {
		wr := []verbs.RecvWR{{WRID: uint64(100 + i), SGList: []verbs.SGE{s.mr.SGE(i*endpointMsgLen, endpointMsgLen)}}}
		if _, err := ep.QP().PostRecv(wr); err != nil {
			return err
		}
	}
	return nil
}

// sendAll posts the Sends, from the region's second half, the moment the
// endpoint is connected: the natural order of a program, which meets the
// peer's receives only because they were posted before it connected.
func (s *endpointSide) sendAll(ep *cm.Endpoint, tag string) error {
	for i := range endpointMsgs {
		off := (endpointMsgs + i) * endpointMsgLen
		copy(s.mr.Bytes()[off:off+endpointMsgLen], fmt.Sprintf("%s message %d", tag, i))
		wr := []verbs.SendWR{{WRID: uint64(200 + i), Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
			SGList: []verbs.SGE{s.mr.SGE(off, endpointMsgLen)}}}
		if _, err := ep.QP().PostSend(wr); err != nil {
			return err
		}
	}
	return nil
}

// complete waits for n completions and checks that each succeeded and
// that the peer's messages arrived whole.
func (s *endpointSide) complete(ctx context.Context, n int, peerTag string) error {
	wc := make([]verbs.WorkCompletion, n)
	for got := 0; got < len(wc); {
		k, err := s.cq.Wait(ctx, wc[got:])
		got += k
		if err != nil {
			return fmt.Errorf("after %d of %d completions: %w", got, len(wc), err)
		}
	}
	for _, c := range wc {
		if c.Status != verbs.WCSuccess {
			return fmt.Errorf("WR %d completed with %v", c.WRID, c.Status)
		}
		if c.Opcode != verbs.WCRecv {
			continue
		}
		i := int(c.WRID - 100)
		want := fmt.Sprintf("%s message %d", peerTag, i)
		got := s.mr.Bytes()[i*endpointMsgLen : (i+1)*endpointMsgLen]
		if c.ByteLen != endpointMsgLen || !bytes.HasPrefix(got, []byte(want)) {
			return fmt.Errorf("receive %d holds %q (%d bytes), want %q", i, got, c.ByteLen, want)
		}
	}
	return nil
}

// TestEndpointSendsRightAfterConnecting: a client and a server each make
// an endpoint, post their receives, and connect; the server posts its
// Sends the moment Accept returns, and they complete before the client
// does anything after Dial. On every provider, and on tcp0, which has no
// RNR retry and fails a Send that finds no receive posted, every Send and
// every receive succeeds, connection after connection. (Posting the
// client's receives after Dial instead fails this test: on tcp0 the
// server's Sends fail, on loop0 and shm0 they wait for receives forever.)
func TestEndpointSendsRightAfterConnecting(t *testing.T) {
	for _, dev := range []string{"loop0", "shm0", "tcp0"} {
		t.Run(dev, func(t *testing.T) {
			srv, cli := newEndpointSide(t, dev), newEndpointSide(t, dev)
			for round := range 8 {
				if err := endpointRound(t, dev, srv, cli); err != nil {
					t.Fatalf("connection %d: %v", round, err)
				}
			}
		})
	}
}

func endpointRound(t *testing.T, dev string, srv, cli *endpointSide) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := cm.Listen(reuseAddr(dev))
	if err != nil {
		return err
	}
	defer l.Close()
	sep, cep := srv.endpoint(t), cli.endpoint(t)
	defer sep.Destroy()
	defer cep.Destroy()
	if err := srv.postRecvs(sep); err != nil {
		return err
	}
	if err := cli.postRecvs(cep); err != nil {
		return err
	}

	// Each side closes its connection only once both have seen every
	// completion: a side that closed first would flush the peer's Sends
	// still waiting for their acknowledgement.
	type served struct {
		conn *cm.Conn
		err  error
	}
	done := make(chan served, 1)
	serverSent := make(chan struct{})
	go func() {
		req, err := l.Accept(ctx)
		if err != nil {
			close(serverSent)
			done <- served{err: err}
			return
		}
		conn, err := sep.Accept(req, nil)
		if err == nil {
			if err = srv.sendAll(sep, "server"); err == nil {
				err = srv.complete(ctx, endpointMsgs, "client")
			}
		}
		close(serverSent)
		if err == nil {
			err = srv.complete(ctx, endpointMsgs, "client")
		}
		done <- served{conn, err}
	}()
	conn, err := cep.Dial(ctx, l.Addr(), nil)
	if err == nil {
		defer conn.Close()
		<-serverSent
		if err = cli.sendAll(cep, "client"); err == nil {
			err = cli.complete(ctx, 2*endpointMsgs, "server")
		}
	}
	s := <-done
	if s.conn != nil {
		defer s.conn.Close()
	}
	if s.err != nil {
		err = errors.Join(err, fmt.Errorf("server: %w", s.err))
	}
	return err
}

// TestNewEndpointFails: an endpoint the device cannot make is refused
// with the device's reason, and leaves no QP behind (its PD can then be
// deallocated).
func TestNewEndpointFails(t *testing.T) {
	s := newEndpointSide(t, "loop0")
	_, err := cm.NewEndpoint(s.pd, verbs.QPInitAttr{SendCQ: s.cq, RecvCQ: s.cq,
		Cap: verbs.QPCap{MaxSendWR: 1 << 30, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if !errors.Is(err, verbs.ErrInvalidArg) {
		t.Fatalf("NewEndpoint with a send queue of 2^30 WRs: %v, want ErrInvalidArg", err)
	}
	if err := s.mr.Dereg(); err != nil {
		t.Fatal(err)
	}
	if err := s.pd.Dealloc(); err != nil {
		t.Fatalf("the PD of a refused endpoint: %v", err)
	}
}
