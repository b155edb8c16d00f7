package shm

import (
	"bytes"
	"testing"

	"github.com/goverbs/goverbs/internal/keytab"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/driver"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// TestFastPathRechecksWhatItKept: once WRs have taken postFast's road and
// it keeps their keys' resolution (fastPath), a WR with the same keys
// still fails, touching nothing, when anything that resolution assumed
// changed since: the peer QP's state, generation, rights, PD or
// responder depth (changed through Modify, or written into its header as
// qp.publish writes it, the grants' versions moved on), the remote key's
// slot rewritten, either region deregistered, or a span beyond either
// region.
func TestFastPathRechecksWhatItKept(t *testing.T) {
	const size = 64
	for _, tc := range []struct {
		name   string
		op     verbs.Opcode
		change func(t *testing.T, p *verbstest.Pair, src, tgt verbstest.Region) (local verbs.SGE, off int)
		want   verbs.WCStatus
	}{
		{"peer QP in Reset", verbs.OpRDMAWrite, func(t *testing.T, p *verbstest.Pair, src, tgt verbstest.Region) (verbs.SGE, int) {
			peerPublishes(t, p, func(h *ringHeader) { h.state.Store(uint32(driver.QPSReset)) })
			return src.SGE(0, 8), 0
		}, verbs.WCWRFlushErr},
		{"peer QP reset since", verbs.OpRDMAWrite, func(t *testing.T, p *verbstest.Pair, src, tgt verbstest.Region) (verbs.SGE, int) {
			peerPublishes(t, p, func(h *ringHeader) { h.gen.Add(1) })
			return src.SGE(0, 8), 0
		}, verbs.WCWRFlushErr},
		{"peer QP moved to the error state", verbs.OpRDMAWrite, func(t *testing.T, p *verbstest.Pair, src, tgt verbstest.Region) (verbs.SGE, int) {
			if err := p.B.(*verbstest.Local).QPs[0].Modify(&verbs.QPAttr{State: verbs.QPSErr}, verbs.QPAttrState); err != nil {
				t.Fatal(err)
			}
			return src.SGE(0, 8), 0
		}, verbs.WCWRFlushErr},
		{"peer QP without remote writes", verbs.OpRDMAWrite, func(t *testing.T, p *verbstest.Pair, src, tgt verbstest.Region) (verbs.SGE, int) {
			if err := p.B.(*verbstest.Local).QPs[0].Modify(&verbs.QPAttr{AccessFlags: verbs.AccessLocalWrite | verbs.AccessRemoteRead}, verbs.QPAttrAccessFlags); err != nil {
				t.Fatal(err)
			}
			return src.SGE(0, 8), 0
		}, verbs.WCRemAccessErr},
		{"peer QP's PD changed", verbs.OpRDMAWrite, func(t *testing.T, p *verbstest.Pair, src, tgt verbstest.Region) (verbs.SGE, int) {
			peerPublishes(t, p, func(h *ringHeader) { h.pd.Add(1) })
			return src.SGE(0, 8), 0
		}, verbs.WCRemAccessErr},
		{"peer QP without responder depth", verbs.OpRDMARead, func(t *testing.T, p *verbstest.Pair, src, tgt verbstest.Region) (verbs.SGE, int) {
			peerPublishes(t, p, func(h *ringHeader) { h.attrs.And(^uint32(0xff00)) })
			return src.SGE(0, 8), 0
		}, verbs.WCRemInvReqErr},
		{"remote region deregistered", verbs.OpRDMAWrite, func(t *testing.T, p *verbstest.Pair, src, tgt verbstest.Region) (verbs.SGE, int) {
			if err := p.B.DeregRegion(tgt.ID); err != nil {
				t.Fatal(err)
			}
			return src.SGE(0, 8), 0
		}, verbs.WCRemAccessErr},
		{"remote key's slot rewritten", verbs.OpRDMAWrite, func(t *testing.T, p *verbstest.Pair, src, tgt verbstest.Region) (verbs.SGE, int) {
			// The peer rewrites the key's slot in its grant table with
			// no remote write right (its version moves on) and says
			// nothing: the slot's version alone tells.
			b := driverQP(p.B.(*verbstest.Local).QPs[0])
			b.grantMu.Lock()
			defer b.grantMu.Unlock()
			k, ok := b.grants.lookup(tgt.RKey)
			if !ok {
				t.Fatal("the target's key is not in B's grant table")
			}
			k.access &^= driver.AccessRemoteWrite
			b.grants.publish(keytab.Index(tgt.RKey), k)
			return src.SGE(0, 8), 0
		}, verbs.WCRemAccessErr},
		{"local region deregistered", verbs.OpRDMAWrite, func(t *testing.T, p *verbstest.Pair, src, tgt verbstest.Region) (verbs.SGE, int) {
			if err := p.A.DeregRegion(src.ID); err != nil {
				t.Fatal(err)
			}
			return src.SGE(0, 8), 0
		}, verbs.WCLocProtErr},
		{"beyond the remote region", verbs.OpRDMAWrite, func(t *testing.T, p *verbstest.Pair, src, tgt verbstest.Region) (verbs.SGE, int) {
			return src.SGE(0, 8), size - 4
		}, verbs.WCRemAccessErr},
		{"beyond the local region", verbs.OpRDMAWrite, func(t *testing.T, p *verbstest.Pair, src, tgt verbstest.Region) (verbs.SGE, int) {
			return src.SGE(size-4, 8), 0
		}, verbs.WCLocProtErr},
		{"remote atomic misaligned", verbs.OpAtomicFetchAndAdd, func(t *testing.T, p *verbstest.Pair, src, tgt verbstest.Region) (verbs.SGE, int) {
			return src.SGE(0, 8), 4
		}, verbs.WCRemInvReqErr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := localHarness().NewPair(t, verbstest.PairOptions{})
			src := newRegion(t, p.A, size, verbs.AccessLocalWrite)
			tgt := newRegion(t, p.B, size, verbs.AccessLocalWrite|verbs.RemoteAccess)
			fill(t, p.A, src, 0, pattern(1, size))
			fill(t, p.B, tgt, 0, pattern(2, size))
			warmFastPath(t, p, tc.op, src, tgt, 1)
			before, local := contents(t, p.B, tgt, 0, size), contents(t, p.A, src, 0, size)
			sge, off := tc.change(t, p, src, tgt)
			fill(t, p.A, src, 0, pattern(3, size))
			local = contents(t, p.A, src, 0, size)
			postSend(t, p.A, 0, atomicWR(9, tc.op, sge, tgt, off, 1, 0))
			expectWC(t, waitWCs(t, p.A, verbstest.SendCQ, 1)[0], 9, tc.want)
			if tc.name != "remote region deregistered" {
				if after := contents(t, p.B, tgt, 0, size); !bytes.Equal(after, before) {
					t.Errorf("the failed WR changed the remote region: %x, was %x", after, before)
				}
				expectCanaries(t, p.B, tgt)
			}
			if tc.name != "local region deregistered" {
				if after := contents(t, p.A, src, 0, size); !bytes.Equal(after, local) {
					t.Errorf("the failed WR changed the local region: %x, was %x", after, local)
				}
				expectCanaries(t, p.A, src)
			}
		})
	}
}

