package iwarp

import (
	"runtime"
	"slices"
	"sync"

	"github.com/goverbs/goverbs/internal/grant"
	"github.com/goverbs/goverbs/internal/swq"
	"github.com/goverbs/goverbs/verbs/driver"
)

// Memory windows. internal/grant keeps their state and makes the checks;
// here a binding resolves to a view of its region (an mr of its own, see
// mr.parent), so that the machinery that keeps a deregistered region's
// bytes from being placed or sent (Dereg: rxBusy, cutReads) serves a
// window that is unbound as well. The rule enforced: once the OpLocalInv,
// the rebind or the Dealloc that unbinds a window has completed (or
// returned), nothing more is placed through the window's old key, and a
// Read Response from it still owed is cut short with a Terminate (its
// QP fails). A Send with Invalidate unbinds the window at once, in the
// receiving round, before its receive completes; the Reads of the window
// the peer has outstanding are then cut as the Reads of an invalidated
// region are.

// mw is a memory window.
type mw struct {
	ctx                *devCtx
	*grant.Window[*mr] // RKey, Type, GrantWindow
}

// AllocMW implements driver.MWAllocator.
func (p *pd) AllocMW(typ driver.MWType) (driver.MW, error) {
	c := p.ctx
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || p.Released() {
		return nil, driver.ErrClosed
	}
	w, err := grant.AllocMW(&c.mrs, typ, p)
	if err != nil {
		return nil, err
	}
	return &mw{ctx: c, Window: w}, nil
}

// Dealloc implements driver.MW: once it returns, nothing more is placed
// or sent through the window.
func (w *mw) Dealloc() error {
	b, bound, err := w.Window.Dealloc(&w.ctx.mrs)
	if err != nil {
		return err
	}
	if bound {
		w.ctx.revokeView(b.MR, true)
	}
	return nil
}

// view is the grant.View of the provider: the view of region m that a
// binding per b resolves to, registered with m so that m's Dereg revokes
// it.
func (c *devCtx) view(m *mr, b *driver.MWBind) *mr {
	off := b.Addr - m.addr
	v := &mr{ctx: c, pd: m.pd, buf: m.buf[off : off+b.Length], addr: b.Addr, access: b.Access, parent: m,
		ext: grant.Extent{Addr: b.Addr, Len: b.Length, Access: b.Access, PD: m.pd}}
	c.mu.Lock()
	if m.ext.Revoked() {
		v.ext.Revoke()
	} else {
		m.views = append(m.views, v)
	}
	c.mu.Unlock()
	return v
}

// revokeView revokes v, a window's view: with wait, it returns once
// nothing more is placed into v nor sent from it (quiesce); without, it
// only cuts the Reads of v (a receiving round, which may not wait for
// itself).
func (c *devCtx) revokeView(v *mr, wait bool) {
	c.mu.Lock()
	v.ext.Revoke()
	if p := v.parent; p != nil {
		if i := slices.Index(p.views, v); i >= 0 {
			p.views = slices.Delete(p.views, i, i+1)
		}
	}
	var buf [16]*conn
	conns := c.liveConns(buf[:0])
	c.mu.Unlock()
	if wait {
		c.quiesce(v, conns)
		return
	}
	cutReads(conns, v, nil)
}

// quiesce waits, as Dereg does, until nothing more is placed into v,
// revoked, by the connections conns, and the Reads of it they owe are
// cut.
func (c *devCtx) quiesce(v *mr, conns []*conn) {
	for _, cn := range conns {
		for cn.rxBusy.Load() != 0 {
			runtime.Gosched()
		}
	}
	var wg sync.WaitGroup
	cutReads(conns, v, &wg)
	wg.Wait()
}

// windowOp executes OpBindMW or OpLocalInv at the head of the send queue.
// A bind or invalidation that unbinds a window completes only once the
// old binding is quiesced (revokeView, in a goroutine of its own: it may
// wait for this QP's transmitter); it is tracked as a request awaiting
// its response, so that it completes in order. q.mu is held.
func (q *qp) windowOp(s *swq.Slot) (driver.WCStatus, uint32) {
	wr := &s.WR
	var (
		st     driver.WCStatus
		old    *mr
		revoke bool
	)
	if wr.Opcode == driver.OpBindMW {
		var rep grant.Replaced[*mr]
		st, _, rep = grant.ExecuteBind(&q.ctx.mrs, wr, q, q.pd, q.ctx.view)
		old, revoke = rep.MR, rep.WasBound
	} else {
		st, old = grant.LocalInvalidate(&q.ctx.mrs, wr.InvalidateRKey, q, q.pd)
		revoke = st == driver.WCSuccess
	}
	if st != driver.WCSuccess {
		return q.failWR(s, st)
	}
	r := &q.req
	seq := r.execSeq
	t := r.slot(seq)
	*t = wrTrack{wrid: wr.WRID, op: wr.Opcode.CompletionOpcode(), signaled: s.Signaled, response: true, responded: !revoke}
	r.execSeq++
	if revoke {
		go q.unbound(old, seq, wr.WRID)
	}
	return swq.Pending, 0
}

// unbound quiesces v, the view a window's bind or invalidation at send
// queue position seq (WR wrid) unbound, and then lets that WR complete.
func (q *qp) unbound(v *mr, seq, wrid uint64) {
	q.ctx.revokeView(v, true)
	q.mu.Lock()
	defer q.mu.Unlock()
	r := &q.req
	if q.destroyed || seq < r.doneSeq || seq >= r.execSeq {
		return // reset or destroyed meanwhile
	}
	t := r.slot(seq)
	if t.wrid != wrid || !t.response || t.responded {
		return
	}
	t.responded = true
	if r.flushHeld {
		// The QP moved to the error state meanwhile, its flush held
		// for this WR: it completes (its binding is undone), then the
		// rest are flushed, and the transmitter (which may wait for an
		// empty send queue to end the connection) looks again.
		q.flushSQ()
		if q.c != nil {
			q.c.wakeTx()
		}
		return
	}
	q.completeInOrder()
}
