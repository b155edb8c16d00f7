package verbs

import (
	"fmt"
	"sync/atomic"

	"github.com/goverbs/goverbs/verbs/driver"
)

// MWType is the type of a memory window (enum ibv_mw_type).
type MWType = driver.MWType

// Memory window types.
const (
	// MWType1 windows are bound with QP.BindMW on any QP of their PD
	// and may be rebound while bound; an access through one is taken on
	// any QP of the PD.
	MWType1 = driver.MWType1
	// MWType2 windows are bound by an OpBindMW work request to the QP
	// it is posted on, only while unbound, and unbound by OpLocalInv or
	// the peer's OpSendWithInv; an access through one is taken only on
	// that QP.
	MWType2 = driver.MWType2
)

// MWBind is the binding an OpBindMW work request makes: Length bytes at
// Addr of the region whose lkey is LKey, granting Access through the
// window MW (set by MW.Bind; nil names the window by RKey, its current
// key). The region needs AccessMWBind, and AccessLocalWrite if the
// window grants AccessRemoteWrite or AccessRemoteAtomic; it need not
// have remote rights of its own.
//
//	type MWBind struct {
//		MW     driver.MW // the window's driver object
//		RKey   uint32
//		LKey   uint32
//		Addr   uint64
//		Length uint64
//		Access AccessFlags
//	}
type MWBind = driver.MWBind

// MW is a memory window (struct ibv_mw): a key that grants a peer a
// part of a registered region, with the rights the bind gives it, for as
// long as the window stays bound. A region registered without remote
// rights (AccessLocalWrite|AccessMWBind) is reached by peers through its
// windows alone. Revoking the window (OpLocalInv, the peer's
// OpSendWithInv, a rebind or Dealloc) ends the peer's access without
// touching the region or its own key. The region must have been
// registered with AccessMWBind.
type MW struct {
	pd      *PD
	d       driver.MW
	typ     MWType
	dealloc atomic.Bool
}

// AllocMW allocates an unbound memory window of type typ (ibv_alloc_mw).
// Devices without CapMemoryWindows refuse it with ErrUnsupported.
func (p *PD) AllocMW(typ MWType) (*MW, error) {
	a, ok := p.d.(driver.MWAllocator)
	if !ok || !p.ctx.attr.Has(CapMemoryWindows) {
		return nil, fmt.Errorf("verbs: alloc MW: %w (the device lacks CapMemoryWindows)", ErrUnsupported)
	}
	if typ != MWType1 && typ != MWType2 {
		return nil, fmt.Errorf("verbs: alloc MW of type %d: %w (MWType1 or MWType2)", typ, ErrInvalidArg)
	}
	d, err := a.AllocMW(typ)
	if err != nil {
		return nil, fmt.Errorf("verbs: alloc MW: %w", err)
	}
	p.users.add()
	return &MW{pd: p, d: d, typ: typ}, nil
}

// RKey is the window's current key, the one a peer uses. Each bind gives
// the window a new key, read here once the bind has completed; the key of
// an earlier binding fails from then on.
func (w *MW) RKey() uint32 { return w.d.RKey() }

// Type is the window's type.
func (w *MW) Type() MWType { return w.typ }

// PD returns the protection domain of the window.
func (w *MW) PD() *PD { return w.pd }

// Bind returns the OpBindMW work request that binds the window to
// length bytes at addr of mr with the rights access: post it on a QP of
// the window's PD (for a type 2 window, the QP whose peer is to use it).
// Once it has completed successfully, RKey is the window's new key. The
// request names the window itself, so that binds posted back to back
// execute in order, each rekeying the window again. A type 1 window is
// unbound with a zero length (mr may then be nil).
func (w *MW) Bind(wrid uint64, mr *MR, addr uint64, length uint64, access AccessFlags, flags SendFlags) SendWR {
	wr := SendWR{WRID: wrid, Opcode: OpBindMW, Flags: flags,
		Bind: MWBind{MW: w.d, RKey: w.d.RKey(), Addr: addr, Length: length, Access: access}}
	if mr != nil {
		wr.Bind.LKey = mr.LKey()
	}
	return wr
}

// Dealloc frees the window (ibv_dealloc_mw): access through its key
// fails from the moment Dealloc returns.
func (w *MW) Dealloc() error {
	w.pd.ctx.life.RLock()
	defer w.pd.ctx.life.RUnlock()
	if w.dealloc.Swap(true) {
		return fmt.Errorf("verbs: dealloc MW: %w", ErrClosed)
	}
	if err := w.pd.ctx.closedErr("dealloc MW"); err != nil {
		w.pd.users.done()
		return err
	}
	if err := w.d.Dealloc(); err != nil {
		w.dealloc.Store(false)
		return fmt.Errorf("verbs: dealloc MW: %w", err)
	}
	w.pd.users.done()
	return nil
}

// BindMW binds the type 1 window w as ibv_bind_mw does: it posts the
// OpBindMW work request of w.Bind on q, signaled when flags ask for it,
// and the window's new key is w.RKey() once that has completed. Type 2
// windows are bound by posting w.Bind's request with PostSend.
func (q *QP) BindMW(w *MW, wrid uint64, mr *MR, addr, length uint64, access AccessFlags, flags SendFlags) error {
	if w.typ != MWType1 {
		return fmt.Errorf("verbs: bind MW: %w: a type 2 window is bound by posting its Bind work request", ErrInvalidArg)
	}
	if w.dealloc.Load() {
		return fmt.Errorf("verbs: bind MW: %w: the window was deallocated", ErrClosed)
	}
	if w.pd != q.pd || (mr != nil && mr.pd != q.pd) {
		return fmt.Errorf("verbs: bind MW: %w: the window, the region and the QP must share one PD", ErrInvalidArg)
	}
	wr := [1]SendWR{w.Bind(wrid, mr, addr, length, access, flags)}
	if _, err := q.d.PostSend(wr[:]); err != nil {
		return fmt.Errorf("verbs: bind MW: %w", err)
	}
	return nil
}
