package shm

import (
	"math"
	"testing"
	"unsafe"

	"github.com/goverbs/goverbs/internal/soft"
)

// TestFastSpanMatchesWithin checks postFast's inSpan, which takes the
// offset of a span from the start of a buffer, against soft.Within on the
// spans around a buffer's edges and on those whose offset or length
// wraps: the same answer for every span of at least one byte, and false
// for an empty one.
func TestFastSpanMatchesWithin(t *testing.T) {
	buf := make([]byte, 64)
	const base = 0x1000
	addrs := []uint64{0, base - 1, base, base + 1, base + 56, base + 63, base + 64, base + 65, math.MaxUint64}
	ns := []uint64{0, 1, 7, 8, 63, 64, 65, math.MaxUint64 - base, math.MaxUint64}
	accepted := 0
	for _, addr := range addrs {
		for _, n := range ns {
			ok := inSpan(addr-base, n, uint64(len(buf)))
			_, wantOK := soft.Within(buf, base, addr, n)
			if n == 0 {
				wantOK = false
			}
			if ok != wantOK {
				t.Errorf("inSpan(offset %#x, n %d) = %v; soft.Within: %v", addr-base, n, ok, wantOK)
			}
			if ok {
				accepted++
			}
		}
	}
	if accepted == 0 {
		t.Fatal("no span accepted: the test tests nothing")
	}
	if inSpan(0, 1, 0) {
		t.Error("inSpan accepted a span of an empty buffer")
	}
}

// TestCopySpanCopiesEveryLength checks postFast's copySpan, which copies
// 8 bytes with one load and one store and other lengths with copy: every
// length from 1 to 17 copies exactly its bytes, from unaligned addresses
// too, and touches none after them.
func TestCopySpanCopiesEveryLength(t *testing.T) {
	for n := uint64(1); n <= 17; n++ {
		for _, off := range []uint64{0, 1, 3} {
			src := make([]byte, 32)
			dst := make([]byte, 32)
			for i := range src {
				src[i] = byte(100 + i)
			}
			copySpan(unsafe.Pointer(&dst[off]), unsafe.Pointer(&src[off]), n)
			for i := range dst {
				want := byte(0)
				if uint64(i) >= off && uint64(i) < off+n {
					want = src[i]
				}
				if dst[i] != want {
					t.Fatalf("copySpan(n %d, offset %d): byte %d = %d, want %d", n, off, i, dst[i], want)
				}
			}
		}
	}
}
