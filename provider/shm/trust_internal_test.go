package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/internal/keytab"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/driver"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// The child of TestListenerTrustsOwnUserOnly: it drops to the uid and
// gid in GOVERBS_SHM_SETUID, dials the address in GOVERBS_SHM_ADDR, and
// reports "accepted" or "rejected <error>".
func init() { childModes["setuid"] = setuidChild }

func setuidChild() int {
	id, err := strconv.Atoi(os.Getenv("GOVERBS_SHM_SETUID"))
	if err != nil {
		return childFail("bad uid: %v", err)
	}
	if err := becomeUser(id); err != nil {
		return childFail("%v", err)
	}
	ctx, err := verbs.Open(DeviceName)
	if err != nil {
		return childFail("open: %v", err)
	}
	defer ctx.Close()
	pd, _ := ctx.AllocPD()
	cq, _ := ctx.CreateCQ(16)
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return childFail("create QP: %v", err)
	}
	dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cm.Dial(dctx, os.Getenv("GOVERBS_SHM_ADDR"), qp, nil)
	if err != nil {
		say("rejected %v", err)
		return 0
	}
	say("accepted uid %d", os.Getuid())
	c.Close()
	return 0
}

// TestListenerTrustsOwnUserOnly: a process of another user (uid 65534)
// is rejected by a default listener, before the listener reads anything
// of its request, and accepted by one that names its uid in TrustUIDs.
func TestListenerTrustsOwnUserOnly(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to start a child of another user")
	}
	const nobody = 65534
	for _, trusted := range []bool{false, true} {
		name := "Default"
		cfg := cm.ListenConfig{}
		if trusted {
			name, cfg.TrustUIDs = "TrustUIDs", []uint32{nobody}
		}
		t.Run(name, func(t *testing.T) {
			addr := uniqueAddr("trust")
			l, err := cm.ListenWith(addr, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			accepted := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				req, err := l.Accept(ctx)
				if err != nil {
					accepted <- err
					return
				}
				_, _, qp := verbstest.QPOn(t, DeviceName, 4)
				c, err := req.Accept(qp, nil)
				if err == nil {
					defer c.Close()
					// Hold the connection until the child is done with it.
					<-c.Done()
				}
				accepted <- err
			}()
			ch := spawn(t, "setuid", "GOVERBS_SHM_SETUID="+strconv.Itoa(nobody), "GOVERBS_SHM_ADDR="+addr)
			if trusted {
				if got := ch.expect("accepted", 20*time.Second); got != "uid 65534" {
					t.Fatalf("child accepted as %q", got)
				}
				if err := <-accepted; err != nil {
					t.Fatalf("accept of a trusted uid: %v", err)
				}
			} else {
				got := ch.expect("rejected", 20*time.Second)
				t.Logf("the dial of uid %d: %s", nobody, got)
				l.Close()
				if err := <-accepted; err == nil {
					t.Fatal("the listener handed over a request of an untrusted uid")
				}
			}
			if err := ch.wait(20 * time.Second); err != nil {
				t.Fatalf("child: %v", err)
			}
		})
	}
}

