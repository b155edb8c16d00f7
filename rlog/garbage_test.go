package rlog

import (
	"context"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
)

// TestGarbageFromSender: a peer posing as a primary sends a replica
// garbage — malformed messages, messages out of turn, torn frames, gaps,
// duplicates, records of a future epoch, a buffer that does not exist.
// The replica answers each with ERROR or a NACK, and applies nothing but
// the good records.
func TestGarbageFromSender(t *testing.T) {
	c := newCluster(t, "loop", 3, smallConfig())
	c.start(1, false)
	addr := c.addrs[1]
	const bufSize = 16 << 10
	connect := func(mode Mode) (*rawPeer, ringInfo) {
		t.Helper()
		p := newRawPeer(t, addr)
		req := newConnMsg(kindReplicate)
		req.setEpoch(1)
		req.setMember(99)
		req.setCluster(clusterID(c.addrs))
		req.setBuffers(2)
		req.setBufSize(bufSize)
		req.setMode(mode)
		r := p.dialMember(addr, 1, 0, testSecret, req, 0, 0)
		if r.status() != codeOK {
			t.Fatalf("replicate refused: status %d", r.status())
		}
		if h := p.until(msgHello); h == nil {
			t.Fatal("no HELLO")
		}
		return p, r.ring()
	}
	expectError := func(p *rawPeer, what string) {
		t.Helper()
		m := p.until(msgError)
		if m == nil || m.errCode() != codeProtocol {
			t.Fatalf("%s: %v, want ERROR (protocol)", what, m)
		}
		t.Logf("%s: ERROR %q", what, m.errText())
	}
	expectNack := func(p *rawPeer, gen uint32, expect uint64, what string) {
		t.Helper()
		// A STATUS repeats the last NACK until a later generation
		// clears it (one goes out whenever durability advances): pass
		// over those.
		m := p.until(msgStatus)
		for m != nil && (!m.statusNack() || m.statusNackGen() < gen) {
			m = p.until(msgStatus)
		}
		if m == nil || m.statusNackGen() != gen || m.statusExpect() != expect {
			t.Fatalf("%s: %v, want a NACK of generation %d asking for %d", what, m, gen, expect)
		}
	}
	buf := make([]byte, ctrlSize)
	good := frames(1, 3, 1, recData)

	p, _ := connect(ModeWrite)
	p.sendMsg([]byte("junk"))
	expectError(p, "junk")

	p, _ = connect(ModeWrite)
	p.sendMsg(putData(buf, 0, 0, len(good), 3, 1, 3, 0, false))
	expectError(p, "DATA before START")

	p, _ = connect(ModeWrite)
	p.sendMsg(putStart(buf, 5, 0, 5))
	expectError(p, "START keeping records the replica does not have")

	p, ring := connect(ModeWrite)
	p.sendMsg(putStart(buf, 0, 0, 3))
	torn := append([]byte(nil), good...)
	torn[2*32+frameHeader-1] ^= 1 // the third record's header (records 1 and 2 take 32 bytes each)
	p.write(torn, ring.addr, ring.rkey)
	p.sendMsg(putData(buf, 0, 0, len(torn), 3, 1, 3, 0, false))
	expectNack(p, 0, 3, "a torn third record (the first two are good)")
	gap := frames(4, 2, 1, recData)
	p.write(gap, ring.addr+bufSize, ring.rkey)
	p.sendMsg(putData(buf, 1, 1, len(gap), 2, 4, 5, 0, false))
	expectNack(p, 1, 3, "a gap")
	future := frames(3, 1, 7, recData)
	p.write(future, ring.addr, ring.rkey)
	p.sendMsg(putData(buf, 2, 0, len(future), 1, 3, 3, 0, false))
	expectNack(p, 2, 3, "a record of an epoch newer than the sender's")
	rest := frames(3, 1, 1, recData)
	p.write(rest, ring.addr+bufSize, ring.rkey)
	p.sendMsg(putData(buf, 3, 1, len(rest), 1, 3, 3, 0, false))
	c.waitDurable(1, 3)
	dup := frames(3, 1, 1, recData)
	p.write(dup, ring.addr, ring.rkey)
	p.sendMsg(putData(buf, 3, 0, len(dup), 1, 3, 3, 0, false))
	expectNack(p, 3, 4, "a duplicate")
	p.sendMsg(putData(buf, 4, 7, len(dup), 1, 4, 4, 0, false))
	expectError(p, "DATA in a buffer that does not exist")

	p, _ = connect(ModeSend)
	p.sendMsg(putStart(buf, 3, 0, 3))
	d := putData(buf, 0, 0, 4096, 1, 4, 4, 0, true) // claims 4096 bytes of frames, carries none
	p.sendMsg(d)
	expectError(p, "DATA whose length does not match its frames")

	p, _ = connect(ModeWrite)
	p.sendMsg(putStart(buf, 3, 0, 3))
	p.sendMsg(putStatus(buf, 0, 0, false, 0, 0))
	expectError(p, "a STATUS from a sender")

	recs := c.records(1)
	if len(recs) != 3 {
		t.Fatalf("the replica holds %d records after the garbage; only 3 were good", len(recs))
	}
	for i, r := range recs {
		if string(r.Data) != string(recData(uint64(i+1))) || r.Epoch != 1 {
			t.Fatalf("record %d: %v", i+1, r)
		}
	}
}

