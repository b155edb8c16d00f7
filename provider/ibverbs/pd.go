package ibverbs

import (
	"fmt"
	"maps"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/verbs/driver"
)

// pd is a protection domain (struct ibv_pd) and the objects made on it.
type pd struct {
	ctx *devContext
	p   uintptr

	mu   sync.RWMutex
	dead bool
	mrs  map[*mr]struct{}
	// byLKey finds a region by its local key: an inline payload, which
	// the device reads at post time, must lie in one (as on every
	// provider), so that a bad address is refused rather than read.
	byLKey map[uint32]*mr
	// regions counts the changes of byLKey (addRegion, dropRegion): a
	// QP's cache of the region an inline payload lay in holds while it
	// is unchanged.
	regions atomic.Uint64
	qps     map[*qp]struct{}
	srqs    map[*srq]struct{}
	// mws are the PD's memory windows, byRKey the same by current key
	// (mw.go); nil until the first AllocMW.
	mws    map[*mw]struct{}
	byRKey map[uint32]*mw
}

// alloc is memory AllocMR mapped. It is unmapped once its own region is
// deregistered and no region registered inside it with RegMR remains.
type alloc struct {
	mem  []byte
	refs int // regions registered inside mem, its own included
}

// mr is a registered memory region (struct ibv_mr).
type mr struct {
	pd     *pd
	p      uintptr
	buf    []byte
	access driver.AccessFlags
	lkey   uint32
	rkey   uint32
	pin    runtime.Pinner
	in     *alloc // the AllocMR memory buf lies in, if any
	dead   bool
}

func (d *pd) AllocMR(size int, access driver.AccessFlags) (driver.MR, error) {
	if size <= 0 {
		return nil, fmt.Errorf("%w: region of %d bytes", driver.ErrInvalidArg, size)
	}
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("ibverbs: mmap %d bytes: %w: %w", size, driver.ErrNoResources, err)
	}
	a := &alloc{mem: mem}
	d.ctx.mu.Lock()
	d.ctx.allocs = append(d.ctx.allocs, a)
	d.ctx.mu.Unlock()
	m, err := d.register(mem, access, a)
	if err != nil {
		d.ctx.release(a)
		return nil, err
	}
	return m, nil
}

func (d *pd) RegMR(buf []byte, access driver.AccessFlags) (driver.MR, error) {
	if len(buf) == 0 {
		return nil, fmt.Errorf("%w: empty region", driver.ErrInvalidArg)
	}
	return d.register(buf, access, d.ctx.allocOf(buf))
}

