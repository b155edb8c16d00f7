// Package grant is what a key grants on the software providers: the one
// check every remote access makes (key → region or memory window →
// protection domain, QP, bounds and rights), and the memory windows of
// the verbs — their binding, invalidation and deallocation — shared by
// loop0, shm0 and tcp0.
//
// A provider keeps its keys in a keytab.Table[Entry[R]], R being its
// region type: an entry holds either a region (MR, with its Extent, made
// by RegionEntry) or a window (W), so that regions and windows share one
// key space and a key names one of them at most. Check resolves a key for an access (loop0 and tcp0 call
// it for every remote access, CheckLocal for every lkey; shm0's peers
// check grants in their own process, and shm0 publishes a window's
// Current binding into the grant tables they read, beside its regions').
// AllocMW, Bind, Invalidate and Dealloc change windows; the provider
// only executes OpBindMW and OpLocalInv in order in its send queue
// (ExecuteBind, LocalInvalidate), calls RemoteInvalidate for a Send with
// Invalidate, and stops what it has under way through the binding these
// return (the region, or the provider's View of it).
//
// The rules, after the InfiniBand specification and Linux rxe:
//
//   - A bind needs a region of the window's PD registered with
//     AccessMWBind (and AccessLocalWrite if the window grants remote
//     write or atomics) and a range inside the region; the window's
//     rights need not be the region's: the region may grant no remote
//     access of its own, and a peer then reaches it only through its
//     windows, with their rights. A type 2 window binds only while
//     unbound, to the QP the bind is posted on, which must be of the
//     window's PD, and never with a zero length; a type 1 window
//     rebinds while bound, and a zero length unbinds it.
//   - Every bind draws the window a new key from the table, as a
//     registration does (crypto/rand; never a live or recently revoked
//     key, so never the key it replaces): the key of the previous
//     binding fails from then on. A bind request names its window
//     itself (MWBind.MW, as ibv_bind_mw's does), so that binds posted
//     back to back execute in order, each on the key the one before
//     gave; one naming it by key must carry its current key.
//   - Only a bound type 2 window is invalidated: locally (OpLocalInv)
//     on a QP of its PD, remotely (Send with Invalidate) only on the QP
//     it is bound to. An invalidated window keeps its key, which names
//     nothing until the window is bound again under a new one.
//   - An access through a window is taken only within its binding, with
//     its rights, on a QP of its PD (for type 2, on its QP), and while
//     the region it is bound to is still registered.
//
// A binding is immutable and published with one atomic store, its key
// inside it: an access that loads it sees a key, range and rights that
// belong together, and one that loads it after Invalidate or Dealloc
// returned sees none.
package grant

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/goverbs/goverbs/internal/keytab"
	"github.com/goverbs/goverbs/verbs/driver"
)

// Region is a provider's registered memory region as the check sees it:
// its Extent, the same one for the region's life.
type Region interface {
	comparable
	Extent() *Extent
}

// Extent describes a region to the check: its virtual range, rights and
// protection domain (compared by identity), fixed when the region is
// registered, and whether it was revoked since (deregistered, or
// invalidated). A provider keeps one in each region, built in place.
type Extent struct {
	Addr    uint64
	Len     uint64
	Access  driver.AccessFlags
	PD      any
	revoked atomic.Uint32 // 1 once revoked
}

// Revoke marks the region revoked: the check refuses it from then on.
func (x *Extent) Revoke() { x.revoked.Store(1) }

// Revoked reports whether the region was revoked.
func (x *Extent) Revoked() bool { return x.revoked.Load() != 0 }

// RevokedWord is Revoked as a word, nonzero once the region was revoked,
// for a caller that ORs it with words of its own into one test.
func (x *Extent) RevokedWord() uint32 { return x.revoked.Load() }

// Entry is the value a key table holds for a key: a region (MR, with its
// Extent in X, so that the check reads it without a call) or a window.
type Entry[R Region] struct {
	MR R
	X  *Extent
	W  *Window[R]
}

// RegionEntry is the entry of region m.
func RegionEntry[R Region](m R) Entry[R] { return Entry[R]{MR: m, X: m.Extent()} }

// Fault says why a key check failed, in terms a provider maps to its
// wire's error codes (a Terminate's, or a completion status).
type Fault uint8

// Faults.
const (
	OK       Fault = iota
	BadKey         // no valid region or bound window has the key
	NotAssoc       // the region or window belongs to another PD, or the window to another QP
	Rights         // the region or window does not grant the access
	Bounds         // the range is not inside the region or window
)

func (f Fault) String() string {
	switch f {
	case OK:
		return "ok"
	case BadKey:
		return "no valid region or bound window has this key"
	case NotAssoc:
		return "the key belongs to another protection domain or QP"
	case Rights:
		return "the region or window does not grant the access"
	case Bounds:
		return "the range is outside the region or window"
	}
	return fmt.Sprintf("Fault(%d)", uint8(f))
}

