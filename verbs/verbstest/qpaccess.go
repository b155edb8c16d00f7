package verbstest

import (
	"testing"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// testQPAccessKept: a QP the user moved to Init with remote read but not
// remote write keeps exactly those rights once cm has connected it, on
// the accepting side and on the dialling side: a peer's Read of a region
// granting every right succeeds, its Write into that region fails with
// WCRemAccessErr, and the region is unchanged. Both ends are in this
// process (the in-process runs of every provider).
func testQPAccessKept(t *testing.T, h Harness) {
	if h.Remote != nil {
		t.Skip("both ends must be in this process, and the harness's address is for a remote B")
	}
	for _, victimAccepts := range []bool{true, false} {
		name := "Dial"
		if victimAccepts {
			name = "Accept"
		}
		t.Run(name, func(t *testing.T) {
			opts := PairOptions{}.Defaults()
			victim, err := NewLocal(h.Device, opts, false)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { victim.Close() })
			attacker, err := NewLocal(h.Device, opts, false)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { attacker.Close() })
			const granted = verbs.AccessLocalWrite | verbs.AccessRemoteRead
			if err := victim.QPs[0].Modify(&verbs.QPAttr{State: verbs.QPSInit, Port: 1, AccessFlags: granted},
				verbs.QPAttrState|verbs.QPAttrPort|verbs.QPAttrAccessFlags); err != nil {
				t.Fatalf("move the victim's QP to Init: %v", err)
			}
			if victimAccepts {
				connectLocal(t, h, victim, attacker, opts)
			} else {
				connectLocal(t, h, attacker, victim, opts)
			}
			if a, err := victim.QPs[0].Query(); err != nil || a.AccessFlags != granted {
				t.Fatalf("connected QP's access flags: %v (%v); want the %v it was given", a.AccessFlags, err, granted)
			}
			target := newRegion(t, victim, 64, remoteAll)
			fill(t, victim, target, 0, pattern(60, 64))
			local := newRegion(t, attacker, 64, localRW)
			wc := waitAfter(t, attacker, readWR(1, target, 0, local.SGE(0, 32)))
			expectStatus(t, wc, 1, verbs.WCSuccess)
			expectBytes(t, attacker, local, 0, pattern(60, 64)[:32], "bytes Read through a QP granting remote read")
			before := snap(t, victim, target, "region behind a QP without remote write")
			fill(t, attacker, local, 0, pattern(61, 64))
			wc = waitAfter(t, attacker, writeWR(2, target, 0, local.SGE(0, 32)))
			expectStatus(t, wc, 2, verbs.WCRemAccessErr)
			before.unchanged(t)
			expectCanaries(t, victim, target)
		})
	}
}

// waitAfter posts wr, signaled, on QP 0 of e and returns its completion.
func waitAfter(t testing.TB, e Endpoint, wr verbs.SendWR) verbs.WorkCompletion {
	t.Helper()
	wr.Flags |= verbs.SendSignaled
	postSend(t, e, 0, wr)
	return waitOne(t, e, SendCQ)
}

// connectLocal connects QP 0 of dialer to QP 0 of acceptor through cm at
// a fresh address of h, both in this process, leaving their QPs as they
// are (Reset or Init) for cm to move on.
func connectLocal(t testing.TB, h Harness, acceptor, dialer *Local, opts PairOptions) {
	t.Helper()
	addr := h.Addr(t)
	l, err := cm.Listen(addr)
	if err != nil {
		t.Fatalf("listen %s: %v", addr, err)
	}
	done := make(chan error, 1)
	go func() {
		defer l.Close()
		done <- acceptor.Accept(l, PairOptions{QPs: 1, RNRRetry: opts.RNRRetry, MinRNRTimer: opts.MinRNRTimer})
	}()
	if err := dialer.Dial(addr, opts); err != nil {
		l.Close()
		<-done
		t.Fatalf("dial %s: %v", addr, err)
	}
	if err := <-done; err != nil {
		t.Fatalf("accept: %v", err)
	}
}
