package shm

import (
	"sync/atomic"

	"github.com/goverbs/goverbs/internal/grant"
	"github.com/goverbs/goverbs/internal/keytab"
	"github.com/goverbs/goverbs/internal/swq"
	"github.com/goverbs/goverbs/verbs/driver"
)

// Memory windows. internal/grant keeps their state and makes the bind,
// invalidate and deallocate checks; here a bound window becomes a grant:
// a slot of the grant tables the peers read (the window's key, range and
// rights, the segment of its region), written into the table of every QP
// of its PD (type 1) or of its QP alone (type 2) before the bind
// completes, so that the peer's requester checks a window's key as it
// checks a region's (conn.target). The rule enforced on revocation: an
// OpLocalInv, or a rebind that replaces a binding, takes the grant out
// of the tables at once and completes only once every peer of the PD has
// confirmed that no WR of its still uses the key (revokePeer, as Dereg
// does: a WR checks its key once, before its copy); Dealloc returns only
// then. A peer's Send with Invalidate asks this process to invalidate
// the window (msgInvalidate, answered by the control goroutine) before
// it writes the receive's completion: the window is bound to that
// peer's QP alone, whose requester is the one waiting, so no other WR
// of its is under way. Poll reports WCWithInv only for a key this
// process invalidated for the QP (a peer writes the completion and could
// claim any key).

// mw is a memory window.
type mw struct {
	ctx                *devCtx
	*grant.Window[*mr] // RKey, Type, GrantWindow
}

// AllocMW implements driver.MWAllocator. A window takes a slot of the
// context's key table, as a region does (MaxMR counts both).
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

// Dealloc implements driver.MW: once it returns, no peer's WR uses the
// window any more.
func (w *mw) Dealloc() error {
	b, bound, err := w.Window.Dealloc(&w.ctx.mrs)
	if err != nil {
		return err
	}
	if bound {
		w.ctx.ungrantWindow(b.Key)
		for _, cn := range w.ctx.pdConns(b.MR.pd) {
			cn.revokePeer()
		}
	}
	return nil
}

// windowInfo is the grant of binding b: its region's slot with the
// window's key, range and rights.
func (c *devCtx) windowInfo(b grant.Binding[*mr]) (keyInfo, bool) {
	k, ok := c.keys.lookup(b.MR.key)
	if !ok {
		return keyInfo{}, false
	}
	off := b.Addr - k.addr
	k.key, k.access, k.segOff, k.addr, k.length = b.Key, b.Access, k.segOff+off, b.Addr, b.Length
	return k, true
}

// exposeForWindow makes the segment of m, to which a window granting
// access is bound, shareable with the peers of m's PD as a region of
// those rights would make it, before the window's grant is published:
// the peers reach a region without remote rights of its own through its
// windows' grants alone, never by its key.
func (c *devCtx) exposeForWindow(m *mr, access driver.AccessFlags) {
	m.windowed.Store(true)
	if m.si == nil {
		return
	}
	c.segMu.Lock()
	defer c.segMu.Unlock()
	if c.segs[m.segID] != m.si || c.lookupMR(m.key) != m {
		return // deregistered meanwhile
	}
	before := m.si.access
	m.si.access |= access & driver.RemoteAccess
	first := m.si.count(m)
	c.announceSegment(m.segID, m.si, m.si.access != before, first, m.pd)
}

// grantWindowLocked writes the grant of window w, if it is bound and
// q's peer may use it, into q's grant table. q.grantMu is held.
func (q *qp) grantWindowLocked(w *grant.Window[*mr]) {
	b, ok := w.Current()
	if !ok || b.MR.pd != q.pd || (b.QP != nil && b.QP != any(q)) {
		return
	}
	if k, ok := q.ctx.windowInfo(b); ok {
		// Bounded by the QP's access flags, as a region's grant is.
		if k.access = q.peerRights(k.access); k.access != 0 {
			q.grants.publish(keytab.Index(b.Key), k)
		}
	}
}

// grantWindow writes window w's grant into the tables of the QPs whose
// peers may use it.
func (c *devCtx) grantWindow(w *grant.Window[*mr]) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for q := range c.qps {
		q.grantMu.Lock()
		q.grantWindowLocked(w)
		q.grantMu.Unlock()
	}
}

// ungrantWindow takes key out of every QP's grant table.
func (c *devCtx) ungrantWindow(key uint32) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for q := range c.qps {
		q.revokeGrant(key)
	}
}

// ungrantWindowsOf takes the grants of the windows bound to m, which is
// being deregistered, out of every QP's grant table; the peers then
// confirm, for m's Dereg, that no WR of theirs uses m's memory. c.mu is
// held.
func (c *devCtx) ungrantWindowsOf(m *mr) {
	c.mrs.Range(func(_ uint32, e grant.Entry[*mr]) bool {
		if e.W != nil {
			if b, ok := e.W.Current(); ok && b.MR == m {
				for q := range c.qps {
					q.revokeGrant(b.Key)
				}
			}
		}
		return true
	})
}

// pdConns returns the live connections of p's QPs.
func (c *devCtx) pdConns(p *pd) []*conn {
	c.connMu.Lock()
	defer c.connMu.Unlock()
	var conns []*conn
	for cn := range c.conns {
		if cn.q.pd == p {
			conns = append(conns, cn)
		}
	}
	return conns
}