// Window is a memory window.
type Window[R Region] struct {
	typ driver.MWType
	pd  any

	mu   sync.Mutex // serialises Bind, Invalidate and Dealloc
	key  atomic.Uint32
	cur  atomic.Pointer[binding[R]] // nil while unbound
	dead bool                       // guarded by mu
}

// binding is one binding of a window, never changed once published.
type binding[R Region] struct {
	key    uint32
	mr     R
	x      *Extent // mr's, checked for its revocation
	addr   uint64
	length uint64
	access driver.AccessFlags
	qp     any // a type 2 window's QP; nil for type 1
}

// Type is the window's type.
func (w *Window[R]) Type() driver.MWType { return w.typ }

// RKey is the window's current key.
func (w *Window[R]) RKey() uint32 { return w.key.Load() }

// PD is the protection domain the window was allocated on.
func (w *Window[R]) PD() any { return w.pd }

// Binding describes a window's binding: its key, the region (or what
// the provider's View made of it), range, rights, and for a type 2
// window its QP.
type Binding[R Region] struct {
	Key    uint32
	MR     R
	Addr   uint64
	Length uint64
	Access driver.AccessFlags
	QP     any
}

// Current returns the window's binding, if it is bound.
func (w *Window[R]) Current() (Binding[R], bool) {
	b := w.cur.Load()
	if b == nil {
		return Binding[R]{}, false
	}
	return Binding[R]{Key: b.key, MR: b.mr, Addr: b.addr, Length: b.length, Access: b.access, QP: b.qp}, true
}

// AllocMW allocates an unbound window of type typ on pd, under a fresh
// key of tab.
func AllocMW[R Region](tab *keytab.Table[Entry[R]], typ driver.MWType, pd any) (*Window[R], error) {
	if typ != driver.MWType1 && typ != driver.MWType2 {
		return nil, fmt.Errorf("%w: memory window type %d (1 or 2)", driver.ErrInvalidArg, typ)
	}
	w := &Window[R]{typ: typ, pd: pd}
	k, err := tab.Insert(func(key uint32) Entry[R] { return Entry[R]{W: w} })
	if err != nil {
		return nil, fmt.Errorf("%w: %v", driver.ErrNoResources, err)
	}
	w.key.Store(k)
	return w, nil
}

// Check resolves key for an access of n bytes at addr that needs the
// rights need, arriving on QP qp of protection domain pd: the region
// the bytes lie in, or the fault. A zero-length access is checked as
// the rest are.
func Check[R Region](tab *keytab.Table[Entry[R]], key uint32, pd, qp any, addr, n uint64, need driver.AccessFlags) (R, Fault) {
	var zero R
	e, ok := tab.Lookup(key)
	switch {
	case !ok:
		return zero, BadKey
	case e.W != nil:
		return checkWindow(e.W, key, pd, qp, addr, n, need)
	}
	if f := e.X.check(pd, addr, n, need); f != OK {
		return zero, f
	}
	return e.MR, OK
}

// CheckLocal resolves key as an lkey: as Check, but a window's key names
// nothing (a window grants remote access only).
func CheckLocal[R Region](tab *keytab.Table[Entry[R]], key uint32, pd any, addr, n uint64, need driver.AccessFlags) (R, Fault) {
	var zero R
	e, ok := tab.Lookup(key)
	if !ok || e.W != nil {
		return zero, BadKey
	}
	if f := e.X.check(pd, addr, n, need); f != OK {
		return zero, f
	}
	return e.MR, OK
}

// check is Check of the region of x: its fields compared in place.
func (x *Extent) check(pd any, addr, n uint64, need driver.AccessFlags) Fault {
	switch {
	case x.Revoked():
		return BadKey
	case !same(x.PD, pd):
		return NotAssoc
	case x.Access&need != need:
		return Rights
	case !inside(addr, n, x.Addr, x.Len):
		return Bounds
	}
	return OK
}

// checkWindow is Check of window w.
func checkWindow[R Region](w *Window[R], key uint32, pd, qp any, addr, n uint64, need driver.AccessFlags) (R, Fault) {
	var zero R
	b := w.cur.Load()
	switch {
	case b == nil || b.key != key:
		return zero, BadKey
	case !same(w.pd, pd) || b.qp != nil && !same(b.qp, qp):
		return zero, NotAssoc
	case b.access&need != need:
		return zero, Rights
	case !inside(addr, n, b.addr, b.length):
		return zero, Bounds
	case b.x.Revoked():
		return zero, BadKey
	}
	return b.mr, OK
}