// peerPublishes applies change to the header of B's QP as A's connection
// maps it, and moves the versions of B's grants on, as B's qp.publish
// does when it writes its header.
func peerPublishes(t *testing.T, p *verbstest.Pair, change func(*ringHeader)) {
	t.Helper()
	change(peerHeader(t, p))
	b := driverQP(p.B.(*verbstest.Local).QPs[0])
	b.grantMu.Lock()
	b.grants.touch()
	b.grantMu.Unlock()
}

// peerHeader is the header of B's QP as A's connection maps it, which a
// peer writes.
func peerHeader(t *testing.T, p *verbstest.Pair) *ringHeader {
	q := driverQP(p.A.QPs[0])
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.conn == nil {
		t.Fatal("A's QP has no connection")
	}
	return q.conn.peerHdr
}

// warmFastPath posts signaled WRs of op on QP 0 of p, from the first
// three words of src to those of tgt in turn (atomics add or compare
// cmpAdd): the first resolves the keys, the second fills the fastPath,
// the third takes it. The peer's segments, sent as its regions are
// registered, may arrive after the second, and their mapping forgets
// the fastPath: it goes on, up to twelve WRs, until the fastPath keeps
// the keys. It fails the test unless each succeeds and the fastPath
// keeps them.
func warmFastPath(t *testing.T, p *verbstest.Pair, op verbs.Opcode, src, tgt verbstest.Region, cmpAdd uint64) {
	t.Helper()
	for i := 0; i < 3 || i < 12 && !fastPathKept(p, op); i++ {
		w := 8 * (i % 3)
		postSend(t, p.A, 0, atomicWR(uint64(i), op, src.SGE(w, 8), tgt, w, cmpAdd, 0))
		expectWC(t, waitWCs(t, p.A, verbstest.SendCQ, 1)[0], uint64(i), verbs.WCSuccess)
	}
	if !fastPathKept(p, op) {
		t.Fatal("postFast keeps nothing of the WRs' keys: the test tests nothing")
	}
}

