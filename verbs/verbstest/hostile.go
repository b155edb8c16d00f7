package verbstest

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"slices"
	"testing"

	"github.com/goverbs/goverbs/verbs"
)

// The hostile-peer cases: A attacks B, which holds a target region, a
// neighbour region right beside it (every right), and a private region
// (local access only). Each attack must end in an error completion at A
// with nothing of B's touched but what B granted, every canary intact.

// victimSet is what B holds in a hostile case.
type victimSet struct {
	target, neighbour, private Region
	snaps                      []snapshot
}

// newVictim registers B's regions, with target granting access, fills
// them with patterns and snapshots them.
func newVictim(t testing.TB, p *Pair, access verbs.AccessFlags) *victimSet {
	t.Helper()
	v := &victimSet{
		target:    newRegion(t, p.B, 64, access),
		neighbour: newRegion(t, p.B, 64, remoteAll),
		private:   newRegion(t, p.B, 64, localRW),
	}
	for i, r := range []Region{v.target, v.neighbour, v.private} {
		fill(t, p.B, r, 0, pattern(70+i, 64))
		v.snaps = append(v.snaps, snap(t, p.B, r, fmt.Sprintf("victim region %d", i)))
	}
	return v
}

// untouched checks every region of the victim against its snapshot and
// its canaries.
func (v *victimSet) untouched(t testing.TB) {
	t.Helper()
	for _, s := range v.snaps {
		s.unchanged(t)
	}
}

// attack posts wr, signaled, on A's QP 0 and checks that it completes
// with one of the statuses allowed and leaves A's QP in the error state.
func attack(t testing.TB, p *Pair, wr verbs.SendWR, allowed ...verbs.WCStatus) {
	t.Helper()
	wr.WRID = faultBadID
	wr.Flags |= verbs.SendSignaled
	postSend(t, p.A, 0, wr)
	wc := waitOne(t, p.A, SendCQ)
	if wc.WRID != faultBadID || !slices.Contains(allowed, wc.Status) {
		t.Fatalf("attack %v with rkey %#x at %#x: completion %s, want one of %v", wr.Opcode, wr.RKey, wr.RemoteAddr, fmtWC(wc), allowed)
	}
	expectState(t, p.A, 0, verbs.QPSErr)
}

// attackWR builds op against addr with rkey, from (or into) local.
func attackWR(op verbs.Opcode, rkey uint32, addr uint64, local Region) verbs.SendWR {
	wr := verbs.SendWR{Opcode: op, RKey: rkey, RemoteAddr: addr, SGList: []verbs.SGE{local.SGE(0, 16)}}
	if op.IsAtomic() {
		wr.SGList = []verbs.SGE{local.SGE(0, 8)}
		wr.CompareAdd, wr.Swap = 1, 2
	}
	return wr
}

// hostileOps are the operations the hostile cases try, those the device
// has.
func hostileOps(t testing.TB, h Harness) []verbs.Opcode {
	ops := []verbs.Opcode{verbs.OpRDMAWrite, verbs.OpRDMARead}
	if deviceAttr(t, h).Caps&verbs.CapAtomics != 0 {
		ops = append(ops, verbs.OpAtomicFetchAndAdd)
	}
	return ops
}

// hostileEach runs, for each operation as a subtest, a fresh pair whose
// A attacks with the WR mk builds from B's regions (target granting
// access), and checks the outcome.
func hostileEach(t *testing.T, h Harness, access verbs.AccessFlags, mk func(op verbs.Opcode, v *victimSet, local Region) verbs.SendWR) {
	for _, op := range hostileOps(t, h) {
		t.Run(op.String(), func(t *testing.T) {
			p := h.NewPair(t, PairOptions{})
			v := newVictim(t, p, access)
			local := newRegion(t, p.A, 64, localRW)
			attack(t, p, mk(op, v, local), verbs.WCRemAccessErr)
			v.untouched(t)
		})
	}
}

