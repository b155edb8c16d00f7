package keytab

import (
	"errors"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// val is an Insert argument that stores v.
func val[T any](v T) func(uint32) T { return func(uint32) T { return v } }

func TestInsertLookupRemove(t *testing.T) {
	var tab Table[*int]
	v := new(int)
	key, err := tab.Insert(val(v))
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := tab.Lookup(key); !ok || got != v {
		t.Fatalf("Lookup(%#x) = %v, %v; want the inserted value", key, got, ok)
	}
	for _, k := range []uint32{key ^ 1<<IndexBits, key ^ 1<<31, key + 1<<IndexBits, key ^ 1} {
		if _, ok := tab.Lookup(k); ok {
			t.Errorf("Lookup(%#x) found a value; only %#x was inserted", k, key)
		}
	}
	if got, ok := tab.Remove(key); !ok || got != v {
		t.Fatalf("Remove(%#x) = %v, %v", key, got, ok)
	}
	if _, ok := tab.Lookup(key); ok {
		t.Fatal("a removed key is still found")
	}
	if _, ok := tab.Remove(key); ok {
		t.Fatal("a key was removed twice")
	}
	if tab.Len() != 0 {
		t.Fatalf("Len = %d after removing the only key", tab.Len())
	}
}

// TestIndexedFillAndRefuse: an Indexed table holds Size keys, all
// distinct and non-zero, of distinct indices, then refuses with ErrFull;
// removing one makes room.
func TestIndexedFillAndRefuse(t *testing.T) {
	tab := Table[int]{Indexed: true}
	keys := map[uint32]int{}
	slots := map[uint32]bool{}
	for i := range Size {
		k, err := tab.Insert(val(i))
		if err != nil {
			t.Fatalf("insert %d: %v", i, err)
		}
		if k == 0 || keys[k] != 0 || slots[Index(k)] {
			t.Fatalf("insert %d: key %#x is zero or reuses a key or slot", i, k)
		}
		keys[k], slots[Index(k)] = i+1, true
	}
	if _, err := tab.Insert(val(-1)); !errors.Is(err, ErrFull) {
		t.Fatalf("insert into a full table: %v, want ErrFull", err)
	}
	for k, i := range keys {
		if v, ok := tab.Lookup(k); !ok || v != i-1 {
			t.Fatalf("Lookup(%#x) = %d, %v; want %d", k, v, ok, i-1)
		}
	}
	for k := range keys {
		tab.Remove(k)
		nk, err := tab.Insert(val(7))
		if err != nil {
			t.Fatal(err)
		}
		if Index(nk) != Index(k) || nk == k {
			t.Fatalf("the freed slot of %#x came back as %#x: want the same slot, another key", k, nk)
		}
		break
	}
}

// TestStaleKeyNeverReturns: a slot that is freed and taken again many
// times never hands out the key it held just before, so a stale key
// misses the region that took its slot.
func TestStaleKeyNeverReturns(t *testing.T) {
	tab := Table[int]{Indexed: true}
	// Fill all slots but one, so that every new key lands in that one.
	for range Size - 1 {
		if _, err := tab.Insert(val(0)); err != nil {
			t.Fatal(err)
		}
	}
	prev, err := tab.Insert(val(1))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10000 {
		tab.Remove(prev)
		k, err := tab.Insert(val(2))
		if err != nil {
			t.Fatal(err)
		}
		if k == prev {
			t.Fatalf("round %d: the slot's previous key %#x was handed out again", i, k)
		}
		if _, ok := tab.Lookup(prev); ok {
			t.Fatalf("round %d: stale key %#x still finds a value", i, prev)
		}
		prev = k
	}
}

// TestRandomPartSpread: the random parts of many keys of an Indexed table
// cover their range (no byte of the 24 bits is stuck), and indices are
// not handed out in order.
func TestRandomPartSpread(t *testing.T) {
	tab := Table[int]{Indexed: true}
	var or, and uint32 = 0, ^uint32(0)
	inOrder := 0
	var last uint32
	for i := range 2000 {
		k, err := tab.Insert(val(i))
		if err != nil {
			t.Fatal(err)
		}
		or |= k >> IndexBits
		and &= k >> IndexBits
		if i > 0 && Index(k) == (Index(last)+1)%Size {
			inOrder++
		}
		last = k
		tab.Remove(k)
	}
	const all = 1<<RandomBits - 1
	if or != all || and != 0 {
		t.Fatalf("random parts of 2000 keys: OR %#x, AND %#x; want every bit both set and clear", or, and)
	}
	if inOrder > 100 {
		t.Fatalf("%d of 2000 keys took the slot after the previous one: indices look sequential", inOrder)
	}
}

func TestRekey(t *testing.T) {
	var tab Table[string]
	k, _ := tab.Insert(val("r"))
	nk, ok := tab.Rekey(k, func(old string, _ uint32) string { return old })
	if !ok || nk == k || nk == 0 {
		t.Fatalf("Rekey(%#x) = %#x, %v; want a new key", k, nk, ok)
	}
	if _, ok := tab.Lookup(k); ok {
		t.Fatal("the old key still finds the value after Rekey")
	}
	if v, ok := tab.Lookup(nk); !ok || v != "r" {
		t.Fatalf("Lookup(new key) = %q, %v", v, ok)
	}
	if _, ok := tab.Rekey(k, func(old string, _ uint32) string { return old }); ok {
		t.Fatal("Rekey of a stale key succeeded")
	}
}

// TestConcurrentLookup: lookups racing inserts and removes see either the
// value of the key or nothing (run under -race).
func TestConcurrentLookup(t *testing.T) {
	var tab Table[uint32]
	stable, _ := tab.Insert(val(uint32(42)))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			k, err := tab.Insert(val(uint32(7)))
			if err == nil {
				tab.Remove(k)
			}
		}
	}()
	for range 100000 {
		if v, ok := tab.Lookup(stable); !ok || v != 42 {
			t.Fatalf("Lookup of a stable key = %d, %v", v, ok)
		}
	}
	close(stop)
	wg.Wait()
}

func BenchmarkLookup(b *testing.B) {
	var tab Table[*int]
	k, _ := tab.Insert(val(new(int)))
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := tab.Lookup(k); !ok {
			b.Fatal("miss")
		}
	}
}

func TestLookupAllocatesNothing(t *testing.T) {
	var tab Table[*int]
	k, _ := tab.Insert(val(new(int)))
	if n := testing.AllocsPerRun(1000, func() { tab.Lookup(k); tab.Lookup(k ^ 1<<20) }); n != 0 {
		t.Fatalf("Lookup allocates %v times per call pair", n)
	}
}

// BenchmarkLookupMany looks up keys of a table of 5,000, hits and misses
// in turn.
func BenchmarkLookupMany(b *testing.B) {
	var tab Table[*int]
	keys := make([]uint32, 5000)
	for i := range keys {
		keys[i], _ = tab.Insert(val(new(int)))
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		k := keys[i%len(keys)]
		if _, ok := tab.Lookup(k); !ok {
			b.Fatal("miss")
		}
		tab.Lookup(k ^ 0x5a5a0000)
		i++
	}
}