// TestGarbageFromReceiver: a peer posing as a replica sends the primary
// garbage — messages out of turn, credits it was never given, a durable
// record it was never sent, a history out of order. The primary ends each
// session with ERROR, and counts nothing the peer claims toward a quorum.
func TestGarbageFromReceiver(t *testing.T) {
	c := newCluster(t, "loop", 3, smallConfig())
	l, err := cm.Listen(c.addrs[2])
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c.start(1, false)
	c.start(0, true)
	cl := c.dial()
	c.stop(1) // the fake is all the primary has for a quorum now
	next := func() *rawPeer {
		t.Helper()
		req, r := nextRequest(t, l, kindReplicate)
		p := newRawPeer(t, c.addrs[2])
		reply := newConnMsg(kindReplicate)
		reply.setRing(ringInfo{addr: p.ring.Addr(), rkey: p.ring.RKey(), buffers: r.buffers(), bufSize: r.bufSize()})
		reply.setEpoch(r.epoch())
		p.acceptMember(req, r, 2, testSecret, reply)
		return p
	}
	expectError := func(p *rawPeer, what string) {
		t.Helper()
		m := p.until(msgError)
		if m == nil || m.errCode() != codeProtocol {
			t.Fatalf("%s: %v, want ERROR (protocol)", what, m)
		}
		t.Logf("%s: ERROR %q", what, m.errText())
	}
	buf := make([]byte, ctrlSize)
	p := next()
	p.sendMsg(putStatus(buf, 0, 0, false, 0, 0))
	expectError(p, "STATUS before HELLO")

	p = next()
	p.sendMsg(putHello(buf, 1, 1, 0, 0, nil))
	if m := p.until(msgStart); m == nil || m.startTruncate() != 0 {
		t.Fatalf("START: %v", m)
	}
	p.sendMsg(putStatus(buf, 5, 0, false, 0, 0))
	expectError(p, "STATUS freeing batches never sent")

	p = next()
	p.sendMsg(putHello(buf, 1, 1, 0, 0, nil))
	p.until(msgStart)
	p.sendMsg(putStatus(buf, 0, 1000, false, 0, 0))
	expectError(p, "STATUS claiming record 1000 durable")

	p = next()
	p.sendMsg(putHello(buf, 1, 1, 10, 10, []epochStart{{3, 1}, {2, 5}}))
	expectError(p, "a HELLO whose history goes backwards")

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := cl.Append(ctx, []byte("needs a real quorum")); err == nil {
		t.Fatal("an append was acknowledged with only the primary and a lying peer")
	}
	if st := c.members[0].Status(); st.Commit != 0 {
		t.Fatalf("commit index %d: the peer's claims counted", st.Commit)
	}
}
