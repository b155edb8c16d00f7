package rlog

import (
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// An intruder is a peer that is not a member: it knows what is not
// secret — the members' addresses, so the cluster id — but not the
// secret. It claims to be a member (a real member's index, a made-up
// member id), asks for a replicate, fetch or fence connection of a high
// epoch, proves membership with a secret of its own, and at once injects
// what it would do with a ring: a START that truncates the log to
// nothing and a DATA of forged records.

var errDropped = errors.New("the member dropped the connection")

// intrusion is how an intruder's attempt ended.
type intrusion struct {
	answered bool  // the member sent an ANSWER: the intruder got through
	err      error // else why not: refused (a cm rejection) or dropped
}

// end is a bare connection end for an intruder or an impostor: a QP
// with four receives posted, and a send buffer; it fails nothing itself,
// so that it may run outside the test's goroutine.
type end struct {
	vctx       *verbs.Context
	cq         *verbs.CQ
	qp         *verbs.QP
	recv, send *verbs.MR
}

func openEnd(addr string) (*end, error) {
	dev, err := cm.Device(addr)
	if err != nil {
		return nil, err
	}
	e := &end{}
	if e.vctx, err = verbs.Open(dev); err != nil {
		return nil, err
	}
	fail := func(err error) (*end, error) {
		e.vctx.Close()
		return nil, err
	}
	pd, err := e.vctx.AllocPD()
	if err != nil {
		return fail(err)
	}
	if e.cq, err = e.vctx.CreateCQ(16); err != nil {
		return fail(err)
	}
	ep, err := cm.NewEndpoint(pd, verbs.QPInitAttr{SendCQ: e.cq, RecvCQ: e.cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return fail(err)
	}
	e.qp = ep.QP()
	if e.recv, err = pd.AllocMR(4*ctrlSize, verbs.AccessLocalWrite); err != nil {
		return fail(err)
	}
	if e.send, err = pd.AllocMR(4*ctrlSize, verbs.AccessLocalWrite); err != nil {
		return fail(err)
	}
	for i := range 4 {
		if _, err := e.qp.PostRecv([]verbs.RecvWR{{WRID: uint64(i), SGList: []verbs.SGE{e.recv.SGE(i*ctrlSize, ctrlSize)}}}); err != nil {
			return fail(err)
		}
	}
	return e, nil
}

func (e *end) close() { e.vctx.Close() }

// next returns the next message received, or errDropped once the
// connection breaks.
func (e *end) next(ctx context.Context) (msg, error) {
	wc := make([]verbs.WorkCompletion, 1)
	for {
		n, err := e.cq.Wait(ctx, wc)
		if err != nil {
			return nil, fmt.Errorf("the peer neither sent a message nor dropped the connection: %w", err)
		}
		if n == 0 {
			continue
		}
		if wc[0].Status != verbs.WCSuccess {
			return nil, errDropped
		}
		if wc[0].Opcode == verbs.WCRecv {
			b := e.recv.Bytes()[int(wc[0].WRID)*ctrlSize:][:wc[0].ByteLen]
			return msg(append([]byte(nil), b...)), nil
		}
	}
}

// intrude makes one attempt against the member at addr of the log of
// members; with silent, it proves nothing and sends nothing.
func intrude(ctx context.Context, addr string, members []string, kind uint8, epoch uint64, silent bool) intrusion {
	e, err := openEnd(addr)
	if err != nil {
		return intrusion{err: err}
	}
	defer e.close()
	req := newConnMsg(kind)
	req.setEpoch(epoch)
	req.setMember(0xbad0bad0)
	req.setCluster(clusterID(members))
	target, claim := 0, 0 // claim a real member's index, not the target's
	for i, a := range members {
		if a == addr {
			target, claim = i, (i+1)%len(members)
		}
	}
	req.setIndex(claim)
	req.setBuffers(2)
	req.setBufSize(16 << 10)
	newNonce(req.nonce())
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := cm.Dial(dctx, addr, e.qp, &cm.Param{PrivateData: req})
	if err != nil {
		return intrusion{err: err}
	}
	defer conn.Close()
	if !silent {
		r := connMsg(conn.PrivateData())
		wrong := []byte("a secret of the intruder's own!")
		slot := func(i int) []byte { return e.send.Bytes()[i*ctrlSize : (i+1)*ctrlSize] }
		a := putAuth(slot(0), nil, 0, 0)
		copy(a.authMAC(), authMAC(wrong, labelDialer, req, r.acceptNonce(), target, a.authGrant()))
		start := putStart(slot(1), 0, 1, 0)
		n := putFrame(slot(3), 1, epoch, []byte("forged"))
		data := putData(slot(2), 1, 0, n, 1, 1, 1, 1, true)
		data = data[:dataLen+copy(slot(2)[dataLen:], slot(3)[:n])]
		for i, m := range []msg{a, start, data} {
			wr := []verbs.SendWR{{WRID: uint64(i), Opcode: verbs.OpSend, SGList: []verbs.SGE{e.send.SGE(i*ctrlSize, len(m))}}}
			if _, err := e.qp.PostSend(wr); err != nil {
				return intrusion{err: fmt.Errorf("%w: %w", errDropped, err)}
			}
		}
	}
	for {
		m, err := e.next(dctx)
		if err != nil {
			return intrusion{err: err}
		}
		if m, err := parseMsg(m); err == nil && m.typ() == msgAnswer {
			return intrusion{answered: true}
		}
	}
}

// TestNonMemberRefused: an intruder asks each member, the primary
// included, to replicate from it, to let it fetch, and to promise it an
// epoch of 2^62 — proving membership with a secret of its own, then
// injecting a truncating START and forged records — or connects and
// stays silent. No member answers it; each drops it; no epoch, log or
// role changes; every acknowledged record stays, and the log goes on
// taking appends.
func TestNonMemberRefused(t *testing.T) {
	c := newCluster(t, "loop", 3, smallConfig())
	c.start(1, false)
	c.start(2, false)
	c.start(0, true)
	cl := c.dial()
	ctx := context.Background()
	for i := range 20 {
		if _, err := cl.Append(ctx, []byte(fmt.Sprint("acknowledged ", i))); err != nil {
			t.Fatal(err)
		}
	}
	before := make([]Status, 3)
	for i := range 3 {
		before[i] = c.members[i].Status()
	}
	for i, addr := range c.addrs {
		for k, kind := range []uint8{kindReplicate, kindFetch, kindFence} {
			for _, silent := range []bool{false, true} {
				if silent && k != i {
					continue // silence costs a second: one kind per member
				}
				res := intrude(ctx, addr, c.addrs, kind, 1<<62, silent)
				if res.answered || !errors.Is(res.err, errDropped) {
					t.Fatalf("member %d, kind %d, silent %v: answered %v, %v; want dropped unanswered", i, kind, silent, res.answered, res.err)
				}
			}
		}
	}
	for i := range 3 {
		st := c.members[i].Status()
		if st.Epoch != before[i].Epoch || st.Primary != before[i].Primary || st.Last < before[i].Last || st.LastEpoch != before[i].LastEpoch {
			t.Fatalf("member %d changed: %+v, was %+v", i, st, before[i])
		}
	}
	seq, err := cl.Append(ctx, []byte("after the intruder"))
	if err != nil || seq != 21 {
		t.Fatalf("append after the intruder: %d, %v", seq, err)
	}
	c.waitFor("every member to hold record 21 durably", func() bool {
		for _, m := range c.members {
			if m.Status().Durable < 21 {
				return false
			}
		}
		return true
	})
	for i := range 3 {
		n := 0
		if _, err := ScanDir(c.dirs[i], 1, func(r Record) error {
			n++
			if r.Epoch != before[0].Epoch {
				return fmt.Errorf("record %d of epoch %d", r.Seq, r.Epoch)
			}
			return nil
		}); err != nil || n != 21 {
			t.Fatalf("member %d's log: %d records, %v", i, n, err)
		}
	}
}

// TestProofBoundToConnection: a proof of membership made for one
// connection — here by a peer holding the secret, recorded and sent
// again on a second connection with the same request — is refused there:
// the acceptor's nonce differs.
func TestProofBoundToConnection(t *testing.T) {
	c := newCluster(t, "loop", 3, smallConfig())
	c.start(1, false)
	addr := c.addrs[1]
	req := newConnMsg(kindFence)
	req.setEpoch(5)
	req.setMember(77)
	req.setCluster(clusterID(c.addrs))
	req.setIndex(0)
	newNonce(req.nonce())
	p := newRawPeer(t, addr)
	r, err := p.dial(addr, req)
	if err != nil {
		t.Fatal(err)
	}
	auth := putAuth(make([]byte, authLen), nil, 0, 0)
	copy(auth.authMAC(), authMAC(testSecret, labelDialer, req, r.acceptNonce(), 1, auth.authGrant()))
	p.sendMsg(auth)
	ans := p.until(msgAnswer)
	if ans == nil || ans.answer().status() != codeOK || ans.answer().epoch() != 5 {
		t.Fatalf("the genuine proof: %v", ans)
	}
	p2 := newRawPeer(t, addr)
	req2 := append(connMsg(nil), req...)
	req2.setEpoch(6)
	r2, err := p2.dial(addr, req2)
	if err != nil {
		t.Fatal(err)
	}
	if hmac.Equal(r.acceptNonce(), r2.acceptNonce()) {
		t.Fatal("the acceptor chose the same nonce twice")
	}
	p2.sendMsg(auth)
	if m := p2.next(); m != nil {
		t.Fatalf("a replayed proof was answered: %v", m)
	}
	if st := c.members[1].Status(); st.Epoch != 5 {
		t.Fatalf("epoch %d after the replay, want the 5 promised to the genuine proof", st.Epoch)
	}
}

// TestMemberChecksAcceptor: a listener at a member's address that does
// not hold the secret is not counted as a member: a promotion that
// would need it fails, telling why, and it is never sent a proof.
func TestMemberChecksAcceptor(t *testing.T) {
	cfg := smallConfig()
	cfg.PromoteTimeout = 2 * time.Second
	c := newCluster(t, "loop", 3, cfg)
	l, err := cm.Listen(c.addrs[1])
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	l2, err := cm.Listen(c.addrs[2])
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	// The impostors accept every request with a proof made with
	// another secret, and report any message the promoter sends them.
	proofs := make(chan uint8, 64)
	ictx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()
	impostor := func(l *cm.Listener) {
		defer wg.Done()
		for {
			req, err := l.Accept(ictx)
			if err != nil {
				return
			}
			r := connMsg(req.PrivateData())
			reply := newConnMsg(r.kind())
			newNonce(reply.acceptNonce())
			copy(reply.acceptMAC(), authMAC([]byte("not the cluster's secret"), labelAcceptor, r, reply.acceptNonce(), 1, nil))
			e, err := openEnd(c.addrs[0])
			if err != nil {
				refuse(req, r.kind(), codeUnavailable)
				continue
			}
			if _, err := req.Accept(e.qp, &cm.Param{PrivateData: reply}); err != nil {
				e.close()
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer e.close()
				if m, err := e.next(ictx); err == nil {
					select {
					case proofs <- m.typ():
					default:
					}
				}
			}()
		}
	}
	wg.Add(2)
	go impostor(l)
	go impostor(l2)
	_, err = c.startErr(0, true)
	if !errors.Is(err, ErrNoQuorum) || !errors.Is(err, ErrAuth) {
		t.Fatalf("promotion with impostors for the majority: %v; want ErrNoQuorum for ErrAuth", err)
	}
	stop()
	l.Close()
	l2.Close()
	wg.Wait()
	select {
	case typ := <-proofs:
		t.Fatalf("an impostor was sent a message of type %d", typ)
	default:
	}
}

// TestClientLearnsOnlyLimits: what an anonymous client's connection
// returns — the primary's reply, a replica's refusal, a refusal of a
// member's request with the wrong cluster — carries no cluster id,
// member id or epoch.
func TestClientLearnsOnlyLimits(t *testing.T) {
	c := newCluster(t, "loop", 3, smallConfig())
	c.start(1, false)
	c.start(2, false)
	c.start(0, true)
	leaks := func(what string, r connMsg) {
		t.Helper()
		if r.member() != 0 || r.cluster() != 0 || r.epoch() != 0 {
			t.Fatalf("%s tells member %d, cluster %x, epoch %d", what, r.member(), r.cluster(), r.epoch())
		}
	}
	p := newRawPeer(t, c.addrs[0])
	r, err := p.dial(c.addrs[0], newConnMsg(kindClient))
	if err != nil {
		t.Fatal(err)
	}
	if r.status() != codeOK || r.a() == 0 {
		t.Fatalf("the primary's reply to a client: status %d, message size %d", r.status(), r.a())
	}
	leaks("the primary's reply", r)
	refusal := func(addr string, req connMsg) connMsg {
		t.Helper()
		p := newRawPeer(t, addr)
		_, err := p.dial(addr, req)
		var rej *cm.RejectError
		if !errors.As(err, &rej) {
			t.Fatalf("%v, want a refusal", err)
		}
		return connMsg(rej.PrivateData)
	}
	r = refusal(c.addrs[1], newConnMsg(kindClient))
	if r.status() != codeNotPrimary {
		t.Fatalf("a replica refused a client with status %d", r.status())
	}
	leaks("a replica's refusal", r)
	req := newConnMsg(kindFence)
	req.setEpoch(1 << 62)
	req.setCluster(12345)
	r = refusal(c.addrs[0], req)
	if r.status() != codeCluster {
		t.Fatalf("a fence of another cluster refused with status %d", r.status())
	}
	leaks("the refusal of another cluster's fence", r)
}

// TestHandshakeSlotsBounded: peers that connect and never prove
// themselves take at most maxPendingAuth handshake slots; the next is
// refused (too many connections), and once a silent peer is dropped, a
// member gets through again.
func TestHandshakeSlotsBounded(t *testing.T) {
	c := newCluster(t, "loop", 3, smallConfig())
	c.hooks = []*hooks{nil, {authTimeout: time.Hour}, nil}
	c.start(1, false)
	addr := c.addrs[1]
	fence := func() connMsg {
		req := newConnMsg(kindFence)
		req.setEpoch(3)
		req.setMember(5)
		req.setCluster(clusterID(c.addrs))
		req.setIndex(0)
		newNonce(req.nonce())
		return req
	}
	silent := make([]*rawPeer, maxPendingAuth)
	for i := range silent {
		silent[i] = newRawPeer(t, addr)
		if _, err := silent[i].dial(addr, fence()); err != nil {
			t.Fatalf("silent peer %d: %v", i, err)
		}
	}
	_, err := newRawPeer(t, addr).dial(addr, fence())
	var rej *cm.RejectError
	if !errors.As(err, &rej) || connMsg(rej.PrivateData).status() != codeTooManyConns {
		t.Fatalf("a connection beyond %d silent ones: %v, want refused with too many connections", maxPendingAuth, err)
	}
	silent[0].conn.Close()
	c.waitFor("the member to drop the silent peer", func() bool { return c.logs[1].has("refused a connection") })
	p := newRawPeer(t, addr)
	if r := p.dialMember(addr, 1, 0, testSecret, fence(), 0, 0); r.status() != codeOK || r.epoch() != 3 {
		t.Fatalf("a member after a slot was freed: status %d, epoch %d", r.status(), r.epoch())
	}
}
