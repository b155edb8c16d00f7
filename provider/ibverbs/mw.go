package ibverbs

import (
	"crypto/rand"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/goverbs/goverbs/verbs/driver"
)

// Memory windows. A window is allocated and freed through the device
// context's ops (ibv_alloc_mw and ibv_dealloc_mw are inline in verbs.h).
// A type 1 window is bound with the context's bind_mw (ibv_bind_mw), which
// posts the bind on the QP's send queue and chooses the new key itself (rxe
// and mlx5 step the low byte, as ibv_inc_rkey does). A type 2 window is
// bound by an IBV_WR_BIND_MW work request whose new key the provider draws:
// the window's index with a random low byte, differing from the old one.
//
// The window's key, as MW.RKey reports it, changes when the bind has
// completed successfully: each QP keeps its binds in flight in posting
// order, and the completion that retires one commits or drops its key.

// ibvMWBindInfo is struct ibv_mw_bind_info.
type ibvMWBindInfo struct {
	mr     uintptr
	addr   uint64
	length uint64
	access uint32
	_      uint32
}

// ibvBindMW is the bind_mw member of struct ibv_send_wr.
type ibvBindMW struct {
	mw   uintptr
	rkey uint32
	_    uint32
	info ibvMWBindInfo
}

// ibvMWBind is struct ibv_mw_bind, the argument of ibv_bind_mw.
type ibvMWBind struct {
	wrID      uint64
	sendFlags uint32
	_         uint32
	info      ibvMWBindInfo
}

// Offsets and values for memory windows (checked by layout_test.go).
const (
	offContextAllocMW   = 64 // struct ibv_context.ops.alloc_mw
	offContextBindMW    = 72 // struct ibv_context.ops.bind_mw
	offContextDeallocMW = 80 // struct ibv_context.ops.dealloc_mw
	offMWRKey           = 16 // struct ibv_mw.rkey

	ibvDeviceMemWindow      = 1 << 17 // IBV_DEVICE_MEM_WINDOW
	ibvDeviceMemWindowType2 = 1<<23 | 1<<24

	// rxeVendorID is the vendor_id rxe reports.
	rxeVendorID = 0xffffff
	// siwVendorID is the vendor_id siw reports ("bmt").
	siwVendorID = 0x626d74
	// kernelWCWithInv is the kernel's IB_WC_WITH_INVALIDATE, which is
	// IBV_WC_IP_CSUM_OK in libibverbs' numbering.
	kernelWCWithInv = 1 << 2
)

// invalidated reports the invalidation of a receive completion that rxe
// flags with the kernel's bit: rxe writes the kernel's completion flags
// into the user's queue as they are, and IBV_WC_WITH_INV (1<<3) is the
// kernel's IB_WC_IP_CSUM_OK, which rxe never sets. The checksum flag
// does not apply to RC, the only QP type of the provider.
func (c *devContext) invalidated(w *driver.WorkCompletion, wc *ibvWC) {
	if c.kernelInvFlag && w.Status == driver.WCSuccess && w.Opcode == driver.WCRecv && wc.wcFlags&kernelWCWithInv != 0 {
		w.Flags |= driver.WCWithInv
		w.InvalidatedRKey = wc.immData
	}
}

// mwCaps reports whether a device whose ibv_device_attr.device_cap_flags
// are flags, and whose context ops are at ctx, has memory windows of both
// types.
func mwCaps(flags uint32, ctx uintptr) bool {
	return flags&ibvDeviceMemWindow != 0 && flags&ibvDeviceMemWindowType2 != 0 &&
		*(*uintptr)(cptr(ctx + offContextAllocMW)) != 0 &&
		*(*uintptr)(cptr(ctx + offContextBindMW)) != 0 &&
		*(*uintptr)(cptr(ctx + offContextDeallocMW)) != 0
}

// mw is a memory window (struct ibv_mw).
type mw struct {
	pd  *pd
	p   uintptr
	typ driver.MWType
	key atomic.Uint32 // the key of the latest completed bind
	// dead is set by Dealloc, with pd.mu held.
	dead bool
}

