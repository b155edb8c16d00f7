// Package keytab is the key table of the software providers: it hands out
// the 32-bit keys (lkey, rkey, STag) that name registered regions, looks
// them up on the data path without a lock or an allocation, and revokes
// them.
//
// A key is 32 bits drawn from crypto/rand for each registration (and each
// Rekey), never 0, unique among the live keys, and never one of the last
// RecentRevoked keys the table revoked, so that a stale key never names
// the region that took its place. A peer guessing a key hits a given
// region with probability 2^-32 per guess, and some region with N/2^32
// when the table holds N keys.
//
// The keys are kept in an open-addressing hash table (linear probing, the
// slot taken from a hash of the key, the full key compared) whose slot
// array is a power of two, at most half full counting removed slots, and
// grows (or is rebuilt in place to drop removed slots) under the table's
// lock. Lookup loads the current array through an atomic pointer and
// takes no lock; an entry carries a revoked flag, set by Remove and Rekey
// before they return, that Lookup checks after the key matches, so that a
// reader still walking an array replaced by a rebuild never finds a
// revoked key. A table holds at most MaxLen keys: the bound keeps the
// chance that a guess hits some region (MaxLen/2^32 = 2^-12 at worst)
// and the table's memory (about 32 MiB of slots when full) in check.
//
// A table with Indexed set additionally keeps the low IndexBits of its
// live keys distinct, so that Index(key) can index a fixed array of Size
// entries beside it (shm0's shared key and grant tables); such a table
// holds at most Size keys, and a key's random part outside its index is
// RandomBits wide.
package keytab

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
)

const (
	// IndexBits is the width of a key's index in an Indexed table.
	IndexBits = 8
	// RandomBits is the width of the part of a key that an Indexed table
	// does not constrain: the key space a guesser who knows an index must
	// search (2^24). Keys of other tables are 32 random bits.
	RandomBits = 32 - IndexBits
	// Size is the number of keys an Indexed table holds.
	Size = 1 << IndexBits
	// KeyBits is the width of the random keys of a table that is not
	// Indexed: a guess hits a given region with probability 2^-KeyBits.
	KeyBits = 32
	// MaxLen is the number of keys a table that is not Indexed holds.
	MaxLen = 1 << 20
	// RecentRevoked is how many of the most recently revoked keys a table
	// remembers and never hands out again while it remembers them.
	RecentRevoked = 4096

	indexMask = Size - 1
	minSlots  = 16
)

// ErrFull is returned by Insert when a table holds MaxLen keys, or an
// Indexed one Size.
var ErrFull = errors.New("keytab: the key table is full: deregister regions no longer in use")

// Index returns the low IndexBits of key: the slot of the fixed arrays
// kept beside an Indexed table.
func Index(key uint32) uint32 { return key & indexMask }

// Table maps keys to values of type T. The zero Table is empty and ready.
// Insert, Remove and Rekey are serialised by the table's own lock; Lookup
// takes none.
type Table[T any] struct {
	// Indexed, set before the first Insert, keeps the Index of live keys
	// distinct (and the table at most Size keys).
	Indexed bool

	mu      sync.Mutex
	arr     atomic.Pointer[slotArray[T]]
	n       int                   // live keys; guarded by mu
	dead    int                   // tombstoned slots in arr; guarded by mu
	used    [Size]bool            // Indexed: the indices of live keys; guarded by mu
	recent  [RecentRevoked]uint32 // ring of revoked keys; guarded by mu
	next    int                   // next ring position; guarded by mu
	revoked map[uint32]int        // ring contents, with multiplicity; guarded by mu
	// gone is the tombstone of removed slots: probes pass over it, and
	// its key, 0, is never handed out.
	gone entry[T]
}

type slotArray[T any] struct {
	mask  uint32
	shift uint32
	slots []atomic.Pointer[entry[T]]
}

type entry[T any] struct {
	key     uint32
	revoked atomic.Bool
	val     T
}

func hash(key, shift uint32) uint32 { return (key * 0x9E3779B1) >> shift }

func newArray[T any](size uint32) *slotArray[T] {
	shift := uint32(32)
	for s := size; s > 1; s >>= 1 {
		shift--
	}
	return &slotArray[T]{mask: size - 1, shift: shift, slots: make([]atomic.Pointer[entry[T]], size)}
}

// Insert stores the value mk returns for a fresh key, and returns the
// key. mk runs under the table's lock, before the value is published,
// so that the value may hold its own key.
func (t *Table[T]) Insert(mk func(key uint32) T) (uint32, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == MaxLen || t.Indexed && t.n == Size {
		return 0, ErrFull
	}
	key := t.freshKey()
	t.reserve()
	e := &entry[T]{key: key}
	e.val = mk(key)
	t.place(t.arr.Load(), e)
	t.n++
	if t.Indexed {
		t.used[Index(key)] = true
	}
	return key, nil
}

