// Package mempool is the pre-registered memory pool of the seed document's
// performance tip (section 4.2): register large regions once, at start, and
// hand out sub-buffers by offset at run time, so that no registration — and
// no allocation — happens on the data path.
//
// A Pool has size classes; each class is one registered region cut into
// equal buffers. Get returns the smallest free buffer that fits, as a Buf
// value that knows its lkey, rkey and address; Put gives it back. Both are
// safe for concurrent use and allocate nothing.
//
//	pool, _ := mempool.New(pd, mempool.Config{
//		Classes: []mempool.Class{{Size: 64, Count: 1024}, {Size: 4096, Count: 256}},
//		Access:  verbs.AccessLocalWrite | verbs.AccessRemoteRead,
//	})
//	b, _ := pool.Get(100) // a 4096-byte buffer
//	qp.PostSend([]verbs.SendWR{{Opcode: verbs.OpSend, SGList: []verbs.SGE{b.SGE(100)}}})
//	...
//	pool.Put(b)
package mempool

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"

	"github.com/goverbs/goverbs/verbs"
)

// Errors of the pool; test them with errors.Is.
var (
	// ErrExhausted: every buffer of every class that fits is in use.
	ErrExhausted = errors.New("mempool: no free buffer of that size: Put buffers back, or configure more (Class.Count)")
	// ErrTooLarge: no class holds that many bytes.
	ErrTooLarge = errors.New("mempool: no size class is that large: add a larger Class")
	// ErrNotInUse: Put of a buffer that is free already, or not the pool's.
	ErrNotInUse = errors.New("mempool: buffer is not in use (put twice, or from another pool)")
)

// Class is a size class: Count buffers of Size bytes each.
type Class struct {
	Size  int
	Count int
}

// Config configures a Pool.
type Config struct {
	// Classes are the buffer sizes and how many of each; at least one.
	Classes []Class
	// Access is the access every region is registered with.
	Access verbs.AccessFlags
	// Align rounds every buffer size up to a multiple of Align bytes
	// (default 64, a cache line; atomics need at least 8).
	Align int
}

// Pool hands out buffers of registered memory.
type Pool struct {
	classes []*class
}

type class struct {
	size int
	mr   *verbs.MR
	mu   sync.Mutex
	free []int32 // stack of free buffer indices
	used []bool
	gen  []uint32 // how many times each buffer was handed out: a Buf
	// carries the count of its Get, so that a stale copy of it is told
	// from the buffer's new owner
}

// New registers one region per class on pd (the only registrations the
// pool ever makes) and returns the pool.
func New(pd *verbs.PD, cfg Config) (*Pool, error) {
	if len(cfg.Classes) == 0 {
		return nil, fmt.Errorf("mempool: %w: no size classes", verbs.ErrInvalidArg)
	}
	align := cfg.Align
	if align == 0 {
		align = 64
	}
	if align < 1 || align&(align-1) != 0 {
		return nil, fmt.Errorf("mempool: %w: Align %d is not a power of two", verbs.ErrInvalidArg, align)
	}
	cs := append([]Class(nil), cfg.Classes...)
	sort.Slice(cs, func(i, j int) bool { return cs[i].Size < cs[j].Size })
	p := &Pool{}
	for _, c := range cs {
		size := (c.Size + align - 1) &^ (align - 1) // the buffer, aligned
		if c.Size <= 0 || c.Count <= 0 || c.Count > 1<<30 || c.Size > math.MaxInt-align || size > math.MaxInt/c.Count {
			p.Close()
			return nil, fmt.Errorf("mempool: %w: class %+v (sizes and counts above 0, at most 2^30 buffers, and their aligned bytes must fit an int)", verbs.ErrInvalidArg, c)
		}
		mr, err := pd.AllocMR(size*c.Count, cfg.Access)
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("mempool: register %d buffers of %d bytes: %w", c.Count, size, err)
		}
		cl := &class{size: size, mr: mr, free: make([]int32, c.Count), used: make([]bool, c.Count), gen: make([]uint32, c.Count)}
		for i := range cl.free {
			cl.free[i] = int32(c.Count - 1 - i)
		}
		p.classes = append(p.classes, cl)
	}
	return p, nil
}

