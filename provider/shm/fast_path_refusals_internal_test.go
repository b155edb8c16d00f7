package shm

import (
	"bytes"
	"testing"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// TestFastPathTakesOnlyItsWRs: once WRs have taken postFast's road for
// an opcode, a WR of that opcode that differs from them in what postPath
// compares — another local or remote key whose addresses lie in the kept
// regions, the inline flag on a Read, more than one SGE, an atomic not 8 bytes long
// or misaligned — is not performed through the kept resolution: it fails
// as the long road fails it, touching nothing, or (more SGEs) is performed
// whole.
func TestFastPathTakesOnlyItsWRs(t *testing.T) {
	const size = 64
	type regions struct{ src, src2, tgt, tgt2 verbstest.Region }
	for _, tc := range []struct {
		name    string
		op      verbs.Opcode
		wr      func(r regions) verbs.SendWR
		postErr bool           // PostSend refuses the WR
		want    verbs.WCStatus // its completion's status, if posted
	}{
		{"another local key", verbs.OpRDMAWrite, func(r regions) verbs.SendWR {
			sge := r.src.SGE(0, 8)
			sge.LKey = r.src2.LKey
			return rdma(9, verbs.OpRDMAWrite, sge, r.tgt, 0)
		}, false, verbs.WCLocProtErr},
		{"another remote key", verbs.OpRDMAWrite, func(r regions) verbs.SendWR {
			wr := rdma(9, verbs.OpRDMAWrite, r.src.SGE(0, 8), r.tgt, 0)
			wr.RKey = r.tgt2.RKey
			return wr
		}, false, verbs.WCRemAccessErr},
		{"an inline Read", verbs.OpRDMARead, func(r regions) verbs.SendWR {
			wr := rdma(9, verbs.OpRDMARead, r.src.SGE(0, 8), r.tgt, 0)
			wr.Flags |= verbs.SendInline
			return wr
		}, true, 0},
		{"a fetch-and-add of 16 bytes", verbs.OpAtomicFetchAndAdd, func(r regions) verbs.SendWR {
			return atomicWR(9, verbs.OpAtomicFetchAndAdd, r.src.SGE(0, 16), r.tgt, 0, 1, 0)
		}, true, 0},
		{"a compare-and-swap misaligned", verbs.OpAtomicCmpAndSwp, func(r regions) verbs.SendWR {
			return atomicWR(9, verbs.OpAtomicCmpAndSwp, r.src.SGE(0, 8), r.tgt, 4, 0, 1)
		}, false, verbs.WCRemInvReqErr},
		{"two SGEs", verbs.OpRDMAWrite, func(r regions) verbs.SendWR {
			wr := rdma(9, verbs.OpRDMAWrite, r.src.SGE(0, 8), r.tgt, 0)
			wr.SGList = append(wr.SGList, r.src.SGE(32, 8))
			return wr
		}, false, verbs.WCSuccess},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := localHarness().NewPair(t, verbstest.PairOptions{})
			r := regions{
				src:  newRegion(t, p.A, size, verbs.AccessLocalWrite),
				src2: newRegion(t, p.A, size, verbs.AccessLocalWrite),
				tgt:  newRegion(t, p.B, size, verbs.AccessLocalWrite|verbs.RemoteAccess),
				tgt2: newRegion(t, p.B, size, verbs.AccessLocalWrite|verbs.RemoteAccess),
			}
			fill(t, p.B, r.tgt, 0, pattern(2, size))
			// A compare of 0 with the words' patterns swaps nothing.
			warmFastPath(t, p, tc.op, r.src, r.tgt, 0)
			fill(t, p.A, r.src, 0, pattern(3, size))
			before, local := contents(t, p.B, r.tgt, 0, size), contents(t, p.A, r.src, 0, size)
			n, err := p.A.PostSend(0, []verbs.SendWR{tc.wr(r)})
			if tc.postErr {
				if err == nil || n != 0 {
					t.Fatalf("PostSend took the WR (%d posted, %v): want it refused", n, err)
				}
			} else {
				if err != nil || n != 1 {
					t.Fatalf("PostSend: %d posted, %v", n, err)
				}
				expectWC(t, waitWCs(t, p.A, verbstest.SendCQ, 1)[0], 9, tc.want)
			}
			if tc.want == verbs.WCSuccess && !tc.postErr {
				want := append(local[0:8:8], local[32:40]...)
				if got := contents(t, p.B, r.tgt, 0, 16); !bytes.Equal(got, want) {
					t.Errorf("the Write of two SGEs wrote %x, want %x", got, want)
				}
			} else if after := contents(t, p.B, r.tgt, 0, size); !bytes.Equal(after, before) {
				t.Errorf("the failed WR changed the remote region: %x, was %x", after, before)
			}
			if after := contents(t, p.A, r.src, 0, size); !bytes.Equal(after, local) {
				t.Errorf("the WR changed the local region: %x, was %x", after, local)
			}
			expectCanaries(t, p.A, r.src, r.src2)
			expectCanaries(t, p.B, r.tgt, r.tgt2)
		})
	}
}

