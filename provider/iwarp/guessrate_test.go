package iwarp_test

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/internal/keytab"
	"github.com/goverbs/goverbs/verbs"
)

// guessTarget is a tcp0 server with one live region granting every remote
// right; it accepts every connection on its own QP.
type guessTarget struct {
	pd     *verbs.PD
	cq     *verbs.CQ
	target *verbs.MR
	l      *cm.Listener
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []*cm.Conn
}

func startGuessTarget(t *testing.T, cfg cm.ListenConfig) *guessTarget {
	t.Helper()
	ctx, err := verbs.Open("tcp0")
	if err != nil {
		t.Fatal(err)
	}
	v := &guessTarget{}
	t.Cleanup(func() { ctx.Close() })
	if v.pd, err = ctx.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if v.cq, err = ctx.CreateCQ(256); err != nil {
		t.Fatal(err)
	}
	if v.target, err = v.pd.AllocMR(4096, verbs.AccessLocalWrite|verbs.RemoteAccess); err != nil {
		t.Fatal(err)
	}
	if v.l, err = cm.ListenWith("tcp://127.0.0.1:0", cfg); err != nil {
		t.Fatal(err)
	}
	v.wg.Add(1)
	go v.serve()
	t.Cleanup(func() {
		v.l.Close()
		v.wg.Wait()
		v.mu.Lock()
		for _, c := range v.conns {
			c.Close()
			c.QP().Destroy()
		}
		v.mu.Unlock()
	})
	return v
}

func (v *guessTarget) serve() {
	defer v.wg.Done()
	for {
		req, err := v.l.Accept(context.Background())
		if err != nil {
			return
		}
		qp, err := v.pd.CreateQP(verbs.QPInitAttr{SendCQ: v.cq, RecvCQ: v.cq,
			Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			req.Reject(nil)
			continue
		}
		c, err := req.Accept(qp, nil)
		if err != nil {
			qp.Destroy()
			continue
		}
		v.mu.Lock()
		// Only the last few are kept open; the guessTarget's CQ is drained
		// of their flushes by nobody, and needs no room for them.
		v.conns = append(v.conns, c)
		if len(v.conns) > 8 {
			v.conns[0].Close()
			v.conns[0].QP().Destroy()
			v.conns = v.conns[1:]
		}
		v.mu.Unlock()
	}
}

// guesser attacks a guessTarget's region: each guess is a connection and an
// RDMA Write with the region's slot and a wrong random part.
type guesser struct {
	pd    *verbs.PD
	cq    *verbs.CQ
	local *verbs.MR
	addr  string
	rkey  uint32 // the target's, for the slot; the guesses differ in the rest
	raddr uint64
}

func newGuesser(t *testing.T, v *guessTarget) *guesser {
	t.Helper()
	ctx, err := verbs.Open("tcp0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Close() })
	g := &guesser{addr: v.l.Addr(), rkey: v.target.RKey(), raddr: v.target.Addr()}
	if g.pd, err = ctx.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if g.cq, err = ctx.CreateCQ(64); err != nil {
		t.Fatal(err)
	}
	if g.local, err = g.pd.AllocMR(64, verbs.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	return g
}

// guess makes guess number i: nil if the Write failed with a remote
// access error, as a wrong key must; errRefused if the listener would
// not connect.
func (g *guesser) guess(t *testing.T, i uint32) error {
	qp, err := g.pd.CreateQP(verbs.QPInitAttr{SendCQ: g.cq, RecvCQ: g.cq,
		Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer qp.Destroy()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := cm.Dial(ctx, g.addr, qp, nil)
	if err != nil {
		return errRefused
	}
	defer c.Close()
	// A key that differs from the real one in a few bits.
	wrong := uint32(i+1)<<8 ^ g.rkey
	if _, err := qp.PostSend([]verbs.SendWR{{Opcode: verbs.OpRDMAWrite, Flags: verbs.SendSignaled, RKey: wrong, RemoteAddr: g.raddr,
		SGList: []verbs.SGE{{Addr: g.local.Addr(), Length: 8, LKey: g.local.LKey()}}}}); err != nil {
		t.Fatal(err)
	}
	wc := make([]verbs.WorkCompletion, 1)
	if _, err := g.cq.Wait(ctx, wc); err != nil {
		t.Fatalf("guess %d: no completion: %v", i, err)
	}
	// The responder's Terminate fails the Write (WCRemAccessErr), or,
	// if it arrives after the requester has moved on, flushes it.
	if wc[0].Status != verbs.WCRemAccessErr && wc[0].Status != verbs.WCWRFlushErr {
		t.Fatalf("guess %d with rkey %#x: status %v, want a remote access error", i, wrong, wc[0].Status)
	}
	return nil
}

var errRefused = errors.New("refused")

// expectedHours is the expected time to find one region's key with r
// guesses a second: half the key space of a region.
func expectedHours(r float64) float64 { return math.Exp2(keytab.KeyBits-1) / r / 3600 }

// TestGuessRate measures, against a live region on tcp0, how fast a peer
// can try keys when nothing stops it, and
// checks that with the default ListenConfig it is refused after
// peerguard's strikes. It reports the rates and the expected time to find
// the key either way (the back-off's figure follows from its defaults:
// after the first hour, Strikes guesses per MaxBackoff).
func TestGuessRate(t *testing.T) {
	const guesses = 60
	t.Run("Unguarded", func(t *testing.T) {
		v := startGuessTarget(t, cm.ListenConfig{Strikes: math.MaxInt32})
		g := newGuesser(t, v)
		start := time.Now()
		for i := range uint32(guesses) {
			if err := g.guess(t, i); err != nil {
				t.Fatalf("guess %d: %v with no guard", i, err)
			}
		}
		rate := guesses / time.Since(start).Seconds()
		t.Logf("no back-off: %.0f guesses/s; expected time to find a key of %d random bits: %.1f h", rate, keytab.KeyBits, expectedHours(rate))
	})
	t.Run("Default", func(t *testing.T) {
		v := startGuessTarget(t, cm.ListenConfig{})
		g := newGuesser(t, v)
		const strikes = 4 // peerguard.DefaultStrikes
		for i := range uint32(strikes) {
			if err := g.guess(t, i); err != nil {
				t.Fatalf("guess %d of the first %d: %v", i, strikes, err)
			}
		}
		refused, start := 0, time.Now()
		for i := range uint32(20) {
			if err := g.guess(t, strikes+i); err == errRefused {
				refused++
			}
		}
		if refused == 0 {
			t.Fatalf("after %d failed guesses none of 20 more connections was refused", strikes)
		}
		// Refusals take no key check: the rate that matters is the
		// guesses let through, Strikes per back-off period.
		perHour := float64(strikes) / 1 // MaxBackoff of 1 h, reached after 12 refusals
		t.Logf("default back-off: %d of 20 dials refused in %v after %d guesses; at the 1 h ceiling %.0f guesses/h; "+
			"expected time to find a key: %.0f years", refused, time.Since(start).Round(time.Millisecond), strikes, perHour,
			math.Exp2(keytab.KeyBits-1)/perHour/24/365)
	})
}
