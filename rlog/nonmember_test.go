package rlog

import (
	"context"
	"crypto/hmac"
	"errors"
	"fmt"
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

// intrude makes one attempt against the member at addr of the log of
// members; with silent, it proves nothing and sends nothing.
func intrude(ctx context.Context, addr string, members []string, kind uint8, epoch uint64, silent bool) intrusion {
	dev, err := cm.Device(addr)
	if err != nil {
		return intrusion{err: err}
	}
	vctx, err := verbs.Open(dev)
	if err != nil {
		return intrusion{err: err}
	}
	defer vctx.Close()
	pd, err := vctx.AllocPD()
	if err != nil {
		return intrusion{err: err}
	}
	cq, err := vctx.CreateCQ(16)
	if err != nil {
		return intrusion{err: err}
	}
	ep, err := cm.NewEndpoint(pd, verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return intrusion{err: err}
	}
	qp := ep.QP()
	recv, err := pd.AllocMR(4*ctrlSize, verbs.AccessLocalWrite)
	if err != nil {
		return intrusion{err: err}
	}
	send, err := pd.AllocMR(4*ctrlSize, verbs.AccessLocalWrite)
	if err != nil {
		return intrusion{err: err}
	}
	for i := range 4 {
		if _, err := qp.PostRecv([]verbs.RecvWR{{WRID: uint64(i), SGList: []verbs.SGE{recv.SGE(i*ctrlSize, ctrlSize)}}}); err != nil {
			return intrusion{err: err}
		}
	}
	req := newConnMsg(kind)
	req.setEpoch(epoch)
	req.setMember(0xbad0bad0)
	req.setCluster(clusterID(members))
	claim := 0 // a real member's index, not the target's
	for i, a := range members {
		if a == addr {
			claim = (i + 1) % len(members)
		}
	}
	req.setIndex(claim)
	req.setBuffers(2)
	req.setBufSize(16 << 10)
	newNonce(req.nonce())
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := cm.Dial(dctx, addr, qp, &cm.Param{PrivateData: req})
	if err != nil {
		return intrusion{err: err}
	}
	defer conn.Close()
	if !silent {
		r := connMsg(conn.PrivateData())
		wrong := []byte("a secret of the intruder's own!")
		a := putAuth(send.Bytes()[0:ctrlSize], nil, 0, 0)
		copy(a.authMAC(), authMAC(wrong, labelDialer, req, r.acceptNonce(), (claim+len(members)-1)%len(members), a.authGrant()))
		start := putStart(send.Bytes()[ctrlSize:2*ctrlSize], 0, 1, 0)
		frames := send.Bytes()[3*ctrlSize:]
		n := putFrame(frames, 1, epoch, []byte("forged"))
		data := putData(send.Bytes()[2*ctrlSize:3*ctrlSize], 1, 0, n, 1, 1, 1, 1, true)
		copy(send.Bytes()[2*ctrlSize+dataLen:], frames[:n])
		data = data[:dataLen+n]
		for i, m := range []msg{a, start, data} {
			wr := []verbs.SendWR{{WRID: uint64(i), Opcode: verbs.OpSend, SGList: []verbs.SGE{send.SGE(i*ctrlSize, len(m))}}}
			if _, err := qp.PostSend(wr); err != nil {
				return intrusion{err: fmt.Errorf("%w: %w", errDropped, err)}
			}
		}
	}
	wc := make([]verbs.WorkCompletion, 1)
	for {
		n, err := cq.Wait(dctx, wc)
		if err != nil {
			return intrusion{err: fmt.Errorf("the member neither answered nor dropped the connection: %w", err)}
		}
		if n == 0 {
			continue
		}
		if wc[0].Status != verbs.WCSuccess {
			return intrusion{err: errDropped}
		}
		if wc[0].Opcode == verbs.WCRecv {
			b := recv.Bytes()[int(wc[0].WRID)*ctrlSize:][:wc[0].ByteLen]
			if m, err := parseMsg(b); err == nil && m.typ() == msgAnswer {
				return intrusion{answered: true}
			}
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
		for _, kind := range []uint8{kindReplicate, kindFetch, kindFence} {
			for _, silent := range []bool{false, true} {
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
	cfg.PromoteTimeout = 500 * time.Millisecond
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
	proofs := make(chan int, 64)
	impostor := func(l *cm.Listener) {
		for {
			req, err := l.Accept(context.Background())
			if err != nil {
				return
			}
			r := connMsg(req.PrivateData())
			reply := newConnMsg(r.kind())
			newNonce(reply.acceptNonce())
			copy(reply.acceptMAC(), authMAC([]byte("not the cluster's secret"), labelAcceptor, r, reply.acceptNonce(), 1, nil))
			p := newRawPeer(t, c.addrs[0])
			p.accept(req, reply)
			go func() {
				if m := p.next(); m != nil {
					proofs <- int(m.typ())
				}
			}()
		}
	}
	go impostor(l)
	go impostor(l2)
	_, err = c.startErr(0, true)
	if !errors.Is(err, ErrNoQuorum) || !errors.Is(err, ErrAuth) {
		t.Fatalf("promotion with impostors for the majority: %v; want ErrNoQuorum for ErrAuth", err)
	}
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