// same reports whether a and b hold the same object: protection domains
// and QPs are compared by identity. It compares the interfaces' words
// (type and data) rather than calling the runtime's interface equality:
// for a pointer the data word is the pointer, and for any other dynamic
// type equal words mean the same boxed value, so it never reports two
// different objects as the same.
func same(a, b any) bool {
	return *(*[2]uintptr)(unsafe.Pointer(&a)) == *(*[2]uintptr)(unsafe.Pointer(&b))
}

// inside reports whether [addr, addr+n) lies inside [base, base+length).
func inside(addr, n, base, length uint64) bool {
	if addr < base {
		return false
	}
	off := addr - base
	return off <= length && n <= length-off
}

// BindError is why a bind was refused; the bind completes with
// driver.WCMWBindErr.
type BindError struct{ Reason string }

func (e *BindError) Error() string { return "memory window bind refused: " + e.Reason }

func bindErr(format string, a ...any) error { return &BindError{Reason: fmt.Sprintf(format, a...)} }

// View makes what a binding of a window resolves to, from the region it
// is bound to: a provider that tracks what it has under way per region
// (and revokes it when the window is unbound) gives each binding a view
// of its own; nil resolves a binding to the region itself. It runs under
// the window's lock, once the bind's checks have passed.
type View[R Region] func(region R, b *driver.MWBind) R

// Handle is implemented by a provider's driver.MW: the window it is. A
// bind request whose MWBind.MW is set names its window so (as
// ibv_mw_bind's mw does), whatever the window's key is by the time the
// bind executes; one without names it by MWBind.RKey, its current key.
type Handle[R Region] interface {
	GrantWindow() *Window[R]
}

// GrantWindow implements Handle: a provider's window type that embeds
// *Window (and so has its RKey and Type too) is a Handle.
func (w *Window[R]) GrantWindow() *Window[R] { return w }

// Replaced is what a bind replaced: the key it revoked, and what the
// window's previous binding resolved to, if it was bound.
type Replaced[R Region] struct {
	Key      uint32
	MR       R
	WasBound bool
}

// Bind binds w per b to the region mr, posted on QP qp of protection
// domain qpPD, and returns the window's new key and what the bind
// replaced. A request naming the window by key (b.MW nil) must carry its
// current key. The previous binding's key fails once Bind returns.
func (w *Window[R]) Bind(tab *keytab.Table[Entry[R]], mr R, b *driver.MWBind, qp, qpPD any, view View[R]) (key uint32, old Replaced[R], err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	cur := w.cur.Load()
	fail := func(format string, a ...any) (uint32, Replaced[R], error) {
		return 0, Replaced[R]{}, bindErr(format, a...)
	}
	switch {
	case w.dead:
		return fail("the window was deallocated")
	case b.MW == nil && b.RKey != w.key.Load():
		return fail("key %#x is not the window's current key", b.RKey)
	case w.pd != qpPD:
		return fail("the window belongs to another protection domain than the QP")
	case w.typ == driver.MWType2 && cur != nil:
		return fail("a type 2 window is bound already: invalidate it first")
	case w.typ == driver.MWType2 && b.Length == 0:
		return fail("a type 2 window cannot be bound with zero length")
	case b.Access&^driver.RemoteAccess != 0:
		return fail("a window grants remote rights only, not %v", b.Access&^driver.RemoteAccess)
	}
	if b.Length != 0 {
		x := mr.Extent()
		switch {
		case x.Revoked():
			return fail("lkey %#x names no registered region", b.LKey)
		case x.PD != w.pd:
			return fail("the region belongs to another protection domain than the window")
		case x.Access&driver.AccessMWBind == 0:
			return fail("the region was registered without AccessMWBind")
		case b.Access&(driver.AccessRemoteWrite|driver.AccessRemoteAtomic) != 0 && x.Access&driver.AccessLocalWrite == 0:
			return fail("a window granting %v needs a region registered with AccessLocalWrite", b.Access&(driver.AccessRemoteWrite|driver.AccessRemoteAtomic))
		case !inside(b.Addr, b.Length, x.Addr, x.Len):
			return fail("[%#x, +%d) is not inside the region [%#x, +%d)", b.Addr, b.Length, x.Addr, x.Len)
		}
	}
	// The old key dies first; then the binding is published with the
	// new key inside it, and only then is the new key told.
	ok := w.key.Load()
	nk, found := tab.Rekey(ok, func(e Entry[R], _ uint32) Entry[R] { return e })
	if !found {
		return fail("the window's key vanished from the key table")
	}
	old = Replaced[R]{Key: ok}
	if cur != nil {
		old.MR, old.WasBound = cur.mr, true
	}
	if b.Length == 0 {
		w.cur.Store(nil)
	} else {
		if view != nil {
			mr = view(mr, b)
		}
		nb := &binding[R]{key: nk, mr: mr, x: mr.Extent(), addr: b.Addr, length: b.Length, access: b.Access}
		if w.typ == driver.MWType2 {
			nb.qp = qp
		}
		w.cur.Store(nb)
	}
	w.key.Store(nk)
	return nk, old, nil
}