// testHostileForgedKey: a made-up key (random bits), and the key of B's
// private region (a key that exists but grants no remote right), are
// refused.
func testHostileForgedKey(t *testing.T, h Harness) {
	t.Run("Random", func(t *testing.T) {
		hostileEach(t, h, remoteAll, func(op verbs.Opcode, v *victimSet, local Region) verbs.SendWR {
			var b [4]byte
			var k uint32
			for k == 0 || k == v.target.RKey || k == v.neighbour.RKey || k == v.private.RKey {
				rand.Read(b[:])
				k = binary.LittleEndian.Uint32(b[:])
			}
			return attackWR(op, k, v.target.Addr+16, local)
		})
	})
	t.Run("PrivateRegionKey", func(t *testing.T) {
		hostileEach(t, h, remoteAll, func(op verbs.Opcode, v *victimSet, local Region) verbs.SendWR {
			return attackWR(op, v.private.LKey, v.private.Addr+16, local)
		})
	})
}

// testHostileGuessedKeys: keys one bit or one step away from the
// target's, in any part of the key, are refused.
func testHostileGuessedKeys(t *testing.T, h Harness) {
	guesses := []struct {
		name string
		key  func(k uint32) uint32
	}{
		{"LowBit", func(k uint32) uint32 { return k ^ 1 }},
		{"Bit8", func(k uint32) uint32 { return k ^ 1<<8 }},
		{"NextStep", func(k uint32) uint32 { return k + 1<<8 }},
		{"HighBit", func(k uint32) uint32 { return k ^ 1<<31 }},
	}
	for _, g := range guesses {
		t.Run(g.name, func(t *testing.T) {
			p := h.NewPair(t, PairOptions{})
			v := newVictim(t, p, remoteAll)
			local := newRegion(t, p.A, 64, localRW)
			k := g.key(v.target.RKey)
			if k == v.neighbour.RKey || k == v.private.RKey {
				t.Skipf("the guess %#x is a key B really holds", k)
			}
			attack(t, p, attackWR(verbs.OpRDMAWrite, k, v.target.Addr+16, local), verbs.WCRemAccessErr)
			v.untouched(t)
		})
	}
}

// testHostileStaleKey: the key of a deregistered region stays refused
// while B registers new regions, which may take its slot, and none of
// them is touched through it.
func testHostileStaleKey(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	v := newVictim(t, p, remoteAll)
	stale := v.target
	if err := p.B.DeregRegion(stale.ID); err != nil {
		t.Fatalf("deregister: %v", err)
	}
	v.snaps = v.snaps[1:] // the deregistered region's bytes are B's to change
	for i := range 16 {
		r := newRegion(t, p.B, 64, remoteAll)
		fill(t, p.B, r, 0, pattern(80+i, 64))
		v.snaps = append(v.snaps, snap(t, p.B, r, fmt.Sprintf("region %d registered after the Dereg", i)))
		if r.RKey == stale.RKey {
			t.Fatalf("a new region got the deregistered region's key %#x", r.RKey)
		}
	}
	local := newRegion(t, p.A, 64, localRW)
	attack(t, p, attackWR(verbs.OpRDMAWrite, stale.RKey, stale.Addr+16, local), verbs.WCRemAccessErr)
	v.untouched(t)
}

// testHostileOutOfBounds: a valid key with addresses it does not cover —
// the neighbour region's, one wrapping around the address space, one
// just past the end — is refused.
func testHostileOutOfBounds(t *testing.T, h Harness) {
	cases := []struct {
		name string
		addr func(v *victimSet) uint64
	}{
		{"NeighbourAddress", func(v *victimSet) uint64 { return v.neighbour.Addr + 16 }},
		{"PrivateAddress", func(v *victimSet) uint64 { return v.private.Addr + 16 }},
		{"WrapAround", func(*victimSet) uint64 { return ^uint64(0) - 7 }},
		{"PastEnd", func(v *victimSet) uint64 { return v.target.Addr + uint64(v.target.Len) }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hostileEach(t, h, remoteAll, func(op verbs.Opcode, v *victimSet, local Region) verbs.SendWR {
				return attackWR(op, v.target.RKey, c.addr(v)&^7, local)
			})
		})
	}
}

