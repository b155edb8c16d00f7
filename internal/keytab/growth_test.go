package keytab

import (
	"sync"
	"sync/atomic"
	"testing"
)

// TestManyKeys: a table holds far more than Size keys, all non-zero and
// distinct, every bit of them random; each finds its own value, and after
// removal none is found.
func TestManyKeys(t *testing.T) {
	var tab Table[int]
	const n = 20000
	keys := make([]uint32, n)
	seen := map[uint32]bool{}
	var or, and uint32 = 0, ^uint32(0)
	for i := range keys {
		k, err := tab.Insert(val(i))
		if err != nil {
			t.Fatalf("insert %d: %v", i, err)
		}
		if k == 0 || seen[k] {
			t.Fatalf("insert %d: key %#x is zero or already live", i, k)
		}
		seen[k] = true
		keys[i] = k
		or |= k
		and &= k
	}
	if or != ^uint32(0) || and != 0 {
		t.Fatalf("keys: OR %#x, AND %#x; want every bit both set and clear", or, and)
	}
	if tab.Len() != n {
		t.Fatalf("Len = %d, want %d", tab.Len(), n)
	}
	for i, k := range keys {
		if v, ok := tab.Lookup(k); !ok || v != i {
			t.Fatalf("Lookup(%#x) = %d, %v; want %d", k, v, ok, i)
		}
	}
	count := 0
	tab.Range(func(uint32, int) bool { count++; return true })
	if count != n {
		t.Fatalf("Range saw %d keys, want %d", count, n)
	}
	for i, k := range keys {
		if i%2 == 0 {
			if v, ok := tab.Remove(k); !ok || v != i {
				t.Fatalf("Remove(%#x) = %d, %v", k, v, ok)
			}
		}
	}
	for i, k := range keys {
		_, ok := tab.Lookup(k)
		if ok != (i%2 == 1) {
			t.Fatalf("Lookup(%#x) after removing the even keys: found %v", k, ok)
		}
	}
	for i, k := range keys {
		if i%2 == 1 {
			tab.Remove(k)
		}
	}
	if tab.Len() != 0 {
		t.Fatalf("Len = %d after removing every key", tab.Len())
	}
}

// TestRecentlyRevokedNotReissued: keys revoked by Remove and Rekey are
// not handed out again while the table remembers them, and never found.
func TestRecentlyRevokedNotReissued(t *testing.T) {
	var tab Table[int]
	revoked := map[uint32]bool{}
	k, _ := tab.Insert(val(0))
	for i := range RecentRevoked / 2 {
		revoked[k] = true
		nk, ok := tab.Rekey(k, func(int, uint32) int { return i })
		if !ok {
			t.Fatal("Rekey of a live key failed")
		}
		if revoked[nk] {
			t.Fatalf("Rekey handed out the revoked key %#x", nk)
		}
		k = nk
		r, _ := tab.Insert(val(-1))
		if revoked[r] {
			t.Fatalf("Insert handed out the revoked key %#x", r)
		}
		tab.Remove(r)
		revoked[r] = true
	}
	for r := range revoked {
		if _, ok := tab.Lookup(r); ok {
			t.Fatalf("revoked key %#x is found", r)
		}
	}
	if tab.revokedLen() > RecentRevoked {
		t.Fatalf("the table remembers %d revoked keys, more than %d", tab.revokedLen(), RecentRevoked)
	}
}

// revokedLen is the number of distinct keys the table remembers revoking.
func (t *Table[T]) revokedLen() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.revoked)
}

// TestGrowthUnderConcurrentLookups: readers looking up a fixed set of
// keys while a writer grows the table to thousands of keys and removes
// them again always find those keys with their values, and never find a
// key the writer has revoked (run under -race).
func TestGrowthUnderConcurrentLookups(t *testing.T) {
	var tab Table[uint32]
	stable := make([]uint32, 64)
	for i := range stable {
		stable[i], _ = tab.Insert(func(k uint32) uint32 { return k })
	}
	var (
		wg     sync.WaitGroup
		stop   atomic.Bool
		gone   [1 << 12]atomic.Uint32 // keys the writer has revoked
		goneN  atomic.Int64
		errMsg atomic.Pointer[string]
	)
	fail := func(s string) { errMsg.CompareAndSwap(nil, &s) }
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				for _, k := range stable {
					if v, ok := tab.Lookup(k); !ok || v != k {
						fail("a stable key was missed during growth")
						return
					}
				}
				n := min(goneN.Load(), int64(len(gone)))
				for i := range n {
					if k := gone[i].Load(); k != 0 {
						if _, ok := tab.Lookup(k); ok {
							fail("a revoked key was found")
							return
						}
					}
				}
			}
		}()
	}
	for range 3 {
		var keys []uint32
		for range 3000 {
			k, err := tab.Insert(func(k uint32) uint32 { return k })
			if err != nil {
				t.Fatal(err)
			}
			keys = append(keys, k)
		}
		for _, k := range keys {
			tab.Remove(k)
			i := goneN.Add(1) - 1
			gone[i%int64(len(gone))].Store(k)
		}
	}
	stop.Store(true)
	wg.Wait()
	if p := errMsg.Load(); p != nil {
		t.Fatal(*p)
	}
}