// Invalidate unbinds w, a type 2 window bound under key, at the request
// of QP qp of protection domain qpPD; remote means a peer's Send with
// Invalidate, which only the QP the window is bound to takes. It returns
// what the binding resolved to. The key fails once Invalidate returns.
func (w *Window[R]) Invalidate(key uint32, qp, qpPD any, remote bool) (R, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var zero R
	b := w.cur.Load()
	switch {
	case w.dead || b == nil || b.key != key:
		return zero, fmt.Errorf("%w: key %#x names no bound window", driver.ErrInvalidArg, key)
	case w.typ != driver.MWType2:
		return zero, fmt.Errorf("%w: only type 2 windows are invalidated; rebind a type 1 window with zero length", driver.ErrInvalidArg)
	case w.pd != qpPD:
		return zero, fmt.Errorf("%w: the window belongs to another protection domain", driver.ErrInvalidArg)
	case remote && b.qp != qp:
		return zero, fmt.Errorf("%w: the window is bound to another QP", driver.ErrInvalidArg)
	}
	w.cur.Store(nil)
	return b.mr, nil
}

// Dealloc frees w: its key leaves tab, and access through it fails once
// Dealloc returns. It returns the binding w had, if it was bound.
func (w *Window[R]) Dealloc(tab *keytab.Table[Entry[R]]) (Binding[R], bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dead {
		return Binding[R]{}, false, driver.ErrClosed
	}
	w.dead = true
	b := w.cur.Swap(nil)
	tab.Remove(w.key.Load())
	if b == nil {
		return Binding[R]{}, false, nil
	}
	return Binding[R]{Key: b.key, MR: b.mr, Addr: b.addr, Length: b.length, Access: b.access, QP: b.qp}, true, nil
}

// Lookup returns the window key names, if it names one.
func Lookup[R Region](tab *keytab.Table[Entry[R]], key uint32) *Window[R] {
	e, _ := tab.Lookup(key)
	return e.W
}

// ExecuteBind executes an OpBindMW work request wr posted on QP qp of
// protection domain pd, making the binding with view: the status it
// completes with, the window (nil if the request names none), and what
// the bind replaced (so that the provider stops what it has under way
// through the old key).
func ExecuteBind[R Region](tab *keytab.Table[Entry[R]], wr *driver.SendWR, qp, pd any, view View[R]) (driver.WCStatus, *Window[R], Replaced[R]) {
	w := windowOf(tab, &wr.Bind)
	if w == nil {
		return driver.WCMWBindErr, nil, Replaced[R]{}
	}
	var mr R
	if wr.Bind.Length != 0 {
		e, ok := tab.Lookup(wr.Bind.LKey)
		if !ok || e.W != nil {
			return driver.WCMWBindErr, w, Replaced[R]{}
		}
		mr = e.MR
	}
	_, old, err := w.Bind(tab, mr, &wr.Bind, qp, pd, view)
	if err != nil {
		return driver.WCMWBindErr, w, Replaced[R]{}
	}
	return driver.WCSuccess, w, old
}

// windowOf is the window a bind request names: b.MW's, or that of the key
// b.RKey.
func windowOf[R Region](tab *keytab.Table[Entry[R]], b *driver.MWBind) *Window[R] {
	if b.MW == nil {
		return Lookup(tab, b.RKey)
	}
	if h, ok := b.MW.(Handle[R]); ok {
		return h.GrantWindow()
	}
	return nil
}

// LocalInvalidate executes an OpLocalInv work request for key, posted
// on QP qp of protection domain pd: the status it completes with (a
// refusal is driver.WCMWBindErr, "memory management operation error") and
// the region the window was bound to (for the provider to stop what it
// has under way through key).
func LocalInvalidate[R Region](tab *keytab.Table[Entry[R]], key uint32, qp, pd any) (driver.WCStatus, R) {
	var zero R
	w := Lookup(tab, key)
	if w == nil {
		return driver.WCMWBindErr, zero
	}
	old, err := w.Invalidate(key, qp, pd, false)
	if err != nil {
		return driver.WCMWBindErr, zero
	}
	return driver.WCSuccess, old
}

// RemoteInvalidate handles the invalidation a peer's Send with
// Invalidate asks of QP qp of protection domain pd: isWindow says key
// names a window (a provider may give other keys its own meaning), err
// why it may not be invalidated, and mr the region it was bound to.
func RemoteInvalidate[R Region](tab *keytab.Table[Entry[R]], key uint32, qp, pd any) (mr R, isWindow bool, err error) {
	w := Lookup(tab, key)
	if w == nil {
		return mr, false, nil
	}
	mr, err = w.Invalidate(key, qp, pd, true)
	return mr, true, err
}
