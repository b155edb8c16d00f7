package atomicrel

import (
	"sync/atomic"
	"testing"
)

func TestStoreUint64(t *testing.T) {
	testStore[uint64, atomic.Uint64](t, StoreUint64, 1, 0, 1<<64-1, 0x0123456789abcdef)
}

func TestStoreUint32(t *testing.T) {
	testStore[uint32, atomic.Uint32](t, StoreUint32, 1, 0, 1<<32-1, 0x01234567)
}

// testStore stores each of values with store into a word between two
// others, and checks that the word loads it and its neighbours are
// untouched.
func testStore[T uint32 | uint64, A any, PA interface {
	*A
	Load() T
}](t *testing.T, store func(PA, T), values ...T) {
	var s struct {
		before T
		v      A
		after  T
	}
	for _, v := range values {
		store(&s.v, v)
		if got := PA(&s.v).Load(); got != v || s.before != 0 || s.after != 0 {
			t.Fatalf("store %#x: Load %#x, neighbours %#x %#x", v, got, s.before, s.after)
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

// TestFenceOrdersAgainstReleaseStores is the store-buffering litmus
// test: one goroutine publishes x with a release store and then loads y;
// the other stores y, calls Fence and loads x. In no round may both
// loads miss the other's store. Without Fence, x86 lets both miss (about
// once in a thousand rounds on a two-processor machine).
func TestFenceOrdersAgainstReleaseStores(t *testing.T) {
	rounds := uint64(20000)
	if testing.Short() {
		rounds = 2000
	}
	var x, y, start, stored atomic.Uint64
	var sawY atomic.Bool
	go func() {
		for r := uint64(1); r <= rounds; r++ {
			for start.Load() != r {
			}
			StoreUint64(&x, r)
			sawY.Store(y.Load() == r)
			stored.Store(r)
		}
	}()
	for r := uint64(1); r <= rounds; r++ {
		start.Store(r)
		y.Store(r)
		Fence()
		sawX := x.Load() == r
		for stored.Load() != r {
		}
		if !sawX && !sawY.Load() {
			t.Fatalf("round %d: each side missed the other's store", r)
		}
	}
}
