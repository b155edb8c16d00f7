package rlog

import (
	"testing"

	"github.com/goverbs/goverbs/verbs"
)

// TestForgedReceiveCompletions: over shm0 a peer writes the completions
// of its Sends into this side's CQ, with any WRID and byte count. A
// completion that names no receive posted, or more bytes than the
// receive holds, is refused: the primary drops the client that sent it
// (and goes on serving the others), a receiver or sender ends its
// session; none of them slices out of bounds.
func TestForgedReceiveCompletions(t *testing.T) {
	c := newCluster(t, "loop", 2, smallConfig())
	c.start(1, false)
	m := c.start(0, true)
	cl := c.dial()
	appendN(t, cl, 1, "x")
	c.waitDurable(1, 1)

	p := m.prim
	depth := uint64(p.m.cfg.ClientDepth)
	for _, tc := range []struct {
		name string
		slot uint64
		n    uint32
	}{
		{"more bytes than the receive holds", depth - 1, 1 << 30},
		{"a slot never posted", 0xffff, 64},
		{"the slot just past the last posted", depth, 64},
	} {
		p.cmu.Lock()
		var qpn uint32
		var cs *clientSession
		for q, s := range p.clients {
			qpn, cs = q, s
		}
		p.cmu.Unlock()
		if cs == nil {
			t.Fatalf("%s: no client session", tc.name)
		}
		wc := verbs.WorkCompletion{WRID: cs.tag<<tagShift | tc.slot, Status: verbs.WCSuccess, Opcode: verbs.WCRecv, QPNum: qpn, ByteLen: tc.n}
		if err := p.handle(wc); err != nil {
			t.Errorf("%s: the primary fails: %v", tc.name, err)
		}
		if p.client(qpn) != nil {
			t.Errorf("%s: the client that forged it is still served", tc.name)
		}
		// A client dials again; the primary still serves appends.
		cl = c.dial()
		appendN(t, cl, 1, tc.name)
	}

	c.members[1].mu.Lock()
	r := c.members[1].recv
	c.members[1].mu.Unlock()
	for _, wrid := range []uint64{^uint64(0), 1 << 63, uint64(r.nrecv)} {
		if err := r.handle(verbs.WorkCompletion{WRID: wrid, Status: verbs.WCSuccess, Opcode: verbs.WCRecv, ByteLen: 8}); err == nil {
			t.Errorf("a receiver took a completion of receive %#x, of %d posted", wrid, r.nrecv)
		}
	}
	if err := r.handle(verbs.WorkCompletion{WRID: 0, Status: verbs.WCSuccess, Opcode: verbs.WCRecv, ByteLen: 1 << 30}); err == nil {
		t.Error("a receiver took a completion of more bytes than its receive holds")
	}
}

// TestReplayedAppendRefused: over shm0 a client's process writes the
// completions of its Sends into the primary's CQ, so it can complete its
// last APPEND's receive again, with the request still in the buffer. The
// primary appends nothing for it and drops the client; the next append,
// of another client, takes the very next sequence number.
func TestReplayedAppendRefused(t *testing.T) {
	c := newCluster(t, "loop", 2, smallConfig())
	c.start(1, false)
	m := c.start(0, true)
	cl := c.dial()
	seqs := appendN(t, cl, 3, "x")
	c.waitDurable(1, seqs[2])

	p := m.prim
	p.cmu.Lock()
	var qpn uint32
	var cs *clientSession
	for q, s := range p.clients {
		qpn, cs = q, s
	}
	p.cmu.Unlock()
	if cs == nil {
		t.Fatal("no client session")
	}
	// The slot that holds the last APPEND taken, as the client sent it.
	slot, n := -1, 0
	for i := range p.m.cfg.ClientDepth {
		b := cs.recvMR.Bytes()[i*cs.msgSize : (i+1)*cs.msgSize]
		if l := msg(b).length(); l >= msgHeader && l <= len(b) {
			if r, err := parseMsg(b[:l]); err == nil && r.typ() == msgAppend && r.appendID() == cs.lastID {
				slot, n = i, l
			}
		}
	}
	if slot < 0 {
		t.Fatalf("no receive buffer holds APPEND %d", cs.lastID)
	}
	wc := verbs.WorkCompletion{WRID: cs.tag<<tagShift | uint64(slot), Status: verbs.WCSuccess, Opcode: verbs.WCRecv, QPNum: qpn, ByteLen: uint32(n)}
	if err := p.handle(wc); err != nil {
		t.Fatalf("the primary fails: %v", err)
	}
	next := appendN(t, c.dial(), 1, "after")
	if next[0] != seqs[2]+1 {
		t.Fatalf("the append after the replay has sequence %d, want %d: the replay was appended", next[0], seqs[2]+1)
	}
	// The dropped client's receives were flushed into the CQ before the
	// next client's APPEND arrived, so the primary has forgotten it.
	if p.client(qpn) != nil {
		t.Error("the client that replayed its APPEND is still served")
	}
}
