package kv

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/goverbs/goverbs/verbs"
)

// TestReplayedRequestRefused: a client that sends one of its earlier
// requests again, byte for byte, is refused with statusReplayed and the
// table is not changed by it: a replayed PUT does not bring back an
// overwritten value, nor a deleted key.
func TestReplayedRequestRefused(t *testing.T) {
	forEachProvider(t, func(t *testing.T, addr func() string) {
		a := addr()
		s := startServer(t, a, small())
		r := rawDial(t, a)
		first := rawRequest(opPut, 5, []byte("k"), []byte("first"))
		second := rawRequest(opPut, 6, []byte("k"), []byte("second"))
		for _, b := range [][]byte{first, second} {
			if st := r.rpc(t, b).status(); st != statusOK {
				t.Fatalf("PUT %d: status %d", request(b).id(), st)
			}
		}
		reader := dial(t, a)
		if st := r.rpc(t, first).status(); st != statusReplayed {
			t.Fatalf("the first PUT again: status %d, want %d (replayed)", st, statusReplayed)
		}
		if v, err := reader.Get([]byte("k")); err != nil || string(v) != "second" {
			t.Fatalf("after a replayed PUT the value is %q, %v; want the second", v, err)
		}
		if st := r.rpc(t, rawRequest(opDel, 7, []byte("k"), nil)).status(); st != statusOK {
			t.Fatalf("DELETE: status %d", st)
		}
		if st := r.rpc(t, second).status(); st != statusReplayed {
			t.Fatalf("the second PUT again: status %d, want %d (replayed)", st, statusReplayed)
		}
		if _, err := reader.Get([]byte("k")); !errors.Is(err, ErrNotFound) {
			t.Fatalf("after a replayed PUT of a deleted key: %v, want ErrNotFound", err)
		}
		if n := s.Puts.Load(); n != 2 {
			t.Errorf("the server applied %d PUTs, want 2", n)
		}
	})
}

// TestReplayedCompletionRefused: over shm0 a client's process writes the
// completion of its Send into the server's CQ, and can write its last one
// again while its request is still in the receive buffer. A replayed
// DELETE does not delete the value another client stored since, and is
// answered as a replay; a completion of a receive the connection never
// posted is ignored.
func TestReplayedCompletionRefused(t *testing.T) {
	a := addrs()["loop"]()
	s := startServer(t, a, small())
	r := rawDial(t, a)
	if st := r.rpc(t, rawRequest(opPut, 2, []byte("k"), []byte("a"))).status(); st != statusOK {
		t.Fatalf("PUT: status %d", st)
	}
	del := rawRequest(opDel, 3, []byte("k"), nil)
	if st := r.rpc(t, del).status(); st != statusOK {
		t.Fatalf("DELETE: status %d", st)
	}
	other := dial(t, a)
	if err := other.Put([]byte("k"), []byte("b")); err != nil {
		t.Fatal(err)
	}

	// The raw client's connection: the one its request named its QP in.
	s.mu.Lock()
	var sc *serverConn
	var qpn uint32
	for n, c := range s.conns {
		if c.hello != nil && binary.LittleEndian.Uint32(c.hello[8:]) == r.qp.Num() {
			sc, qpn = c, n
		}
	}
	wrid, depth := -1, 0
	if sc != nil {
		depth = len(sc.recvs)
		for i, b := range sc.recvs {
			if q := request(b[:len(del)]); q.valid() && q.id() == 3 && q.op() == opDel {
				wrid = i
			}
		}
	}
	s.mu.Unlock()
	if wrid < 0 {
		t.Fatal("no receive buffer of the raw client's connection holds the DELETE")
	}
	s.serve(verbs.WorkCompletion{WRID: uint64(wrid), Status: verbs.WCSuccess, Opcode: verbs.WCRecv, QPNum: qpn, ByteLen: uint32(len(del))})
	if st := r.awaitReply(t).status(); st != statusReplayed {
		t.Fatalf("the replayed DELETE: status %d, want %d (replayed)", st, statusReplayed)
	}
	s.serve(verbs.WorkCompletion{WRID: uint64(depth), Status: verbs.WCSuccess, Opcode: verbs.WCRecv, QPNum: qpn, ByteLen: uint32(len(del))})
	if v, err := other.Get([]byte("k")); err != nil || string(v) != "b" {
		t.Fatalf("after the replayed DELETE the value is %q, %v; want the other client's", v, err)
	}
	if n := s.Dels.Load(); n != 1 {
		t.Errorf("the server applied %d DELETEs, want 1", n)
	}
}