// TestFastPathRefusesWhileHeld: postPath performs no WR while any bit of
// its connection's hold is set (a mapping change to absorb, mappings
// retired, a segment wait, a revocation to answer, the peer unsettled or
// gone), though the WR has the kept keys and checks out otherwise; with
// hold clear, the same WR is performed.
func TestFastPathRefusesWhileHeld(t *testing.T) {
	const size = 64
	p, src, tgt := warmWritePair(t, size)
	before := contents(t, p.B, tgt, 0, size)
	q := driverQP(p.A.QPs[0])
	wr := rdma(9, verbs.OpRDMAWrite, src.SGE(0, 8), tgt, 0)
	for _, bit := range []uint32{holdUnsettled, holdDirty, holdRetired, holdSegWait, holdRevoke, holdEnded} {
		q.mu.Lock()
		c := q.conn
		set := c.hot.hold.Load()&bit == 0
		c.setHold(bit)
		took := q.postPath(&wr)
		if set {
			c.clearHold(bit)
		}
		q.mu.Unlock()
		if !set {
			t.Fatalf("hold bit %#x set already: the connection is not idle", bit)
		}
		if took {
			t.Fatalf("postPath performed a WR with hold bit %#x set", bit)
		}
		if after := contents(t, p.B, tgt, 0, size); !bytes.Equal(after, before) {
			t.Fatalf("a WR refused with hold bit %#x changed the remote region: %x, was %x", bit, after, before)
		}
	}
	took := tryPostPath(q, &wr)
	if !took {
		t.Fatal("postPath refused the WR with hold clear: the test tests nothing")
	}
	expectWC(t, waitWCs(t, p.A, verbstest.SendCQ, 1)[0], 9, verbs.WCSuccess)
	if got, want := contents(t, p.B, tgt, 0, 8), contents(t, p.A, src, 0, 8); !bytes.Equal(got, want) {
		t.Errorf("the Write wrote %x, want %x", got, want)
	}
}

// TestFastPathTakesInlineWrites: an inline Write with the kept keys is
// performed through postPath, as every WR it takes is performed before
// PostSend returns; one longer than the QP's inline limit is not, and
// PostSend refuses it, touching nothing.
func TestFastPathTakesInlineWrites(t *testing.T) {
	const size = 256
	p, src, tgt := warmWritePair(t, size)
	q := driverQP(p.A.QPs[0])
	limit := int(q.cap.MaxInlineData)
	if limit+1 > size {
		t.Fatalf("the QP's inline limit %d leaves no longer Write in %d bytes", limit, size)
	}
	wr := rdma(9, verbs.OpRDMAWrite, src.SGE(0, limit), tgt, 0)
	wr.Flags |= verbs.SendInline
	took := tryPostPath(q, &wr)
	if !took {
		t.Fatal("postPath refused an inline Write of the QP's inline limit with the kept keys")
	}
	expectWC(t, waitWCs(t, p.A, verbstest.SendCQ, 1)[0], 9, verbs.WCSuccess)
	if got, want := contents(t, p.B, tgt, 0, limit), contents(t, p.A, src, 0, limit); !bytes.Equal(got, want) {
		t.Fatalf("the inline Write wrote %x, want %x", got, want)
	}

	before := contents(t, p.B, tgt, 0, size)
	long := rdma(10, verbs.OpRDMAWrite, src.SGE(0, limit+1), tgt, 0)
	long.Flags |= verbs.SendInline
	took = tryPostPath(q, &long)
	if took {
		t.Fatal("postPath performed an inline Write beyond the QP's inline limit")
	}
	if n, err := p.A.PostSend(0, []verbs.SendWR{long}); err == nil || n != 0 {
		t.Fatalf("PostSend took an inline Write beyond the QP's inline limit (%d posted, %v)", n, err)
	}
	if after := contents(t, p.B, tgt, 0, size); !bytes.Equal(after, before) {
		t.Errorf("the refused Write changed the remote region: %x, was %x", after, before)
	}
}