func (d *pd) AllocMW(typ driver.MWType) (driver.MW, error) {
	if d.ctx.attr.Caps&driver.CapMemoryWindows == 0 {
		return nil, fmt.Errorf("%w: %s has no memory windows", driver.ErrUnsupported, d.ctx.name)
	}
	if typ != driver.MWType1 && typ != driver.MWType2 {
		return nil, fmt.Errorf("%w: window type %d", driver.ErrInvalidArg, typ)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dead {
		return nil, driver.ErrClosed
	}
	p, err := callPtr(*(*uintptr)(cptr(d.ctx.p + offContextAllocMW)), d.p, uintptr(typ))
	if err != nil {
		return nil, errnoErr("ibv_alloc_mw", err)
	}
	w := &mw{pd: d, p: p, typ: typ}
	w.key.Store(*(*uint32)(cptr(p + offMWRKey)))
	if d.mws == nil {
		d.mws, d.byRKey = map[*mw]struct{}{}, map[uint32]*mw{}
	}
	d.mws[w] = struct{}{}
	d.byRKey[w.key.Load()] = w
	return w, nil
}

func (w *mw) RKey() uint32        { return w.key.Load() }
func (w *mw) Type() driver.MWType { return w.typ }

func (w *mw) Dealloc() error {
	d := w.pd
	d.mu.Lock()
	defer d.mu.Unlock()
	return w.dealloc()
}

// dealloc frees w; pd.mu is held.
func (w *mw) dealloc() error {
	if w.dead {
		return driver.ErrClosed
	}
	if err := callInt(*(*uintptr)(cptr(w.pd.ctx.p + offContextDeallocMW)), w.p); err != nil {
		return errnoErr("ibv_dealloc_mw", err)
	}
	w.dead = true
	delete(w.pd.mws, w)
	if w.pd.byRKey[w.key.Load()] == w {
		delete(w.pd.byRKey, w.key.Load())
	}
	return nil
}

// windowBoundErr is the error of a Dereg the device refused with err while
// the PD has windows: rxe refuses to deregister a region that a window is
// bound to.
func windowBoundErr(err error) error {
	return fmt.Errorf("ibverbs: ibv_dereg_mr: %v: the device keeps a region registered while a memory window is bound to it (invalidate or deallocate its windows first): %w", err, driver.ErrBusy)
}

// bindTarget finds the window and the region an OpBindMW work request
// names, in q's PD. The device checks the rest (the range, AccessMWBind
// on the region, and AccessLocalWrite on it for a window granting remote
// write or atomics) and completes a bind that breaks them in error.
func (q *qp) bindTarget(wr *driver.SendWR) (*mw, *mr, error) {
	d := q.pd
	d.mu.RLock()
	defer d.mu.RUnlock()
	w := d.byRKey[wr.Bind.RKey]
	if w == nil || w.dead {
		return nil, nil, fmt.Errorf("%w: OpBindMW names the key %#x, which is no window of the QP's PD", driver.ErrInvalidArg, wr.Bind.RKey)
	}
	m := d.byLKey[wr.Bind.LKey]
	if m == nil || m.dead {
		return nil, nil, fmt.Errorf("%w: OpBindMW names the local key %#x, which is no region of the QP's PD (an unbind on this provider names the region too)", driver.ErrInvalidArg, wr.Bind.LKey)
	}
	if a := wr.Bind.Access; a&^driver.RemoteAccess != 0 {
		return nil, nil, fmt.Errorf("%w: a window grants remote rights only, not %v", driver.ErrInvalidArg, a)
	}
	return w, m, nil
}

// pendingBind is a bind posted on a QP and not yet completed.
type pendingBind struct {
	seq uint64 // the bind's place in the send queue (qp.sqPosted's count)
	w   *mw
	key uint32 // the new key; 0 for a type 1 bind, whose key the device library chose
}

// mwQueue is a QP's state for binding windows.
type mwQueue struct {
	// pending holds the binds in flight in posting order, a ring of
	// MaxSendWR+1 entries; it is guarded by qp.sqMu.
	pending    []pendingBind
	head, size int
	// staged are the windows and new keys of the type 2 binds in the
	// batch PostSend is building (sendMu).
	staged [postBatch]pendingBind
	arg    ibvMWBind // ibv_bind_mw's argument (sendMu)
	rnd    [1]byte
}

// newKey draws the key of a type 2 window's next binding: the window's
// index with a random low byte that differs from the current one.
func (m *mwQueue) newKey(old uint32) uint32 {
	for {
		if _, err := rand.Read(m.rnd[:]); err != nil {
			panic("ibverbs: crypto/rand: " + err.Error())
		}
		if m.rnd[0] != byte(old) {
			return old&^0xff | uint32(m.rnd[0])
		}
	}
}

// stageBind fills the bind_mw member of c for the type 2 bind wr of w to m
// and remembers it as the i-th WR of the batch.
func (q *qp) stageBind(i int, c *ibvSendWR, wr *driver.SendWR, w *mw, m *mr) {
	key := q.mwq.newKey(w.key.Load())
	c.bindMW = ibvBindMW{mw: w.p, rkey: key, info: ibvMWBindInfo{mr: m.p, addr: wr.Bind.Addr, length: wr.Bind.Length, access: uint32(wr.Bind.Access)}}
	q.mwq.staged[i] = pendingBind{w: w, key: key}
}

// bindPosted records the binds among wrs, the batch just counted by
// sentWRs, whose first WR is the send queue's first+1-th. It runs before
// the post so that a completion polled at once finds them.
func (q *qp) bindPosted(wrs []driver.SendWR, first uint64) {
	q.sqMu.Lock()
	defer q.sqMu.Unlock()
	for i := range wrs {
		if wrs[i].Opcode != driver.OpBindMW {
			continue
		}
		b := q.mwq.staged[i]
		b.seq = first + uint64(i) + 1
		q.pushBind(b)
	}
}

// pushBind appends b to the ring; sqMu is held.
func (q *qp) pushBind(b pendingBind) {
	m := &q.mwq
	if m.pending == nil {
		m.pending = make([]pendingBind, q.cap.MaxSendWR+1)
	}
	if m.size == len(m.pending) {
		return // cannot happen: the send queue holds fewer WRs
	}
	m.pending[(m.head+m.size)%len(m.pending)] = b
	m.size++
}

// bindUnsent forgets the binds the device refused, those after the send
// queue's posted count (unsent calls it); sqMu is held.
func (q *qp) bindUnsent() {
	m := &q.mwq
	for m.size > 0 && m.pending[(m.head+m.size-1)%len(m.pending)].seq > q.sqPosted.Load() {
		m.size--
	}
}

// bindsRetired settles the binds the send queue has retired: committed
// when the retiring completion succeeded, dropped when it failed or was
// flushed; sqMu is held.
func (q *qp) bindsRetired(ok bool) {
	m := &q.mwq
	r := q.sqRetired.Load()
	for m.size > 0 && m.pending[m.head].seq <= r {
		b := m.pending[m.head]
		m.pending[m.head] = pendingBind{}
		m.head = (m.head + 1) % len(m.pending)
		m.size--
		q.pd.settleBind(b, ok)
	}
}

// settleBind gives b's window its new key if the bind succeeded; if it
// failed, a type 1 window's struct ibv_mw gets back the key the device
// library moved on at post time.
func (d *pd) settleBind(b pendingBind, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	w := b.w
	if w.dead {
		return
	}
	rkey := (*uint32)(cptr(w.p + offMWRKey))
	if !ok {
		if w.typ == driver.MWType1 {
			*rkey = w.key.Load()
		}
		return
	}
	key := b.key
	if w.typ == driver.MWType1 {
		key = *rkey
	} else {
		*rkey = key
	}
	if d.byRKey[w.key.Load()] == w {
		delete(d.byRKey, w.key.Load())
	}
	w.key.Store(key)
	d.byRKey[key] = w
}

// bindType1 binds a type 1 window with the context's bind_mw, as the
// send queue's next WR.
func (q *qp) bindType1(wrs []driver.SendWR, w *mw, m *mr) error {
	wr := &wrs[0]
	first := q.sqPosted.Load()
	q.sentWRs(wrs)
	q.sqMu.Lock()
	q.pushBind(pendingBind{seq: first + 1, w: w})
	q.sqMu.Unlock()
	q.mwq.arg = ibvMWBind{wrID: wr.WRID, sendFlags: uint32(wr.Flags),
		info: ibvMWBindInfo{mr: m.p, addr: wr.Bind.Addr, length: wr.Bind.Length, access: uint32(wr.Bind.Access)}}
	r := int32(call3(*(*uintptr)(cptr(q.ctx.p + offContextBindMW)), q.p, w.p, uintptr(unsafe.Pointer(&q.mwq.arg))))
	if r != 0 {
		q.unsent(wrs)
		return postErr("ibv_bind_mw", r)
	}
	return nil
}
