package kv

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// rawClient is a hostile client: a QP connected to the server as a kv
// client's is, which posts whatever it likes.
type rawClient struct {
	ctx  *verbs.Context
	cq   *verbs.CQ
	qp   *verbs.QP
	conn *cm.Conn
	info indexInfo
	mr   *verbs.MR
	// g is the grant of keys the server answered rawDial's first
	// request with.
	g grant
}

// rawDial dials as a kv client does, and asks for its grant of keys
// (request id 1).
func rawDial(t *testing.T, a string) *rawClient {
	t.Helper()
	r := rawDialWith(t, a, func(qpn uint32) []byte { return encodeHello(qpn, nil) })
	// Sent as WR 98, whose completion post and attack pass over.
	n := copy(r.mr.Bytes(), rawRequest(opGrant, 1, nil, nil))
	if _, err := r.qp.PostSend([]verbs.SendWR{{WRID: 98, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{r.mr.SGE(0, n)}}}); err != nil {
		t.Fatalf("post the grant request: %v", err)
	}
	rep := r.awaitReply(t)
	if rep.status() != statusOK || !grant(rep.val()).valid() {
		t.Fatalf("the grant: status %d, %x", rep.status(), rep.val())
	}
	r.g = append(grant(nil), rep.val()...)
	return r
}

