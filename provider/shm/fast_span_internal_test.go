package shm

import (
	"math"
	"testing"

	"github.com/goverbs/goverbs/internal/soft"
)

// TestFastSpanMatchesWithin checks postFast's within, which makes its
// slice without bounds checks, against soft.Within on the spans around
// a buffer's edges and on those whose offset or length wraps: the same
// answer and the same bytes for every span of at least one byte.
func TestFastSpanMatchesWithin(t *testing.T) {
	buf := make([]byte, 64)
	for i := range buf {
		buf[i] = byte(i)
	}
	const base = 0x1000
	addrs := []uint64{0, base - 1, base, base + 1, base + 56, base + 63, base + 64, base + 65, math.MaxUint64}
	ns := []uint64{1, 7, 8, 63, 64, 65, math.MaxUint64 - base, math.MaxUint64}
	accepted := 0
	for _, addr := range addrs {
		for _, n := range ns {
			got, ok := within(buf, base, addr, n)
			want, wantOK := soft.Within(buf, base, addr, n)
			if ok != wantOK || string(got) != string(want) {
				t.Errorf("within(addr %#x, n %d) = %v, %v; soft.Within: %v, %v", addr, n, got, ok, want, wantOK)
			}
			if ok {
				accepted++
				if &got[0] != &buf[addr-base] || uint64(len(got)) != n {
					t.Errorf("within(addr %#x, n %d): not buf's bytes %d to %d", addr, n, addr-base, addr-base+n)
				}
			}
		}
	}
	if accepted == 0 {
		t.Fatal("no span accepted: the test tests nothing")
	}
	if _, ok := within(nil, base, base, 1); ok {
		t.Error("within accepted a span of an empty buffer")
	}
}