// Buf is a buffer of the pool: Len bytes at offset Off of a registered
// region. It is a plain value; copy it freely, Put it once.
type Buf struct {
	cl  *class
	idx int32
	gen uint32 // the class's gen[idx] when Get handed it out
}

// Bytes is the buffer's memory.
func (b Buf) Bytes() []byte {
	off := int(b.idx) * b.cl.size
	return b.cl.mr.Bytes()[off : off+b.cl.size : off+b.cl.size]
}

// Len is the buffer's size (its class's size).
func (b Buf) Len() int { return b.cl.size }

// Off is the buffer's offset in its region.
func (b Buf) Off() int { return int(b.idx) * b.cl.size }

// Addr is the buffer's address, as SGEs and peers name it.
func (b Buf) Addr() uint64 { return b.cl.mr.Addr() + uint64(b.Off()) }

// LKey is the local key of the buffer's region.
func (b Buf) LKey() uint32 { return b.cl.mr.LKey() }

// RKey is the remote key of the buffer's region.
func (b Buf) RKey() uint32 { return b.cl.mr.RKey() }

// MR is the registered region the buffer lies in.
func (b Buf) MR() *verbs.MR { return b.cl.mr }

// SGE returns the scatter/gather element of the buffer's first n bytes.
func (b Buf) SGE(n int) verbs.SGE {
	return verbs.SGE{Addr: b.Addr(), Length: uint32(min(n, b.cl.size)), LKey: b.cl.mr.LKey()}
}

// Valid reports whether b came from Get (the zero Buf did not).
func (b Buf) Valid() bool { return b.cl != nil }

// Get returns a free buffer of at least n bytes from the smallest class
// that has one, or ErrTooLarge / ErrExhausted.
func (p *Pool) Get(n int) (Buf, error) {
	fits := false
	for _, c := range p.classes {
		if c.size < n {
			continue
		}
		fits = true
		c.mu.Lock()
		if k := len(c.free); k > 0 {
			idx := c.free[k-1]
			c.free = c.free[:k-1]
			c.used[idx] = true
			c.gen[idx]++
			gen := c.gen[idx]
			c.mu.Unlock()
			return Buf{cl: c, idx: idx, gen: gen}, nil
		}
		c.mu.Unlock()
	}
	if !fits {
		return Buf{}, ErrTooLarge
	}
	return Buf{}, ErrExhausted
}

// Put returns b to the pool. Putting a buffer twice is refused with
// ErrNotInUse, so that it is never handed out twice: so is a copy of b
// put after the buffer was put and handed out again.
func (p *Pool) Put(b Buf) error {
	c := b.cl
	if c == nil || b.idx < 0 || int(b.idx) >= len(c.used) {
		return ErrNotInUse
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.used[b.idx] || c.gen[b.idx] != b.gen {
		return ErrNotInUse
	}
	c.used[b.idx] = false
	c.free = append(c.free, b.idx)
	return nil
}

// Stats reports, per class, its buffer size, count and how many are free.
func (p *Pool) Stats() []ClassStats {
	out := make([]ClassStats, len(p.classes))
	for i, c := range p.classes {
		c.mu.Lock()
		out[i] = ClassStats{Size: c.size, Count: len(c.used), Free: len(c.free)}
		c.mu.Unlock()
	}
	return out
}

// ClassStats describes one size class.
type ClassStats struct {
	Size, Count, Free int
}

// Close deregisters every region. Buffers still out must not be used.
func (p *Pool) Close() error {
	var first error
	for _, c := range p.classes {
		if err := c.mr.Dereg(); err != nil && first == nil {
			first = err
		}
	}
	p.classes = nil
	return first
}