// connectedPair connects two in-process endpoints, A dialling B, which
// listens with cfg; with access not 0, B's QP is moved to Init with
// those access flags first. It returns them with A's connection to B.
func connectedPair(t *testing.T, cfg cm.ListenConfig, access verbs.AccessFlags) (*verbstest.Local, *verbstest.Local, *conn) {
	t.Helper()
	opts := verbstest.PairOptions{}.Defaults()
	a, err := verbstest.NewLocal(DeviceName, opts, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	b, err := verbstest.NewLocal(DeviceName, opts, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	if access != 0 {
		if err := b.QPs[0].Modify(&verbs.QPAttr{State: verbs.QPSInit, Port: 1, AccessFlags: access},
			verbs.QPAttrState|verbs.QPAttrPort|verbs.QPAttrAccessFlags); err != nil {
			t.Fatal(err)
		}
	}
	addr := uniqueAddr("pair")
	l, err := cm.ListenWith(addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		defer l.Close()
		done <- b.Accept(l, opts)
	}()
	if err := a.Dial(addr, opts); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return a, b, connOf(driverQP(a.QPs[0]))
}

// keysIn returns every key a slot of the mapped table mem names, read as
// a hostile peer would: straight from the bytes.
func keysIn(mem []byte) map[uint32]bool {
	out := map[uint32]bool{}
	for i := range maxKeys {
		s := mem[i*keySlotSize:]
		if key, kind := binary.NativeEndian.Uint32(s[4:]), binary.NativeEndian.Uint32(s[12:]); kind != kindNone {
			out[key] = true
		}
	}
	return out
}

// TestGrantTableHoldsOnlyReachableKeys: what a peer maps of this
// process's keys is its QP's grant table, which holds the keys of the
// regions of the QP's PD it may reach and no other: not a local-only
// region's key, not the key of a region of another PD. Asking for those
// fails and does not add them, and a Dereg takes a key out.
func TestGrantTableHoldsOnlyReachableKeys(t *testing.T) {
	a, b, c := connectedPair(t, cm.ListenConfig{}, 0)
	given, _ := b.NewRegion(64, verbs.AccessLocalWrite|verbs.RemoteAccess)
	private, _ := b.NewRegion(64, verbs.AccessLocalWrite)
	otherPD, err := b.Ctx.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	other, err := otherPD.AllocMR(64, verbs.AccessLocalWrite|verbs.RemoteAccess)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Dereg()
	keys := keysIn(c.keySeg.mem)
	if !keys[given.RKey] {
		t.Fatalf("the peer's table lacks the key %#x of a region it may reach: %v", given.RKey, keys)
	}
	for what, k := range map[string]uint32{"a local-only region": private.LKey, "a region of another PD": other.RKey()} {
		if keys[k] {
			t.Fatalf("the peer's table names the key of %s", what)
		}
	}
	local, _ := a.NewRegion(64, verbs.AccessLocalWrite)
	if _, err := a.PostSend(0, []verbs.SendWR{{WRID: 1, Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled,
		RKey: other.RKey(), RemoteAddr: other.Addr(), SGList: []verbs.SGE{local.SGE(0, 8)}}}); err != nil {
		t.Fatal(err)
	}
	wcs, err := a.Completions(verbstest.SendCQ, 1, 10*time.Second)
	if err != nil || len(wcs) != 1 || wcs[0].Status == verbs.WCSuccess {
		t.Fatalf("a Write with the key of another PD's region: %v %v", wcs, err)
	}
	if keysIn(c.keySeg.mem)[other.RKey()] {
		t.Fatal("a refused key was written into the peer's table")
	}
	if err := b.DeregRegion(given.ID); err != nil {
		t.Fatal(err)
	}
	if keysIn(c.keySeg.mem)[given.RKey] {
		t.Fatal("a deregistered key is still in the peer's table")
	}
	if idx := keytab.Index(given.RKey); c.keys.slot(idx).kind.Load() != kindNone {
		t.Fatalf("slot %d still describes a region", idx)
	}
}

// TestRefusedKeysCutThePeerOff: a peer asking for keys it was not given
// is disconnected once it reaches the listener's Strikes, and its user's
// next Dial is rejected for the back-off period.
func TestRefusedKeysCutThePeerOff(t *testing.T) {
	cfg := cm.ListenConfig{Strikes: 2, Backoff: time.Hour}
	addr, target, apd, acq, local := guessTarget(t, cfg, 64)
	for i := range 2 {
		qp, err := smallQP(apd, acq)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := cm.Dial(ctx, addr, qp, nil)
		if err != nil {
			cancel()
			t.Fatalf("dial %d: %v", i, err)
		}
		qp.PostSend([]verbs.SendWR{{Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled, RKey: target.RKey() ^ 1<<20,
			RemoteAddr: target.Addr(), SGList: []verbs.SGE{{Addr: local.Addr(), Length: 8, LKey: local.LKey()}}}})
		wc := make([]verbs.WorkCompletion, 1)
		if _, err := acq.Wait(ctx, wc); err != nil || wc[0].Status == verbs.WCSuccess {
			t.Fatalf("guess %d: %v %v", i, wc[0].Status, err)
		}
		c.Close()
		qp.Destroy()
		cancel()
	}
	qp, err := smallQP(apd, acq)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = cm.Dial(ctx, addr, qp, nil)
	var rej *driver.RejectError
	if !errors.As(err, &rej) {
		t.Fatalf("dial after %d refused keys: %v; want a rejection", cfg.Strikes, err)
	}
}

// guessTarget listens at a fresh address with cfg, accepting every Dial
// with a fresh QP until the test ends, and registers there a target
// region of size bytes with every remote right; it returns the address
// and the target with the guesser's PD, CQ and a local buffer of 64
// bytes.
func guessTarget(t *testing.T, cfg cm.ListenConfig, size int) (string, *verbs.MR, *verbs.PD, *verbs.CQ, *verbs.MR) {
	t.Helper()
	addr := uniqueAddr("guess")
	l, err := cm.ListenWith(addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, bpd, bcq := openShm(t)
	served := acceptAll(l, bpd, bcq)
	t.Cleanup(func() { l.Close(); <-served })
	target, err := bpd.AllocMR(size, verbs.AccessLocalWrite|verbs.RemoteAccess)
	if err != nil {
		t.Fatal(err)
	}
	_, apd, acq := openShm(t)
	local, err := apd.AllocMR(64, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	return addr, target, apd, acq, local
}

// guessOnce connects a fresh QP of apd to addr and writes with rkey;
// false if the dial was refused. The Write must fail.
func guessOnce(t *testing.T, apd *verbs.PD, acq *verbs.CQ, local *verbs.MR, addr string, rkey uint32, raddr uint64) bool {
	t.Helper()
	qp, err := smallQP(apd, acq)
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Destroy()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cm.Dial(ctx, addr, qp, nil)
	if err != nil {
		return false
	}
	defer c.Close()
	if _, err := qp.PostSend([]verbs.SendWR{{Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled, RKey: rkey,
		RemoteAddr: raddr, SGList: []verbs.SGE{{Addr: local.Addr(), Length: 8, LKey: local.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	wc := make([]verbs.WorkCompletion, 1)
	if _, err := acq.Wait(ctx, wc); err != nil || wc[0].Status == verbs.WCSuccess {
		t.Fatalf("guess %#x: %v %v", rkey, wc[0].Status, err)
	}
	return true
}

// TestGuessRate measures how fast a peer can try keys of a live region on
// shm0 (the slot known, the 24 random bits guessed; each guess a refused
// key, so a new connection) with no back-off, and checks that the default
// ListenConfig refuses it after peerguard's strikes. It reports the rate
// and the expected time to find the key.
func TestGuessRate(t *testing.T) {
	for _, guarded := range []bool{false, true} {
		name, cfg := "Unguarded", cm.ListenConfig{Strikes: 1 << 30}
		if guarded {
			name, cfg = "Default", cm.ListenConfig{}
		}
		t.Run(name, func(t *testing.T) {
			addr, target, apd, acq, local := guessTarget(t, cfg, 4096)
			const n = 60
			start, made := time.Now(), 0
			for i := range uint32(n) {
				if guessOnce(t, apd, acq, local, addr, target.RKey()^(i+1)<<keytab.IndexBits, target.Addr()) {
					made++
				}
			}
			rate := float64(made) / time.Since(start).Seconds()
			if !guarded {
				if made != n {
					t.Fatalf("%d of %d guesses connected with no guard", made, n)
				}
				t.Logf("no back-off: %.0f guesses/s; expected time to find a key of %d random bits: %.1f h",
					rate, keytab.RandomBits, float64(uint64(1)<<(keytab.RandomBits-1))/rate/3600)
				return
			}
			if made >= n {
				t.Fatalf("all %d guesses connected with the default guard", n)
			}
			t.Logf("default back-off: %d of %d guesses connected, the rest rejected", made, n)
		})
	}
}

// TestReceiveBuffersOfOnePeerOnly: B posts the receives of its two QPs
// into two segments of one PD that grant no remote right. Each peer is
// handed, and can get, only the segment of its own QP's receives: asked
// for the other one, writable or not, B refuses, and the other's key is
// not in its grant table.
func TestReceiveBuffersOfOnePeerOnly(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{QPs: 2})
	b := p.B.(*verbstest.Local)
	var bufs [2]verbstest.Region
	var segIDs [2]uint32
	bctx := driverQP(b.QPs[0]).ctx
	for i := range bufs {
		mr, err := b.PD.AllocMR(256, verbs.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		defer mr.Dereg()
		bufs[i] = verbstest.Region{Addr: mr.Addr(), Len: 256, LKey: mr.LKey(), RKey: mr.RKey()}
		segIDs[i] = segmentOf(t, bctx, mr.LKey())
		postRecv(t, p.B, i, verbs.RecvWR{WRID: uint64(i), SGList: []verbs.SGE{bufs[i].SGE(0, 256)}})
	}
	src := newRegion(t, p.A, 64, verbs.AccessLocalWrite)
	for i := range bufs {
		postSend(t, p.A, i, send(uint64(10+i), src.SGE(0, 64)))
	}
	waitWCs(t, p.A, verbstest.SendCQ, 2)
	for i := range 2 {
		other := 1 - i
		aq := driverQP(p.A.QPs[i])
		c := connOf(aq)
		aq.mu.Lock()
		c.absorb()
		_, mine := c.segs[segIDs[i]]
		_, theirs := c.segs[segIDs[other]]
		aq.mu.Unlock()
		if !mine || theirs {
			t.Fatalf("peer %d maps its own receive segment: %v, the other peer's: %v", i, mine, theirs)
		}
		for _, write := range []bool{true, false} {
			aq.mu.Lock()
			_, got := c.segment(segIDs[other], write)
			c.endWait()
			aq.mu.Unlock()
			if got {
				t.Fatalf("peer %d was handed the other peer's receive segment (writable: %v)", i, write)
			}
		}
		if keysIn(c.keySeg.mem)[bufs[other].LKey] {
			t.Fatalf("peer %d's grant table names the other peer's receive buffer", i)
		}
	}
}
