package rlog

import (
	"context"
	"crypto/hmac"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// rawPeer is a hand-driven end of an rlog connection, for sending what a
// well-behaved member never would.
type rawPeer struct {
	t    *testing.T
	vctx *verbs.Context
	pd   *verbs.PD
	cq   *verbs.CQ
	qp   *verbs.QP
	conn *cm.Conn
	recv *verbs.MR
	send *verbs.MR
	ring *verbs.MR // a ring this peer exposes (as a fake receiver)
	wc   [8]verbs.WorkCompletion
}

const rawRecvs = 16

func newRawPeer(t *testing.T, addr string) *rawPeer {
	t.Helper()
	dev, err := cm.Device(addr)
	if err != nil {
		t.Fatal(err)
	}
	p := &rawPeer{t: t}
	if p.vctx, err = verbs.Open(dev); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.close)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	p.pd, err = p.vctx.AllocPD()
	must(err)
	p.cq, err = p.vctx.CreateCQ(64)
	must(err)
	p.qp, err = p.pd.CreateQP(verbs.QPInitAttr{SendCQ: p.cq, RecvCQ: p.cq, Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: rawRecvs, MaxSendSGE: 2, MaxRecvSGE: 1}})
	must(err)
	must(p.qp.Modify(&verbs.QPAttr{State: verbs.QPSInit, Port: 1, AccessFlags: verbs.AccessLocalWrite | verbs.AccessRemoteWrite},
		verbs.QPAttrState|verbs.QPAttrPort|verbs.QPAttrAccessFlags))
	p.recv, err = p.pd.AllocMR(rawRecvs*(1<<17), verbs.AccessLocalWrite)
	must(err)
	p.send, err = p.pd.AllocMR(1<<17, verbs.AccessLocalWrite)
	must(err)
	p.ring, err = p.pd.AllocMR(4<<16, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	must(err)
	for i := range rawRecvs {
		p.postRecv(i)
	}
	return p
}

func (p *rawPeer) postRecv(i int) {
	if _, err := p.qp.PostRecv([]verbs.RecvWR{{WRID: uint64(i), SGList: []verbs.SGE{p.recv.SGE(i<<17, 1<<17)}}}); err != nil {
		p.t.Fatal(err)
	}
}

func (p *rawPeer) close() {
	if p.conn != nil {
		p.conn.Close()
	}
	p.vctx.Close()
}

// dial connects with the given private data; it returns the reply's.
func (p *rawPeer) dial(addr string, pd connMsg) (connMsg, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := cm.Dial(ctx, addr, p.qp, &cm.Param{PrivateData: pd})
	if err != nil {
		return nil, err
	}
	p.conn = conn
	return connMsg(conn.PrivateData()), nil
}

// accept accepts req on the peer's QP, replying reply.
func (p *rawPeer) accept(req *cm.Request, reply connMsg) {
	p.t.Helper()
	var err error
	if p.conn, err = req.Accept(p.qp, &cm.Param{PrivateData: reply}); err != nil {
		p.t.Fatal(err)
	}
}

// nextRequest accepts the next connection request of kind at l,
// rejecting others (a fence is answered with codeUnavailable).
func nextRequest(t *testing.T, l *cm.Listener, kind uint8) (*cm.Request, connMsg) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		req, err := l.Accept(ctx)
		if err != nil {
			t.Fatalf("no %d connection request: %v", kind, err)
		}
		r := connMsg(req.PrivateData())
		if r.valid() && r.kind() == kind {
			return req, r
		}
		rej := newConnMsg(r.kind())
		rej.setStatus(codeUnavailable)
		req.Reject(rej)
	}
}

// sendMsg sends b (copied into the send buffer), and frames as a second
// SGE if not nil.
func (p *rawPeer) sendMsg(b []byte) {
	n := copy(p.send.Bytes(), b)
	if _, err := p.qp.PostSend([]verbs.SendWR{{WRID: 1 << 40, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{p.send.SGE(0, n)}}}); err != nil {
		p.t.Fatal(err)
	}
}

