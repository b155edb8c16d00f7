package shm

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// TestMappedRegionBoundsExact: a remote span is checked against the
// region's bytes in the mapping (keyEntry.span, mappedRegion) in one step;
// it must accept exactly the spans that lie both in the key's region and
// in the mapping of its segment, as the two checks it replaces did, for
// any key slot a hostile peer writes (offsets and lengths that overflow,
// regions past the mapping's end) and any WR.
func TestMappedRegionBoundsExact(t *testing.T) {
	mem := make([]byte, 4096)
	// reference: the span inside the region, then inside the mapping.
	reference := func(k *keyInfo, addr, n uint64) ([]byte, bool) {
		if addr < k.addr {
			return nil, false
		}
		off := addr - k.addr
		if off > k.length || n > k.length-off {
			return nil, false
		}
		start := k.segOff + off
		if start < k.segOff || start > uint64(len(mem)) || n > uint64(len(mem))-start {
			return nil, false
		}
		return mem[start : start+n], true
	}
	edges := []uint64{0, 1, 7, 8, 4095, 4096, 4097, 1 << 32, math.MaxUint64 - 4096, math.MaxUint64 - 1, math.MaxUint64}
	pick := func(r *rand.Rand) uint64 {
		if r.IntN(2) == 0 {
			return edges[r.IntN(len(edges))]
		}
		return r.Uint64N(8192)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200000 {
		k := keyInfo{segOff: pick(r), addr: 1 << 20, length: pick(r)}
		if r.IntN(4) == 0 {
			k.addr = pick(r)
		}
		addr, n := k.addr+pick(r), pick(r)
		if r.IntN(4) == 0 {
			addr = pick(r)
		}
		want, wantOK := reference(&k, addr, n)
		e := keyEntry{k: k}
		e.win, e.mapped = mappedRegion(mem, &k)
		got, gotOK := e.span(addr, n)
		if gotOK != wantOK || len(got) != len(want) ||
			(len(got) > 0 && unsafe.SliceData(got) != unsafe.SliceData(want)) {
			t.Fatalf("key segOff %#x addr %#x length %#x, WR addr %#x n %#x: got %d bytes %v, want %d bytes %v",
				k.segOff, k.addr, k.length, addr, n, len(got), gotOK, len(want), wantOK)
		}
	}
}
