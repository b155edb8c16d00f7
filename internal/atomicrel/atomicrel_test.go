package atomicrel

import (
	"sync/atomic"
	"testing"
)

func TestStoreUint64(t *testing.T) {
	var s struct {
		before uint64
		v      atomic.Uint64
		after  uint64
	}
	for _, v := range []uint64{1, 0, 1<<64 - 1, 0x0123456789abcdef} {
		StoreUint64(&s.v, v)
		if got := s.v.Load(); got != v || s.before != 0 || s.after != 0 {
			t.Fatalf("StoreUint64(%#x): Load %#x, neighbours %#x %#x", v, got, s.before, s.after)
		}
	}
}

// TestStoreUint64Publishes: what a goroutine wrote before the release
// store of an index is seen by another that loads the index.
func TestStoreUint64Publishes(t *testing.T) {
	const n = 200000
	var idx atomic.Uint64
	buf := make([]uint64, 64)
	bad := make(chan [2]uint64, 1)
	go func() {
		defer close(bad)
		for i := uint64(1); i <= n; {
			j := idx.Load()
			if j < i {
				continue
			}
			// The slot holds j, or a later index written there since;
			// never an earlier one.
			if got := atomic.LoadUint64(&buf[j%64]); got < j || got%64 != j%64 {
				bad <- [2]uint64{j, got}
				return
			}
			i = j + 1
		}
	}()
	for i := uint64(1); i <= n; i++ {
		atomic.StoreUint64(&buf[i%64], i)
		StoreUint64(&idx, i)
	}
	if b, ok := <-bad; ok {
		t.Fatalf("index %d published, its slot holds %d", b[0], b[1])
	}
}

func TestStoreUint32(t *testing.T) {
	var s struct {
		before uint32
		v      atomic.Uint32
		after  uint32
	}
	for _, v := range []uint32{1, 0, 1<<32 - 1, 0x01234567} {
		StoreUint32(&s.v, v)
		if got := s.v.Load(); got != v || s.before != 0 || s.after != 0 {
			t.Fatalf("StoreUint32(%#x): Load %#x, neighbours %#x %#x", v, got, s.before, s.after)
		}
	}
}