// reserve makes room for one more entry, keeping the array at most half
// full counting tombstones: it rebuilds into a new array (twice the size
// if live keys alone pass a quarter) and publishes it. t.mu is held.
func (t *Table[T]) reserve() {
	a := t.arr.Load()
	if a != nil && uint32(t.n+t.dead+1)*2 <= a.mask+1 {
		return
	}
	size := uint32(minSlots)
	for uint32(t.n+1)*4 > size {
		size *= 2
	}
	na := newArray[T](size)
	if a != nil {
		for i := range a.slots {
			if e := a.slots[i].Load(); e != nil && e != &t.gone {
				t.place(na, e)
			}
		}
	}
	t.dead = 0
	t.arr.Store(na)
}

// place stores e in the first free slot of its probe sequence in a.
func (t *Table[T]) place(a *slotArray[T], e *entry[T]) {
	for i := hash(e.key, a.shift); ; i = (i + 1) & a.mask {
		if s := a.slots[i].Load(); s == nil {
			a.slots[i].Store(e)
			return
		} else if s == &t.gone {
			a.slots[i].Store(e)
			t.dead--
			return
		}
	}
}

// find returns the slot of the live entry of key in the current array,
// or nil. t.mu is held.
func (t *Table[T]) find(key uint32) *atomic.Pointer[entry[T]] {
	a := t.arr.Load()
	if a == nil || key == 0 {
		return nil
	}
	for i := hash(key, a.shift); ; i = (i + 1) & a.mask {
		e := a.slots[i].Load()
		if e == nil {
			return nil
		}
		if e.key == key {
			return &a.slots[i]
		}
	}
}

// freshKey draws keys until one is non-zero, not live, not recently
// revoked and, for an Indexed table, of a free index. t.mu is held.
func (t *Table[T]) freshKey() uint32 {
	var b [4]byte
	for {
		rand.Read(b[:])
		key := binary.LittleEndian.Uint32(b[:])
		if key == 0 || (t.Indexed && t.used[Index(key)]) || t.revoked[key] > 0 || t.find(key) != nil {
			continue
		}
		return key
	}
}

// revoke marks e revoked, tombstones its slot and remembers its key.
// t.mu is held.
func (t *Table[T]) revoke(s *atomic.Pointer[entry[T]], e *entry[T]) {
	e.revoked.Store(true)
	s.Store(&t.gone)
	t.dead++
	if t.Indexed {
		t.used[Index(e.key)] = false
	}
	if t.revoked == nil {
		t.revoked = make(map[uint32]int)
	}
	if old := t.recent[t.next]; old != 0 {
		if t.revoked[old]--; t.revoked[old] == 0 {
			delete(t.revoked, old)
		}
	}
	t.recent[t.next] = e.key
	t.revoked[e.key]++
	t.next = (t.next + 1) % RecentRevoked
}

// Lookup returns the value stored under key. It takes no lock and does
// not allocate: callers on the data path use it for every access.
func (t *Table[T]) Lookup(key uint32) (T, bool) {
	if a := t.arr.Load(); a != nil && key != 0 {
		for i := hash(key, a.shift); ; i = (i + 1) & a.mask {
			e := a.slots[i].Load()
			if e == nil {
				break
			}
			if e.key == key {
				if e.revoked.Load() {
					break
				}
				return e.val, true
			}
		}
	}
	var zero T
	return zero, false
}

// Remove takes key out of the table and returns what it held; Lookups
// that start after Remove returns (and those still under way that have
// not yet matched) fail.
func (t *Table[T]) Remove(key uint32) (T, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.find(key)
	if s == nil {
		var zero T
		return zero, false
	}
	e := s.Load()
	t.revoke(s, e)
	t.n--
	return e.val, true
}

// Rekey gives the value stored under key a new key (a new generation: the
// old key fails from now on) and returns it. The table then holds what
// update returns for the old value and the new key, published with it.
func (t *Table[T]) Rekey(key uint32, update func(old T, newKey uint32) T) (uint32, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.find(key)
	if s == nil {
		return 0, false
	}
	e := s.Load()
	t.revoke(s, e)
	t.n--
	nk := t.freshKey()
	t.reserve()
	ne := &entry[T]{key: nk}
	ne.val = update(e.val, nk)
	t.place(t.arr.Load(), ne)
	t.n++
	if t.Indexed {
		t.used[Index(nk)] = true
	}
	return nk, true
}

// Len returns the number of keys in the table.
func (t *Table[T]) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

// Range calls f with each key and value in the table until f returns
// false. It sees a consistent entry per slot, not a snapshot of the whole
// table; f may Remove keys.
func (t *Table[T]) Range(f func(key uint32, v T) bool) {
	a := t.arr.Load()
	if a == nil {
		return
	}
	for i := range a.slots {
		if e := a.slots[i].Load(); e != nil && e != &t.gone && !e.revoked.Load() && !f(e.key, e.val) {
			return
		}
	}
}
