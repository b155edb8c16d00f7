// Package keytab is the key table of the software providers: it hands out
// the 32-bit keys (lkey, rkey, STag) that name registered regions, looks
// them up on the data path without a lock or an allocation, and revokes
// them.
//
// A key is an index into the table in its low IndexBits bits and, in the
// other RandomBits, a value drawn from crypto/rand for each registration
// (and each Rekey). The index of a new entry is chosen at random among
// the free slots, so that a key says nothing about the order of
// registrations, and a slot's new key always differs from the one it had
// before, so that a stale key never names the region that took its slot.
// A peer that knows an occupied index must therefore try, on average,
// half of 2^RandomBits values to find that region's key; one that knows
// nothing must search 2^32 / Len() keys per region it hits.
package keytab

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
)

const (
	// IndexBits is the width of a key's table index.
	IndexBits = 8
	// RandomBits is the width of a key's random part: the key space a
	// guesser must search for each region (2^24).
	RandomBits = 32 - IndexBits
	// Size is the number of entries a table holds.
	Size = 1 << IndexBits

	indexMask = Size - 1
)

// ErrFull is returned by Insert when every slot of the table is taken.
var ErrFull = errors.New("keytab: the key table is full: deregister regions no longer in use")

// Index returns the table slot of key: the index shared tables built
// beside a Table (such as shm0's peers' view of the keys) use.
func Index(key uint32) uint32 { return key & indexMask }

// Table maps keys to values of type T. Insert, Remove and Rekey are
// serialised by the table's own lock; Lookup takes none.
type Table[T any] struct {
	mu    sync.Mutex
	slots [Size]atomic.Pointer[entry[T]]
	last  [Size]uint32 // the last key each slot held; guarded by mu
	n     int          // guarded by mu
}

type entry[T any] struct {
	key uint32
	val T
}

// Insert stores the value mk returns for a fresh key, and returns the
// key. mk runs under the table's lock, before the value is published,
// so that the value may hold its own key.
func (t *Table[T]) Insert(mk func(key uint32) T) (uint32, error) {
	var r [8]byte
	rand.Read(r[:])
	start := binary.LittleEndian.Uint32(r[4:])
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n == Size {
		return 0, ErrFull
	}
	for i := range uint32(Size) {
		idx := (start + i) & indexMask
		if t.slots[idx].Load() == nil {
			key := t.freshKey(idx, binary.LittleEndian.Uint32(r[:4]))
			t.slots[idx].Store(&entry[T]{key: key, val: mk(key)})
			t.n++
			return key, nil
		}
	}
	return 0, ErrFull // not reached: n < Size
}

// freshKey returns a key of slot idx built from the random value r,
// different from the slot's previous key and from 0; it records it as the
// slot's last. t.mu is held.
func (t *Table[T]) freshKey(idx, r uint32) uint32 {
	for {
		key := r&^indexMask | idx
		if key != t.last[idx] && key != 0 {
			t.last[idx] = key
			return key
		}
		var b [4]byte
		rand.Read(b[:])
		r = binary.LittleEndian.Uint32(b[:])
	}
}

// Lookup returns the value stored under key. It takes no lock and does
// not allocate: callers on the data path use it for every access.
func (t *Table[T]) Lookup(key uint32) (T, bool) {
	if e := t.slots[key&indexMask].Load(); e != nil && e.key == key {
		return e.val, true
	}
	var zero T
	return zero, false
}

// Remove takes key out of the table and returns what it held; later
// Lookups of key fail.
func (t *Table[T]) Remove(key uint32) (T, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := &t.slots[key&indexMask]
	e := s.Load()
	if e == nil || e.key != key {
		var zero T
		return zero, false
	}
	s.Store(nil)
	t.n--
	return e.val, true
}

// Rekey gives the value stored under key a new key in the same slot (a
// new generation: the old key fails from now on) and returns it. The slot
// then holds what update returns for the old value and the new key,
// published with it.
func (t *Table[T]) Rekey(key uint32, update func(old T, newKey uint32) T) (uint32, bool) {
	var r [4]byte
	rand.Read(r[:])
	t.mu.Lock()
	defer t.mu.Unlock()
	idx := key & indexMask
	e := t.slots[idx].Load()
	if e == nil || e.key != key {
		return 0, false
	}
	nk := t.freshKey(idx, binary.LittleEndian.Uint32(r[:]))
	t.slots[idx].Store(&entry[T]{key: nk, val: update(e.val, nk)})
	return nk, true
}

// Len returns the number of keys in the table.
func (t *Table[T]) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.n
}

// Range calls f with each key and value in the table, in slot order,
// until f returns false. It sees a consistent entry per slot, not a
// snapshot of the whole table.
func (t *Table[T]) Range(f func(key uint32, v T) bool) {
	for i := range t.slots {
		if e := t.slots[i].Load(); e != nil && !f(e.key, e.val) {
			return
		}
	}
}