// write RDMA-Writes b to raddr/rkey.
func (p *rawPeer) write(b []byte, raddr uint64, rkey uint32) {
	off := 1 << 16
	n := copy(p.send.Bytes()[off:], b)
	if _, err := p.qp.PostSend([]verbs.SendWR{{WRID: 2 << 40, Opcode: verbs.OpRDMAWrite, SGList: []verbs.SGE{p.send.SGE(off, n)},
		RemoteAddr: raddr, RKey: rkey}}); err != nil {
		p.t.Fatal(err)
	}
}

// next returns the next message received, or nil if the connection
// broke; it fails the test after a few seconds without either.
func (p *rawPeer) next() msg {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		n, err := p.cq.Wait(ctx, p.wc[:1])
		if err != nil {
			p.t.Fatalf("no message within 5 s: %v", err)
		}
		wc := p.wc[0]
		if n == 0 {
			continue
		}
		if wc.Status != verbs.WCSuccess {
			return nil
		}
		if wc.Opcode != verbs.WCRecv {
			continue
		}
		i := int(wc.WRID)
		b := append([]byte(nil), p.recv.Bytes()[i<<17:i<<17+int(wc.ByteLen)]...)
		p.postRecv(i)
		return msg(b)
	}
}

// until returns the next message of type typ, skipping others; nil if
// the connection broke first.
func (p *rawPeer) until(typ uint8) msg {
	p.t.Helper()
	for {
		m := p.next()
		if m == nil || m.typ() == typ {
			return m
		}
	}
}

// dialMember connects to member target as member self would, proving
// membership with secret (a ring grant in the AUTH, if any), and returns
// the acceptor's answer; it fails the test if the acceptor does not
// prove itself or does not answer.
func (p *rawPeer) dialMember(addr string, target, self int, secret []byte, req connMsg, grantAddr uint64, grantKey uint32) connMsg {
	p.t.Helper()
	req.setIndex(self)
	newNonce(req.nonce())
	r, err := p.dial(addr, req)
	if err != nil {
		p.t.Fatal(err)
	}
	if !hmac.Equal(r.acceptMAC(), authMAC(secret, labelAcceptor, req, r.acceptNonce(), target, nil)) {
		p.t.Fatal("the acceptor did not prove that it is a member")
	}
	a := putAuth(make([]byte, authLen), nil, grantAddr, grantKey)
	copy(a.authMAC(), authMAC(secret, labelDialer, req, r.acceptNonce(), target, a.authGrant()))
	p.sendMsg(a)
	ans := p.until(msgAnswer)
	if ans == nil {
		p.t.Fatal("no ANSWER")
	}
	if !hmac.Equal(ans.answerMAC(), authMAC(secret, labelAnswer, req, r.acceptNonce(), target, ans.answer())) {
		p.t.Fatal("an ANSWER that is not signed")
	}
	return ans.answer()
}

// acceptMember accepts req (of a member that dials member self) as a
// member does: it proves itself, checks the dialer's AUTH, and answers
// reply.
func (p *rawPeer) acceptMember(req *cm.Request, r connMsg, self int, secret []byte, reply connMsg) {
	p.t.Helper()
	acc := newConnMsg(r.kind())
	newNonce(acc.acceptNonce())
	copy(acc.acceptMAC(), authMAC(secret, labelAcceptor, r, acc.acceptNonce(), self, nil))
	p.accept(req, acc)
	a := p.until(msgAuth)
	if a == nil || !hmac.Equal(a.authMAC(), authMAC(secret, labelDialer, r, acc.acceptNonce(), self, a.authGrant())) {
		p.t.Fatal("the dialer did not prove that it is a member")
	}
	p.sendMsg(putAnswer(make([]byte, answerLen), reply, authMAC(secret, labelAnswer, r, acc.acceptNonce(), self, reply)))
}