// fastPathKept reports whether A's QP keeps a fastPath for op.

func fastPathKept(p *verbstest.Pair, op verbs.Opcode) bool {
	q := driverQP(p.A.QPs[0])
	q.mu.Lock()
	defer q.mu.Unlock()
	// What postPath reads: the QP's pointer to its connection's hot part.
	return q.conn != nil && q.hot == q.conn.hot && q.hot.fast[op].mr != nil
}

// TestPeerQPMovesMoveTheKeptEpoch: every move of B's QP that changes
// its shared header — to the error state, to SQD, to Reset, a change of
// its rights, its destruction — moves on B's grant epoch word from the
// value A's fastPath kept, so that A's next WR checks B's QP again
// (postPath reads the epoch, not the header).
func TestPeerQPMovesMoveTheKeptEpoch(t *testing.T) {
	for _, tc := range []struct {
		name string
		move func(q *verbs.QP) error
	}{
		{"error state", func(q *verbs.QP) error { return q.Modify(&verbs.QPAttr{State: verbs.QPSErr}, verbs.QPAttrState) }},
		{"SQD", func(q *verbs.QP) error { return q.Modify(&verbs.QPAttr{State: verbs.QPSSQD}, verbs.QPAttrState) }},
		{"Reset", func(q *verbs.QP) error { return q.Modify(&verbs.QPAttr{State: verbs.QPSReset}, verbs.QPAttrState) }},
		{"rights", func(q *verbs.QP) error {
			return q.Modify(&verbs.QPAttr{AccessFlags: verbs.AccessLocalWrite | verbs.RemoteAccess&^verbs.AccessRemoteAtomic}, verbs.QPAttrAccessFlags)
		}},
		{"destroyed", func(q *verbs.QP) error { return q.Destroy() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := localHarness().NewPair(t, verbstest.PairOptions{})
			src := newRegion(t, p.A, 64, verbs.AccessLocalWrite)
			tgt := newRegion(t, p.B, 64, verbs.AccessLocalWrite|verbs.RemoteAccess)
			warmFastPath(t, p, verbs.OpRDMAWrite, src, tgt, 0)
			a := driverQP(p.A.QPs[0])
			a.mu.Lock()
			fp := a.hot.fast[verbs.OpRDMAWrite]
			a.mu.Unlock()
			// B's epoch word for the connection, held so that it outlives
			// the connection.
			bq := p.B.(*verbstest.Local).QPs[0]
			b := driverQP(bq)
			b.grantMu.Lock()
			epoch := b.grantEpoch
			b.grantMu.Unlock()
			if epoch == nil {
				t.Fatal("B's grant table moves no epoch word")
			}
			epoch.hold()
			defer epoch.release()
			if epoch.word().Load() != fp.epoch {
				t.Fatal("the epoch moved before B's QP did")
			}
			if err := tc.move(bq); err != nil {
				t.Fatal(err)
			}
			if epoch.word().Load() == fp.epoch {
				t.Error("B's QP moved, and the epoch A's fastPath kept did not: A's next WR would not check B's QP again")
			}
		})
	}
}