// register registers buf, which lies in a (nil for Go memory).
func (d *pd) register(buf []byte, access driver.AccessFlags, a *alloc) (*mr, error) {
	if access&(driver.AccessRemoteWrite|driver.AccessRemoteAtomic) != 0 && access&driver.AccessLocalWrite == 0 {
		return nil, fmt.Errorf("%w: remote write and atomic access need AccessLocalWrite", driver.ErrInvalidArg)
	}
	if access&driver.AccessMWBind != 0 && d.ctx.attr.Caps&driver.CapMemoryWindows == 0 {
		return nil, fmt.Errorf("%w: %s has no memory windows", driver.ErrUnsupported, d.ctx.name)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dead {
		return nil, driver.ErrClosed
	}
	m := &mr{pd: d, buf: buf, access: access, in: a}
	m.pin.Pin(&buf[0])
	p, err := callPtr(lib.regMR, d.p, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(access))
	if err != nil {
		m.pin.Unpin()
		return nil, errnoErr("ibv_reg_mr", err)
	}
	m.p = p
	m.lkey = *(*uint32)(cptr(p + offMRLKey))
	m.rkey = *(*uint32)(cptr(p + offMRRKey))
	if a != nil {
		d.ctx.mu.Lock()
		a.refs++
		d.ctx.mu.Unlock()
	}
	d.mrs[m] = struct{}{}
	d.addRegion(m)
	return m, nil
}

// allocOf returns the AllocMR memory buf lies in, or nil.
func (c *devContext) allocOf(buf []byte) *alloc {
	p := uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, a := range c.allocs {
		start := uintptr(unsafe.Pointer(unsafe.SliceData(a.mem)))
		if p >= start && p+uintptr(len(buf)) <= start+uintptr(len(a.mem)) {
			return a
		}
	}
	return nil
}

// release drops a reference to a, unmapping it at the last.
func (c *devContext) release(a *alloc) {
	c.mu.Lock()
	if a.refs > 0 {
		a.refs--
	}
	last := a.refs == 0
	if last {
		for i, x := range c.allocs {
			if x == a {
				c.allocs = append(c.allocs[:i], c.allocs[i+1:]...)
				break
			}
		}
	}
	c.mu.Unlock()
	if last {
		unix.Munmap(a.mem)
	}
}

func (m *mr) LKey() uint32               { return m.lkey }
func (m *mr) RKey() uint32               { return m.rkey }
func (m *mr) Addr() uint64               { return uint64(uintptr(unsafe.Pointer(&m.buf[0]))) }
func (m *mr) Bytes() []byte              { return m.buf }
func (m *mr) Access() driver.AccessFlags { return m.access }

func (m *mr) Dereg() error {
	d := m.pd
	d.mu.Lock()
	defer d.mu.Unlock()
	return m.dereg()
}

// dereg deregisters m; d.mu is held.
func (m *mr) dereg() error {
	if m.dead {
		return driver.ErrClosed
	}
	if err := callInt(lib.deregMR, m.p); err != nil {
		if err == syscall.EINVAL && len(m.pd.mws) > 0 {
			return windowBoundErr(err)
		}
		return errnoErr("ibv_dereg_mr", err)
	}
	m.dead = true
	delete(m.pd.mrs, m)
	m.pd.dropRegion(m)
	m.pin.Unpin()
	if m.in != nil {
		m.pd.ctx.release(m.in)
	}
	return nil
}

func (d *pd) Dealloc() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dead {
		return driver.ErrClosed
	}
	if len(d.mrs)+len(d.qps)+len(d.srqs)+len(d.mws) > 0 {
		return fmt.Errorf("%w: the PD still has %d MRs, %d MWs, %d QPs and %d SRQs", driver.ErrBusy, len(d.mrs), len(d.mws), len(d.qps), len(d.srqs))
	}
	if err := callInt(lib.deallocPD, d.p); err != nil {
		return errnoErr("ibv_dealloc_pd", err)
	}
	d.dead = true
	d.ctx.mu.Lock()
	delete(d.ctx.pds, d)
	d.ctx.mu.Unlock()
	return nil
}

// destroyAll destroys the PD's QPs, SRQs and MRs, then the PD: the
// context is closing.
func (d *pd) destroyAll() {
	d.mu.Lock()
	qps := slices.Collect(maps.Keys(d.qps))
	srqs := slices.Collect(maps.Keys(d.srqs))
	// Windows first: a type 2 window bound to a QP holds it, and a
	// device (rxe) then waits for the window in vain when the QP is
	// destroyed.
	for w := range d.mws {
		w.dealloc()
	}
	d.mu.Unlock()
	destroyEach(qps)
	destroyEach(srqs)
	d.mu.Lock()
	for m := range d.mrs {
		m.dereg()
	}
	d.mu.Unlock()
	d.Dealloc()
}

// destroyEach destroys each of objs: a snapshot, taken under a lock that
// Destroy takes itself.
func destroyEach[T interface{ Destroy() error }](objs []T) {
	for _, o := range objs {
		o.Destroy()
	}
}

// addRegion makes m findable by its lkey; d.mu is held.
func (d *pd) addRegion(m *mr) {
	d.byLKey[m.lkey] = m
	d.regions.Add(1)
}

// dropRegion makes m, deregistered, no longer findable; d.mu is held.
func (d *pd) dropRegion(m *mr) {
	if d.byLKey[m.lkey] == m {
		delete(d.byLKey, m.lkey)
	}
	d.regions.Add(1)
}

// inlineOK reports whether every SGE of an inline payload lies inside a
// live region of the PD with the SGE's local key.
func (d *pd) inlineOK(sg []driver.SGE) bool {
	d.mu.RLock()
	defer d.mu.RUnlock()
	for i := range sg {
		g := &sg[i]
		if g.Length == 0 {
			continue
		}
		if m := d.byLKey[g.LKey]; m == nil || !m.holds(g) {
			return false
		}
	}
	return true
}

// holds reports whether g's bytes lie inside m (its lkey aside).
func (m *mr) holds(g *driver.SGE) bool {
	start := uint64(uintptr(unsafe.Pointer(&m.buf[0])))
	end := g.Addr + uint64(g.Length)
	return g.Addr >= start && end <= start+uint64(len(m.buf)) && end >= g.Addr
}