// testHostileMisaligned: an atomic at a misaligned address, and one
// straddling the region's end, are refused.
func testHostileMisaligned(t *testing.T, h Harness) {
	requireCap(t, h, verbs.CapAtomics, "CapAtomics")
	for _, straddle := range []bool{false, true} {
		name := "Inside"
		if straddle {
			name = "StraddlingEnd"
		}
		t.Run(name, func(t *testing.T) {
			p := h.NewPair(t, PairOptions{})
			v := newVictim(t, p, remoteAll)
			local := newRegion(t, p.A, 64, localRW)
			addr := v.target.Addr + uint64(alignedOff(v.target, 8)) + 4
			if straddle {
				addr = v.target.Addr + uint64(v.target.Len) - 4
			}
			attack(t, p, attackWR(verbs.OpAtomicFetchAndAdd, v.target.RKey, addr, local), verbs.WCRemInvReqErr, verbs.WCRemAccessErr)
			v.untouched(t)
		})
	}
}

// testHostileMissingRights: a region granting only remote read refuses
// Writes and atomics, and one granting only remote write refuses Reads.
func testHostileMissingRights(t *testing.T, h Harness) {
	grants := []struct {
		access verbs.AccessFlags
		ops    []verbs.Opcode
	}{
		{verbs.AccessLocalWrite | verbs.AccessRemoteRead, []verbs.Opcode{verbs.OpRDMAWrite, verbs.OpAtomicFetchAndAdd}},
		{verbs.AccessLocalWrite | verbs.AccessRemoteWrite, []verbs.Opcode{verbs.OpRDMARead, verbs.OpAtomicCmpAndSwp}},
	}
	for _, g := range grants {
		for _, op := range g.ops {
			t.Run(g.access.String()+"/"+op.String(), func(t *testing.T) {
				if op.IsAtomic() {
					requireCap(t, h, verbs.CapAtomics, "CapAtomics")
				}
				p := h.NewPair(t, PairOptions{})
				v := newVictim(t, p, g.access)
				local := newRegion(t, p.A, 64, localRW)
				attack(t, p, attackWR(op, v.target.RKey, v.target.Addr+uint64(alignedOff(v.target, 16)), local), verbs.WCRemAccessErr)
				v.untouched(t)
			})
		}
	}
}

// testHostileAfterDisconnect: once A has closed its connection, a Write
// it posts with a key that was valid completes in error and B's regions
// are untouched.
func testHostileAfterDisconnect(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	v := newVictim(t, p, remoteAll)
	local := newRegion(t, p.A, 64, localRW)
	fill(t, p.A, local, 0, pattern(90, 64))
	if err := p.A.Conns[0].Close(); err != nil {
		t.Fatalf("disconnect: %v", err)
	}
	attack(t, p, attackWR(verbs.OpRDMAWrite, v.target.RKey, v.target.Addr, local), verbs.WCWRFlushErr, verbs.WCRetryExcErr, verbs.WCRemAccessErr)
	v.untouched(t)
}

// testHostileSendTooLarge: a Send longer than the receive B posted fails
// at B with WCLocLenErr and places nothing past the receive's buffer.
func testHostileSendTooLarge(t *testing.T, h Harness) {
	p := h.NewPair(t, PairOptions{})
	dst := newRegion(t, p.B, 64, localRW)
	fill(t, p.B, dst, 0, pattern(91, 64))
	src := newRegion(t, p.A, 64, localRW)
	fill(t, p.A, src, 0, pattern(92, 64))
	postRecv(t, p.B, 0, recvWR(9, dst.SGE(0, 16)))
	postSend(t, p.A, 0, verbs.SendWR{WRID: 1, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{src.SGE(0, 48)}})
	if wc := waitOne(t, p.A, SendCQ); wc.Status == verbs.WCSuccess {
		t.Fatalf("a Send larger than the posted receive completed %s", fmtWC(wc))
	}
	expectStatus(t, waitOne(t, p.B, RecvCQ), 9, verbs.WCLocLenErr)
	expectBytes(t, p.B, dst, 16, pattern(91, 64)[16:], "bytes past the posted receive buffer")
	expectCanaries(t, p.B, dst)
}