// rawDialWith connects as rawDial does, with the connection request that
// hello lays out for the raw client's QP qpn, and asks for no grant.
func rawDialWith(t *testing.T, a string, hello func(qpn uint32) []byte) *rawClient {
	t.Helper()
	dev, err := cm.Device(a)
	if err != nil {
		t.Fatal(err)
	}
	r := &rawClient{}
	if r.ctx, err = verbs.Open(dev); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.ctx.Close() })
	pd, err := r.ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	if r.cq, err = r.ctx.CreateCQ(16); err != nil {
		t.Fatal(err)
	}
	if r.mr, err = pd.AllocMR(1<<20, verbs.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	ep, err := cm.NewEndpoint(pd, verbs.QPInitAttr{SendCQ: r.cq, RecvCQ: r.cq,
		Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	r.qp = ep.QP()
	if _, err := r.qp.PostRecv([]verbs.RecvWR{{WRID: 99, SGList: []verbs.SGE{r.mr.SGE(1<<19, 1<<19)}}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if r.conn, err = cm.Dial(ctx, a, r.qp, &cm.Param{PrivateData: hello(r.qp.Num())}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.conn.Close() })
	if r.info, _, err = decodeInfo(r.conn.PrivateData()); err != nil {
		t.Fatal(err)
	}
	return r
}

// post posts wr, signaled, and returns its completion (the receive's, for
// a Send that is answered).
func (r *rawClient) post(t *testing.T, wr verbs.SendWR) verbs.WorkCompletion {
	t.Helper()
	wr.WRID, wr.Flags = 1, wr.Flags|verbs.SendSignaled
	if _, err := r.qp.PostSend([]verbs.SendWR{wr}); err != nil {
		t.Fatalf("post %v: %v", wr.Opcode, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // a hang guard
	defer cancel()
	wcs := make([]verbs.WorkCompletion, 4)
	for {
		n, err := r.cq.Wait(ctx, wcs)
		if err != nil {
			t.Fatalf("no completion for %v: %v", wr.Opcode, err)
		}
		for _, wc := range wcs[:n] {
			if wc.WRID == wr.WRID || wc.Status != verbs.WCSuccess {
				return wc
			}
		}
	}
}

// attack posts wr and then a Read of the index at baddr, which a client
// may make, and returns the first error status of the two, or WCSuccess.
// The Read is there for the Writes and Sends whose requester completes
// them before the responder has judged them (iWARP's): the responder's
// refusal ends the connection, and the Read with it.
func (r *rawClient) attack(t *testing.T, wr verbs.SendWR, baddr uint64) verbs.WCStatus {
	t.Helper()
	wr.WRID, wr.Flags = 1, wr.Flags|verbs.SendSignaled
	read := verbs.SendWR{WRID: 2, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{r.mr.SGE(1<<18, 8)}, RemoteAddr: baddr, RKey: r.g.indexKey()}
	if _, err := r.qp.PostSend([]verbs.SendWR{wr, read}); err != nil {
		t.Fatalf("post %v: %v", wr.Opcode, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second) // a hang guard
	defer cancel()
	wcs := make([]verbs.WorkCompletion, 4)
	for done := 0; done < 2; {
		n, err := r.cq.Wait(ctx, wcs)
		if err != nil {
			t.Fatalf("no completion for %v: %v", wr.Opcode, err)
		}
		for _, wc := range wcs[:n] {
			if wc.Status != verbs.WCSuccess {
				return wc.Status
			}
			if wc.WRID == 1 || wc.WRID == 2 {
				done++
			}
		}
	}
	return verbs.WCSuccess
}

// TestClientReachesOnlyWhatItIsGiven: a hostile client that writes, or
// applies atomics to, the index, a value record, another client's
// receive buffers (with their exact key and address) or its own, or
// sends more than a receive buffer holds, gets an error completion; an
// honest client's requests, made all along, are intact, and the server
// goes on serving.
func TestClientReachesOnlyWhatItIsGiven(t *testing.T) {
	for _, name := range []string{"shm", "iwarp"} {
		t.Run(name, func(t *testing.T) {
			a := addrs()[name]()
			// Every attack below fails a remote access; the listener's
			// back-off (which the providers test) would refuse the
			// attacker's later connections, and this test is of what
			// each attack reaches.
			cfg := small()
			cfg.Listen.Strikes = 1000
			s := startServer(t, a, cfg)
			honest := dial(t, a)
			big := bytes.Repeat([]byte("B"), 1000)
			if err := honest.Put([]byte("big"), big); err != nil {
				t.Fatal(err)
			}
			s.mu.Lock()
			var victim *verbs.MR // the honest client's receive buffers
			for _, sc := range s.conns {
				victim = sc.recvMR
			}
			s.mu.Unlock()

			var stop atomic.Bool
			var wg sync.WaitGroup
			var honestErr error
			rounds := 0
			wg.Add(1)
			go func() {
				defer wg.Done()
				// At least 100 rounds, whenever the attacks end: some of
				// them overlap the attacks.
				for i := 0; !stop.Load() || i < 100; i++ {
					k, v := fmt.Appendf(nil, "k%d", i%8), fmt.Appendf(nil, "value %d %s", i, bytes.Repeat([]byte("x"), i%200))
					if err := honest.Put(k, v); err != nil {
						honestErr = fmt.Errorf("PUT %s: %w", k, err)
						return
					}
					if got, err := honest.Get(k); err != nil || !bytes.Equal(got, v) {
						honestErr = fmt.Errorf("GET %s = %q, %v; want %q", k, got, err, v)
						return
					}
					rounds++
				}
			}()

			junk := func(r *rawClient, n int) verbs.SGE {
				b := r.mr.Bytes()[:n]
				for i := range b {
					b[i] = 0xa5
				}
				return r.mr.SGE(0, n)
			}
			// The value record of "big", as a GET finds it: the client
			// may read it, and nothing else.
			r := rawDial(t, a)
			bsize := r.info.slotsPerBucket * SlotSize
			baddr := r.info.addr + (hashKey([]byte("big"))%uint64(r.info.buckets))*uint64(bsize)
			if wc := r.post(t, verbs.SendWR{Opcode: verbs.OpRDMARead, SGList: []verbs.SGE{r.mr.SGE(0, bsize)}, RemoteAddr: baddr, RKey: r.g.indexKey()}); wc.Status != verbs.WCSuccess {
				t.Fatalf("a Read of the index: %v", wc.Status)
			}
			var rec slot
			for i := 0; i < bsize; i += SlotSize {
				if x := slot(r.mr.Bytes()[i : i+SlotSize]); x.valid() && x.kind() == kindHeap && x.hash() == hashKey([]byte("big")) {
					rec = append(slot(nil), x...)
				}
			}
			if rec == nil {
				t.Fatal("the index has no record of \"big\"")
			}
			attacks := []struct {
				what string
				wr   func(r *rawClient) verbs.SendWR
			}{
				{"Write to the index", func(r *rawClient) verbs.SendWR {
					return verbs.SendWR{Opcode: verbs.OpRDMAWrite, SGList: []verbs.SGE{junk(r, bsize)}, RemoteAddr: baddr, RKey: r.g.indexKey()}
				}},
				{"FetchAndAdd on the index", func(r *rawClient) verbs.SendWR {
					return verbs.SendWR{Opcode: verbs.OpAtomicFetchAndAdd, SGList: []verbs.SGE{r.mr.SGE(0, 8)}, RemoteAddr: baddr, RKey: r.g.indexKey(), CompareAdd: 1}
				}},
				{"Write to a value record", func(r *rawClient) verbs.SendWR {
					return verbs.SendWR{Opcode: verbs.OpRDMAWrite, SGList: []verbs.SGE{junk(r, rec.recLen())}, RemoteAddr: rec.addr(), RKey: r.g.heapKey(rec.region())}
				}},
				{"Write to another client's receive buffers", func(r *rawClient) verbs.SendWR {
					return verbs.SendWR{Opcode: verbs.OpRDMAWrite, SGList: []verbs.SGE{junk(r, 256)}, RemoteAddr: victim.Addr(), RKey: victim.RKey()}
				}},
				{"Write to its own receive buffers", func(r *rawClient) verbs.SendWR {
					s.mu.Lock()
					var own *verbs.MR
					for _, sc := range s.conns {
						if sc.recvMR != victim {
							own = sc.recvMR
						}
					}
					s.mu.Unlock()
					return verbs.SendWR{Opcode: verbs.OpRDMAWrite, SGList: []verbs.SGE{junk(r, 256)}, RemoteAddr: own.Addr(), RKey: own.RKey()}
				}},
				{"Send larger than a receive buffer", func(r *rawClient) verbs.SendWR {
					return verbs.SendWR{Opcode: verbs.OpSend, SGList: []verbs.SGE{junk(r, r.info.maxMsg+1)}}
				}},
			}
			for i, at := range attacks {
				if i > 0 {
					r = rawDial(t, a) // the last attack's connection is broken
				}
				if st := r.attack(t, at.wr(r), baddr); st == verbs.WCSuccess {
					t.Errorf("%s: it succeeded", at.what)
				} else {
					t.Logf("%s: %v", at.what, st)
				}
			}
			// A malformed request is answered as one.
			r = rawDial(t, a)
			b := r.mr.Bytes()
			n := putRequest(b, opPut, 7, []byte("k0"), []byte("forged"))
			binary.LittleEndian.PutUint32(b[4:], 1000) // a value length that is not what was sent
			if wc := r.post(t, verbs.SendWR{Opcode: verbs.OpSend, SGList: []verbs.SGE{r.mr.SGE(0, n)}}); wc.Status != verbs.WCSuccess {
				t.Fatalf("a malformed request: %v", wc.Status)
			}

			stop.Store(true)
			wg.Wait()
			if honestErr != nil {
				t.Fatalf("the honest client, after %d rounds: %v", rounds, honestErr)
			}
			if got, err := honest.Get([]byte("big")); err != nil || !bytes.Equal(got, big) {
				t.Fatalf("after the attacks, \"big\" is %d bytes, %v", len(got), err)
			}
			if err := honest.Put([]byte("after"), []byte("the attacks")); err != nil {
				t.Fatalf("a PUT after the attacks: %v", err)
			}
		})
	}
}
