// Package loop is the in-process provider of goverbs, device "loop0": the
// reference implementation of the semantics every provider honours. Both
// ends of a connection live in the same process; the requester executes
// each work request itself, copying directly between the two registered
// buffers, as a NIC's DMA engine would.
//
// Simple and obviously correct beats fast here: one mutex serialises the
// whole in-process fabric, so every operation is atomic with respect to
// every other, and the engine is split, as Linux's rxe is, into a requester
// (requester.go), a responder (responder.go) and completion handling
// (cq.go).
//
// Import it for its side effect:
//
//	import _ "github.com/goverbs/goverbs/provider/loop"
//
// Connections are made with cm at loop://name, or by hand with QP.Modify
// and QPAttr.DestQPNum naming the peer QP.
//
// Deviation from ibverbs, for memory safety: an inline SGE must still lie
// inside a region registered on the QP's protection domain (its lkey is
// used to find it), because Go code cannot read arbitrary addresses.
package loop

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"unsafe"

	"github.com/goverbs/goverbs/internal/grant"
	"github.com/goverbs/goverbs/internal/keytab"
	"github.com/goverbs/goverbs/internal/sglist"
	"github.com/goverbs/goverbs/internal/soft"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/driver"
)

// DeviceName is the name of the loop device.
const DeviceName = "loop0"

// maxSGE bounds scatter/gather lists, so that resolved lists fit in arrays
// on the stack.
const maxSGE = sglist.Max

func init() {
	verbs.Register("loop", &provider{})
}

// fabric is the in-process network: every loop QP, listener and key table,
// behind one mutex.
type fabric struct {
	mu        sync.Mutex
	qps       map[uint32]*qp
	nextQPN   uint32
	listeners map[string]*listener
}

var fab = &fabric{qps: map[uint32]*qp{}, nextQPN: 0x11, listeners: map[string]*listener{}}

var deviceAttr = soft.DeviceAttr(DeviceName, "loop", soft.Limits{MaxMRSize: 1 << 34, MaxSGE: maxSGE,
	MaxQP: 1 << 14, MaxCQ: 1 << 14, MaxMR: keytab.MaxLen, MaxPD: 1 << 14, MaxSRQ: 1 << 14, MaxPrivateData: 196,
	Caps: driver.CapRNRRetry})

type provider struct{}

func (*provider) Devices() []driver.DeviceInfo {
	return []driver.DeviceInfo{{Name: DeviceName, Provider: "loop", Transport: "loop", GUID: 0x676f766572620001}}
}

func (*provider) Open(name string) (driver.Context, error) {
	return soft.Open(name, DeviceName, func() (driver.Context, error) {
		return &devCtx{EventQueue: soft.NewEventQueue()}, nil
	})
}

// devCtx is an open loop device. Its fields are guarded by fab.mu.
type devCtx struct {
	soft.EventQueue                                // Events, and Event to deliver one
	mrs             keytab.Table[grant.Entry[*mr]] // regions and windows, by key
	mappings        []*mapping                     // AllocMR memory with regions in it, by address
	pds             int
	cqs             []*cq
	qps             []*qp
	srqs            int
	closed          bool
}

func (c *devCtx) QueryDevice() driver.DeviceAttr { return deviceAttr }

func (c *devCtx) AllocPD() (driver.PD, error) {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	life, err := soft.NewPD(c.closed, &c.pds, deviceAttr.MaxPD, &fab.mu)
	if err != nil {
		return nil, err
	}
	return &pd{PD: life, ctx: c}, nil
}

// Close destroys every QP (breaking their connections), invalidates every
// key and stops every CQ.
func (c *devCtx) Close() error {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	for _, q := range slices.Clone(c.qps) {
		q.destroy()
	}
	c.mrs.Range(func(key uint32, e grant.Entry[*mr]) bool {
		if m := e.MR; m != nil {
			m.ext.Revoke()
			m.release()
		}
		c.mrs.Remove(key)
		return true
	})
	for _, cq := range c.cqs {
		cq.DestroyLocked()
	}
	return nil
}

type pd struct {
	soft.PD // Dealloc; guarded by the context's lock
	ctx     *devCtx
}

// mr is a registered region. Its key serves as both lkey and rkey; the
// context's key table (internal/keytab) makes it: 32 random bits, so that
// stale and guessed keys miss.
type mr struct {
	ctx     *devCtx
	pd      *pd
	key     uint32
	buf     []byte
	addr    uint64
	access  driver.AccessFlags
	ext     grant.Extent // revoked at Dereg or the context's Close
	mapping *mapping     // the AllocMR memory the region lies in, or nil
}

// mapping is memory AllocMR took from the kernel, outside the Go heap, as
// a NIC's driver would: page-aligned (so atomics are aligned), and — as
// for DMA — not watched by the race detector, which would otherwise report
// every one-sided access that races a local write, the very thing
// one-sided protocols detect and retry. It is unmapped when the last
// region registered in it is deregistered.
type mapping struct {
	mem  []byte
	refs int
}