// TestFastPathRunStopsAtAnotherKey: in a list of Writes performed as one
// run through postRun, a WR with another remote or local key, whose
// addresses lie in the kept regions, ends the run: it fails as the long
// road fails it, writing nothing, and the WR after it is flushed; the
// Writes before it land.
func TestFastPathRunStopsAtAnotherKey(t *testing.T) {
	const size = 64
	for _, tc := range []struct {
		name  string
		other func(wr *verbs.SendWR, src2, tgt2 verbstest.Region)
		want  verbs.WCStatus
	}{
		{"remote", func(wr *verbs.SendWR, _, tgt2 verbstest.Region) { wr.RKey = tgt2.RKey }, verbs.WCRemAccessErr},
		{"local", func(wr *verbs.SendWR, src2, _ verbstest.Region) { wr.SGList[0].LKey = src2.LKey }, verbs.WCLocProtErr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := localHarness().NewPair(t, verbstest.PairOptions{})
			src := newRegion(t, p.A, size, verbs.AccessLocalWrite)
			src2 := newRegion(t, p.A, size, verbs.AccessLocalWrite)
			tgt := newRegion(t, p.B, size, verbs.AccessLocalWrite|verbs.RemoteAccess)
			tgt2 := newRegion(t, p.B, size, verbs.AccessLocalWrite|verbs.RemoteAccess)
			warmFastPath(t, p, verbs.OpRDMAWrite, src, tgt, 0)
			fill(t, p.B, tgt, 0, pattern(2, size))
			fill(t, p.A, src, 0, pattern(3, size))
			list := make([]verbs.SendWR, 4)
			for i := range list {
				list[i] = rdma(uint64(i+1), verbs.OpRDMAWrite, src.SGE(8*i, 8), tgt, 8*i)
			}
			tc.other(&list[2], src2, tgt2)
			if n, err := p.A.PostSend(0, list); n != len(list) || err != nil {
				t.Fatalf("posted %d of %d: %v", n, len(list), err)
			}
			wcs := waitWCs(t, p.A, verbstest.SendCQ, len(list))
			for i, want := range []verbs.WCStatus{verbs.WCSuccess, verbs.WCSuccess, tc.want, verbs.WCWRFlushErr} {
				expectWC(t, wcs[i], uint64(i+1), want)
			}
			want := pattern(2, size)
			copy(want[:16], pattern(3, size)[:16])
			if got := contents(t, p.B, tgt, 0, size); !bytes.Equal(got, want) {
				t.Errorf("the target holds %x, want %x", got, want)
			}
			expectCanaries(t, p.A, src, src2)
			expectCanaries(t, p.B, tgt, tgt2)
		})
	}
}

// TestInlineWritesFillTheFastPath: a QP that posts only inline Writes
// has them kept on postFast's road (fillFast takes an inline Write as it
// takes any other), and each lands, with its canaries intact.
func TestInlineWritesFillTheFastPath(t *testing.T) {
	const size = 64
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	src := newRegion(t, p.A, size, verbs.AccessLocalWrite)
	tgt := newRegion(t, p.B, size, verbs.AccessLocalWrite|verbs.RemoteAccess)
	fill(t, p.A, src, 0, pattern(1, size))
	for i := range 3 {
		wr := rdma(uint64(i), verbs.OpRDMAWrite, src.SGE(8*i, 8), tgt, 8*i)
		wr.Flags |= verbs.SendInline
		postSend(t, p.A, 0, wr)
		expectWC(t, waitWCs(t, p.A, verbstest.SendCQ, 1)[0], uint64(i), verbs.WCSuccess)
	}
	if !fastPathKept(p, verbs.OpRDMAWrite) {
		t.Fatal("inline Writes left nothing on postFast's road")
	}
	if got, want := contents(t, p.B, tgt, 0, 24), pattern(1, size)[:24]; !bytes.Equal(got, want) {
		t.Errorf("the inline Writes wrote %x, want %x", got, want)
	}
	expectCanaries(t, p.A, src)
	expectCanaries(t, p.B, tgt)
}

// warmWritePair makes a pair whose A side has a source region of size
// bytes, holding pattern 3 (pattern 1 before the warming Writes), and
// whose B side a target region holding pattern 2 but where the warming
// Writes wrote, with postFast's road kept for Writes from one to the
// other (warmFastPath).
func warmWritePair(t *testing.T, size int) (p *verbstest.Pair, src, tgt verbstest.Region) {
	t.Helper()
	p = localHarness().NewPair(t, verbstest.PairOptions{})
	src = newRegion(t, p.A, size, verbs.AccessLocalWrite)
	tgt = newRegion(t, p.B, size, verbs.AccessLocalWrite|verbs.RemoteAccess)
	fill(t, p.A, src, 0, pattern(1, size))
	fill(t, p.B, tgt, 0, pattern(2, size))
	warmFastPath(t, p, verbs.OpRDMAWrite, src, tgt, 0)
	fill(t, p.A, src, 0, pattern(3, size))
	return p, src, tgt
}

// tryPostPath calls q.postPath(wr) under q.mu, as PostSend does.
func tryPostPath(q *qp, wr *verbs.SendWR) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.postPath(wr)
}