// windowWait is the state of an OpBindMW or OpLocalInv at the head of a
// QP's send queue that waits for the peers' confirmation (see windowOp).
type windowWait struct {
	slot    *swq.Slot // the WR waiting; nil if none
	waiting bool      // the peers have not all confirmed yet (Stalled)
}

// windowOp executes OpBindMW or OpLocalInv. One that revokes a key (an
// invalidation, or a rebind of a bound window) stays at the head of the
// send queue, which stalls, until every peer of the PD has confirmed
// that no WR of its uses the key (in a goroutine: revokePeer may not
// wait under q.mu); the queue then executes it again, and it completes.
// q.mu is held.
func (q *qp) windowOp(s *swq.Slot) (driver.WCStatus, uint32) {
	wr := &s.WR
	ww := &q.mwWait
	if ww.slot == s && !ww.waiting {
		// Executed already; the peers have confirmed since.
		*ww = windowWait{}
		return driver.WCSuccess, 0
	}
	*ww = windowWait{}
	c := q.ctx
	var (
		st     driver.WCStatus
		old    uint32
		revoke bool
	)
	if wr.Opcode == driver.OpBindMW {
		var (
			w   *grant.Window[*mr]
			rep grant.Replaced[*mr]
		)
		st, w, rep = grant.ExecuteBind(&c.mrs, wr, q, q.pd, nil)
		old, revoke = rep.Key, rep.WasBound
		if st == driver.WCSuccess {
			if b, ok := w.Current(); ok {
				c.exposeForWindow(b.MR, b.Access)
			}
			c.grantWindow(w)
		}
	} else {
		st, _ = grant.LocalInvalidate(&c.mrs, wr.InvalidateRKey, q, q.pd)
		old, revoke = wr.InvalidateRKey, st == driver.WCSuccess
	}
	if st != driver.WCSuccess || !revoke {
		return st, 0
	}
	c.ungrantWindow(old)
	conns := c.pdConns(q.pd)
	if len(conns) == 0 {
		return driver.WCSuccess, 0
	}
	*ww = windowWait{slot: s, waiting: true}
	go q.confirmRevoked(conns, s)
	return swq.RNRWait, 0
}

// confirmRevoked has the peers of conns confirm that no WR of theirs
// uses a key revoked for the WR of slot s, then lets the send queue go
// on.
func (q *qp) confirmRevoked(conns []*conn, s *swq.Slot) {
	for _, cn := range conns {
		cn.revokePeer()
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.mwWait.slot != s || q.destroyed {
		return
	}
	q.mwWait.waiting = false
	q.sq.Progress(q)
	q.sqDrained()
}

// invalidated remembers the last keys a peer's Sends with Invalidate had
// this process invalidate for a QP, until Poll reports them.
type invalidated struct {
	keys [8]atomic.Uint32
	next atomic.Uint32
}

// add records key, in place of the oldest record.
func (iv *invalidated) add(key uint32) {
	iv.keys[iv.next.Add(1)%uint32(len(iv.keys))].Store(key)
}

// clear forgets every record (a reset QP's next connection starts anew).
func (iv *invalidated) clear() {
	for i := range iv.keys {
		iv.keys[i].Store(0)
	}
}

// take reports whether key was recorded, and forgets it.
func (iv *invalidated) take(key uint32) bool {
	for i := range iv.keys {
		if key != 0 && iv.keys[i].CompareAndSwap(key, 0) {
			return true
		}
	}
	return false
}

// serveInvalidate answers a peer's msgInvalidate: the window of key, a
// type 2 window bound to the connection's QP, is invalidated and its
// grant taken out of the tables. A refusal counts against the peer as a
// refused key does.
func (c *conn) serveInvalidate(key uint32) {
	q, ctx := c.q, c.q.ctx
	_, isWindow, err := grant.RemoteInvalidate(&ctx.mrs, key, q, q.pd)
	ok := isWindow && err == nil
	if ok {
		ctx.ungrantWindow(key)
		q.invalidated.add(key)
	}
	c.answerKey(msgInvalidated, key, ok)
}

// askInvalidate asks the peer to invalidate key for a Send with
// Invalidate and waits for the answer, within the WR's bound on waits.
// q.mu is held.
func (c *conn) askInvalidate(key uint32) bool {
	for len(c.invAck) > 0 {
		<-c.invAck // an answer that came too late for an earlier ask
	}
	c.sendCtrl(msgInvalidate, key, 0)
	t := c.waitTimer()
	defer t.Stop()
	for {
		select {
		case a := <-c.invAck:
			if a[0] == key {
				return a[1] == 1
			}
		case <-c.done:
			return false
		case <-c.gone:
			return false
		case <-t.C:
			return false
		}
	}
}

// checkInvalidated keeps WCWithInv on a receive completion of q that
// its peer wrote only if this process invalidated that key for q.
func (q *qp) checkInvalidated(wc *driver.WorkCompletion) {
	if wc.Flags&driver.WCWithInv != 0 && !q.invalidated.take(wc.InvalidatedRKey) {
		wc.Flags &^= driver.WCWithInv
		wc.InvalidatedRKey = 0
	}
}