func (p *pd) AllocMR(size int, access driver.AccessFlags) (driver.MR, error) {
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", driver.ErrNoResources, err)
	}
	mp := &mapping{mem: mem}
	m, err := p.register(mem[:size], access, mp)
	if err != nil {
		syscall.Munmap(mem)
	}
	return m, err
}

func (p *pd) RegMR(buf []byte, access driver.AccessFlags) (driver.MR, error) {
	return p.register(buf, access, nil)
}

// release drops a region's hold on its mapping; fab.mu is held.
func (m *mr) release() {
	if mp := m.mapping; mp != nil {
		m.mapping = nil
		if mp.refs--; mp.refs == 0 {
			c := m.ctx
			if i, ok := c.mappingIndex(mp.base()); ok {
				c.mappings = slices.Delete(c.mappings, i, i+1)
			}
			syscall.Munmap(mp.mem)
		}
	}
}

func (mp *mapping) base() uintptr { return uintptr(unsafe.Pointer(&mp.mem[0])) }

// mappingIndex returns the index in c.mappings of the last mapping that
// starts at or below addr, and whether there is one; fab.mu is held.
func (c *devCtx) mappingIndex(addr uintptr) (int, bool) {
	i, found := slices.BinarySearchFunc(c.mappings, addr, func(mp *mapping, a uintptr) int { return cmp.Compare(mp.base(), a) })
	if found {
		return i, true
	}
	return i - 1, i > 0
}

// mappingOf finds the AllocMR mapping of c that contains buf; fab.mu is held.
func (c *devCtx) mappingOf(buf []byte) *mapping {
	start := uintptr(unsafe.Pointer(&buf[0]))
	i, ok := c.mappingIndex(start)
	if !ok {
		return nil
	}
	mp := c.mappings[i]
	if start-mp.base()+uintptr(len(buf)) <= uintptr(len(mp.mem)) {
		return mp
	}
	return nil
}

func (p *pd) register(buf []byte, access driver.AccessFlags, mp *mapping) (driver.MR, error) {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	c := p.ctx
	if c.closed || p.Released() {
		return nil, driver.ErrClosed
	}
	var m *mr
	_, err := c.mrs.Insert(func(key uint32) grant.Entry[*mr] {
		addr := uint64(uintptr(unsafe.Pointer(&buf[0])))
		m = &mr{ctx: c, pd: p, key: key, buf: buf, addr: addr, access: access,
			ext: grant.Extent{Addr: addr, Len: uint64(len(buf)), Access: access, PD: p}}
		return grant.RegionEntry(m)
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", driver.ErrNoResources, err)
	}
	if mp == nil {
		// A region inside AllocMR memory keeps that memory mapped.
		mp = c.mappingOf(buf)
	}
	if mp != nil {
		if mp.refs++; mp.refs == 1 {
			i, _ := c.mappingIndex(mp.base())
			c.mappings = slices.Insert(c.mappings, i+1, mp)
		}
	}
	m.mapping = mp
	return m, nil
}

func (m *mr) LKey() uint32               { return m.key }
func (m *mr) RKey() uint32               { return m.key }
func (m *mr) Addr() uint64               { return m.addr }
func (m *mr) Bytes() []byte              { return m.buf }
func (m *mr) Access() driver.AccessFlags { return m.access }

func (m *mr) Dereg() error {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	if m.ext.Revoked() {
		return driver.ErrClosed
	}
	m.ext.Revoke()
	m.ctx.mrs.Remove(m.key)
	m.release()
	return nil
}

// Extent implements grant.Region.
func (m *mr) Extent() *grant.Extent { return &m.ext }

// span returns the bytes [addr, addr+n) that key grants need on, for an
// access arriving on QP q of p (nil: a local access, by lkey).
func (c *devCtx) span(key uint32, p *pd, q *qp, addr, n uint64, need driver.AccessFlags) ([]byte, bool) {
	var m *mr
	var f grant.Fault
	if q == nil {
		m, f = grant.CheckLocal(&c.mrs, key, p, addr, n, need)
	} else {
		m, f = grant.Check(&c.mrs, key, p, q, addr, n, need)
	}
	if f != grant.OK {
		return nil, false
	}
	off := addr - m.addr
	return m.buf[off : off+n], true
}

// mw is a memory window; internal/grant keeps its state.
type mw struct {
	*grant.Window[*mr] // RKey, Type, GrantWindow
}

// AllocMW implements driver.MWAllocator.
func (p *pd) AllocMW(typ driver.MWType) (driver.MW, error) {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	if p.ctx.closed || p.Released() {
		return nil, driver.ErrClosed
	}
	w, err := grant.AllocMW(&p.ctx.mrs, typ, p)
	if err != nil {
		return nil, err
	}
	return &mw{Window: w}, nil
}

func (w *mw) Dealloc() error {
	fab.mu.Lock()
	defer fab.mu.Unlock()
	_, _, err := w.Window.Dealloc(&w.PD().(*pd).ctx.mrs)
	return err
}
