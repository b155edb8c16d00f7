package soft

import (
	"sync"

	"github.com/goverbs/goverbs/verbs/driver"
)

// Admit checks that a context (or PD) may take one more object of a kind
// of which it holds n and its device allows max: ErrClosed once closed
// (or released), ErrNoResources at the limit.
func Admit(closed bool, n, max int) error {
	if closed {
		return driver.ErrClosed
	}
	if n >= max {
		return driver.ErrNoResources
	}
	return nil
}

// Release ends an object counted in n, once: it marks it released and
// counts it out, or returns ErrClosed if it already was released.
func Release(released *bool, n *int) error {
	if *released {
		return driver.ErrClosed
	}
	*released = true
	*n--
	return nil
}

// PD is the life of a protection domain, which its context counts:
// Dealloc ends it once. The context's lock guards it.
type PD struct {
	mu       sync.Locker
	count    *int
	released bool
}

// NewPD admits one more PD in a context that holds *count of the max
// its device allows, counts it in, and returns its life, guarded by mu.
// ErrClosed once the context is closed; mu is held.
func NewPD(closed bool, count *int, max int, mu sync.Locker) (PD, error) {
	if err := Admit(closed, *count, max); err != nil {
		return PD{}, err
	}
	*count++
	return PD{mu: mu, count: count}, nil
}

// Dealloc ends the PD, or returns ErrClosed if it already was.
func (p *PD) Dealloc() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Release(&p.released, p.count)
}

// Released reports whether the PD was deallocated; the context's lock is
// held.
func (p *PD) Released() bool { return p.released }

// Within returns the bytes [addr, addr+n) of a region whose memory is buf
// and whose first byte is at base, and whether the region contains the
// whole range. An addr below base wraps past the region's end and is
// refused with the rest.
func Within(buf []byte, base, addr, n uint64) ([]byte, bool) {
	off := addr - base
	if off > uint64(len(buf)) || n > uint64(len(buf))-off {
		return nil, false
	}
	return buf[off : off+n], true
}
