package rlog

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/goverbs/goverbs/verbs"
)

// A connection that has not proved membership cannot RDMA-Write a
// replica's live replication ring, even with the ring's address and rkey
// (which an eavesdropper reads from the replicate answer on tcp0): the
// QP of an unproven link refuses every remote operation.
func TestUnprovenLinkCannotWriteLiveRing(t *testing.T) {
	for _, scheme := range []string{"loop", "tcp", "shm"} {
		t.Run(scheme, func(t *testing.T) { testUnprovenLinkCannotWriteLiveRing(t, scheme) })
	}
}

func testUnprovenLinkCannotWriteLiveRing(t *testing.T, scheme string) {
	for _, tc := range []struct {
		name string
		req  func() connMsg
	}{
		{"fence", func() connMsg {
			f := newConnMsg(kindFence)
			f.setEpoch(7)
			return f
		}},
		{"replicate", func() connMsg {
			f := newConnMsg(kindReplicate)
			f.setEpoch(7)
			f.setBuffers(2)
			f.setBufSize(16 << 10)
			f.setMode(ModeWrite)
			return f
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, scheme, 3, smallConfig())
			rep := c.start(1, false)
			addr := c.addrs[1]
			p := newRawPeer(t, addr)
			req := newConnMsg(kindReplicate)
			req.setEpoch(1)
			req.setMember(99)
			req.setCluster(clusterID(c.addrs))
			req.setBuffers(2)
			req.setBufSize(16 << 10)
			req.setMode(ModeWrite)
			r := p.dialMember(addr, 1, 0, testSecret, req, 0, 0)
			if r.status() != codeOK {
				t.Fatalf("replicate refused: %d", r.status())
			}
			if h := p.until(msgHello); h == nil {
				t.Fatal("no HELLO")
			}
			ring := r.ring()

			in := newRawPeer(t, addr)
			f := tc.req()
			f.setMember(98)
			f.setCluster(clusterID(c.addrs))
			f.setIndex(2)
			newNonce(f.nonce())
			if _, err := in.dial(addr, f); err != nil {
				t.Fatalf("intruder dial: %v", err)
			}
			marker := []byte("INTRUDER-WAS-HERE")
			n := copy(in.send.Bytes()[1<<16:], marker)
			if _, err := in.qp.PostSend([]verbs.SendWR{{WRID: 5, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
				SGList: []verbs.SGE{in.send.SGE(1<<16, n)}, RemoteAddr: ring.addr, RKey: ring.rkey}}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			wc := make([]verbs.WorkCompletion, 1)
			for {
				k, err := in.cq.Wait(ctx, wc)
				if err != nil {
					t.Fatal(err)
				}
				if k == 1 && wc[0].WRID == 5 {
					break
				}
			}
			if wc[0].Status == verbs.WCSuccess {
				t.Errorf("an unproven %s connection's RDMA Write to the live ring succeeded", tc.name)
			}
			rep.mu.Lock()
			rr := rep.recv
			rep.mu.Unlock()
			if rr == nil {
				t.Fatal("the replica's replicate session ended")
			}
			if bytes.Contains(rr.ringMR.Bytes(), marker) {
				t.Errorf("an unproven %s connection wrote the replica's live replication ring", tc.name)
			}
		})
	}
}
