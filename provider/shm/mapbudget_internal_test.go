package shm

import (
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// TestPeerMappingsProcessBudget: peers that push segments on several
// connections cannot map more of them in this process than its budget
// (here cut to 8), past which each connection still gets its floor
// (here 2) up to twice the budget, whatever each connection's own bound:
// the ones past it are refused, and the connections go on working, those
// that came after the budget was spent too. Many connections each at their own bound had spent every
// mapping the process may make (vm.max_map_count), and the runtime died
// on its next mmap.
func TestPeerMappingsProcessBudget(t *testing.T) {
	defer func(n int64, f int) { maxProcPeerMappings, minPeerMappings = n, f }(maxProcPeerMappings, minPeerMappings)
	base := peerMaps.Load()
	maxProcPeerMappings, minPeerMappings = base+8, 2
	fd := hostileFD(t, fdSmall)
	defer unix.Close(fd)
	h := localHarness()
	id := uint32(1 << 20)
	for pair := range 4 {
		p := h.NewPair(t, verbstest.PairOptions{})
		peer := connOf(driverQP(p.B.(*verbstest.Local).QPs[0]))
		victim := connOf(driverQP(p.A.QPs[0]))
		target := newRegion(t, p.B, 4096, driverRemoteAll)
		local := newRegion(t, p.A, 4096, verbs.AccessLocalWrite)
		for range 10 {
			pushSegment(peer, id, fd)
			id++
		}
		for deadline := time.Now().Add(10 * time.Second); ; runtime.Gosched() {
			victim.arriveMu.Lock()
			n := len(victim.arrivals)
			victim.arriveMu.Unlock()
			if n >= 10 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pair %d: %d of the 10 segments pushed arrived", pair, n)
			}
		}
		// A WR toward the peer maps what arrived.
		postSend(t, p.A, 0, rdma(uint64(pair), verbs.OpRDMARead, local.SGE(0, 64), target, 0))
		if wcs := waitWCs(t, p.A, verbstest.SendCQ, 1); wcs[0].Status != verbs.WCSuccess {
			t.Fatalf("pair %d: the Read after the pushes: %v", pair, wcs[0].Status)
		}
		if n := peerMaps.Load() - base; n > 2*8 {
			t.Fatalf("pair %d: %d peer segments mapped in the process, over twice its budget of 8", pair, n)
		}
	}
}
