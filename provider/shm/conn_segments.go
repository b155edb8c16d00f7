package shm

import (
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The peer's memory as the requester reaches it: the segments the owner
// hands out (pushed, or asked for), mapped within the process's bounds,
// and process memory reached with process_vm_readv/writev.

// serveSegment answers a peer's request for one of this process's
// segments, as pushSegment does.
func (c *conn) serveSegment(id uint32, write bool) {
	ctx := c.q.ctx
	ctx.segMu.Lock()
	defer ctx.segMu.Unlock()
	c.pushSegmentLocked(id, ctx.segs[id], write)
}

// pushSegmentLocked sends segment id to the peer: only a segment with
// remote rights or receive buffers, and a region of the QP's PD, is ever
// handed out, writable only when a region on it may be written by the
// peer (or, with wantWrite false, whenever it may); otherwise the message
// carries no descriptor. ctx.segMu is held.
func (c *conn) pushSegmentLocked(id uint32, si *segInfo, wantWrite bool) {
	fd, writable := -1, false
	if si.inPD(c.q.pd) {
		if ok, w := si.shareable(c.q, true); ok && w {
			fd, writable = si.seg.fd, true
		} else if ok, _ := si.shareable(c.q, false); ok && !wantWrite {
			if ro, err := si.seg.readOnlyFD(); err == nil {
				fd = ro
				defer unix.Close(ro)
			}
		}
	}
	var m ctrl
	b := uint32(0)
	if writable {
		b = 1
	}
	m.set(msgSeg, id, b)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if fd >= 0 {
		c.writeCtrl(m[:], unix.UnixRights(fd))
	} else {
		c.writeCtrl(m[:], nil)
	}
}

// pushShareable sends the peer every segment it may touch, so that its
// first access to a region needs nothing from this process.
func (c *conn) pushShareable() {
	ctx := c.q.ctx
	ctx.segMu.Lock()
	defer ctx.segMu.Unlock()
	for id, si := range ctx.segs {
		if ok, _ := si.shareable(c.q, false); ok && si.inPD(c.q.pd) {
			c.pushSegmentLocked(id, si, false)
		}
	}
}

// absorb applies the segments the peer sent or freed; q.mu is held.
func (c *conn) absorb() {
	if c.hot.hold.Load()&holdDirty == 0 || c.clearHold(holdDirty) == 0 {
		return
	}
	c.forgetKeys()
	c.arriveMu.Lock()
	arrivals, overflow := c.arrivals, c.overflow
	c.arrivals, c.overflow = nil, false
	c.arriveMu.Unlock()
	if overflow {
		for id, s := range c.segs {
			c.retire(id, s)
		}
	}
	for _, r := range arrivals {
		if old := c.segs[r.id]; old != nil && !r.gone && r.fd >= 0 && c.segRW[r.id] == r.writable {
			// The segment again, as it is mapped: the peer pushed it
			// when the connection started and then answered a request
			// for it sent before that push arrived. (An id is not
			// reused before its msgSegGone, which this side reads
			// first, and a sealed segment's size cannot change.)
			unix.Close(r.fd)
			continue
		}
		if old := c.segs[r.id]; old != nil && (r.gone || r.fd >= 0) {
			c.retire(r.id, old)
		}
		switch {
		case r.fd < 0 || r.gone:
			// No descriptor, or the segment freed or withdrawn (its
			// regions for this QP's PD deregistered): a refusal.
			if c.awaitingSet && r.id == c.awaiting {
				c.awaitRefused = true
			}
		default:
			if s, err := mapPeerSegment(r.fd, 1, r.writable); err == nil {
				if !c.makeRoom(len(s.mem)) {
					// The process's budget is spent by other
					// connections: refused, as a segment not handed out.
					s.close()
					if c.awaitingSet && r.id == c.awaiting {
						c.awaitRefused = true
					}
					continue
				}
				c.segs[r.id], c.segRW[r.id] = s, r.writable
				c.mapped += len(s.mem)
				peerMaps.Add(1)
				peerBytes.Add(int64(len(s.mem)))
			}
		}
	}
}

// Bounds on the peer's segments mapped at once, in number and in bytes:
// a peer may push as many as it likes, and each takes address space and
// one of the process's mappings (vm.max_map_count, 65530 by default).
// Each connection has its bound, and the process one over all of them,
// so that many connections, of one peer or several, cannot spend the
// process's mappings between them (the runtime dies when its own mmap
// fails).
const (
	maxPeerMappings = 4096
	maxPeerMapped   = 1 << 40
)

// The process's bounds, and what its connections have mapped of their
// peers' segments (variables for tests). Past the budget, each
// connection may still map its first minPeerMappings segments and
// minPeerMapped bytes, up to a hard limit of twice the budget, so that
// peers who spend the budget cannot starve a connection of the few
// segments it works with; the hard limit, with the four mappings each
// connection makes at setup for as many connections as a context takes,
// stays well under vm.max_map_count (65530) and the address space.
var (
	maxProcPeerMappings int64 = 16384
	maxProcPeerMapped   int64 = 8 << 40
	minPeerMappings           = 8
	minPeerMapped             = 1 << 30
	peerMaps, peerBytes atomic.Int64
)

// makeRoom retires mappings until one of n more bytes fits under the
// bounds; any mapping can go, since the requester asks the peer again
// for a segment it needs. It reports false when the process's bounds
// stay spent once this connection has none left. q.mu is held.
func (c *conn) makeRoom(n int) bool {
	fits := func() bool {
		if len(c.segs) >= maxPeerMappings || c.mapped+n > maxPeerMapped {
			return false
		}
		maps, bytes := peerMaps.Load(), peerBytes.Load()+int64(n)
		return (maps < maxProcPeerMappings || len(c.segs) < minPeerMappings && maps < 2*maxProcPeerMappings) &&
			(bytes <= maxProcPeerMapped || c.mapped+n <= minPeerMapped && bytes <= 2*maxProcPeerMapped)
	}
	for id, s := range c.segs {
		if fits() {
			return true
		}
		c.retire(id, s)
	}
	return fits()
}

// retire drops the mapping s of segment id: unmapped now, or once the
// WR being executed is done if it resolved a target into it. q.mu is
// held.
func (c *conn) retire(id uint32, s *segment) {
	c.mapped -= len(s.mem)
	peerMaps.Add(-1)
	peerBytes.Add(-int64(len(s.mem)))
	delete(c.segs, id)
	delete(c.segRW, id)
	if c.targets(s) {
		c.retired = append(c.retired, s)
		c.setHold(holdRetired)
		return
	}
	s.close()
}

// targets reports whether a target in dst lies in mapping s. Entries
// that earlier WRs left are compared too (by address only: a stale one
// only defers the unmapping to the end of the current WR). q.mu is held.
func (c *conn) targets(s *segment) bool {
	if len(s.mem) == 0 {
		return false
	}
	lo := uintptr(unsafe.Pointer(&s.mem[0]))
	hi := lo + uintptr(len(s.mem))
	for i := range c.dst {
		if b := c.dst[i].b; len(b) > 0 {
			if p := uintptr(unsafe.Pointer(&b[0])); p >= lo && p < hi {
				return true
			}
		}
	}
	return false
}

// closeRetired unmaps the mappings absorb retired; q.mu is held, and no
// WR is being executed.
func (c *conn) closeRetired() {
	c.clearHold(holdRetired)
	for i, s := range c.retired {
		s.close()
		c.retired[i] = nil
	}
	c.retired = c.retired[:0]
}

// segment returns the peer's segment id mapped here, writable if asked.
// The peer normally pushed it already; if not, it is asked for it, and the
// answer awaited. q.mu is held.
func (c *conn) segment(id uint32, write bool) (*segment, bool) {
	c.absorb()
	if s := c.segs[id]; s != nil && (!write || c.segRW[id]) {
		return s, true
	}
	c.awaiting, c.awaitingSet, c.awaitRefused = id, true, false
	defer func() { c.awaitingSet = false }()
	b := uint32(0)
	if write {
		b = 1
	}
	c.sendCtrl(msgGetSeg, id, b)
	t := c.waitTimer()
	defer t.Stop()
	for {
		select {
		case <-c.segNote:
			c.absorb()
			if s := c.segs[id]; s != nil && (!write || c.segRW[id]) {
				return s, true
			}
			if c.awaitRefused {
				return nil, false
			}
		case <-c.done:
			return nil, false
		case <-c.gone:
			// The peer died or hung up: handleEvents, which closes
			// done, waits for q.mu, which this requester holds.
			return nil, false
		case <-t.C:
			return nil, false
		}
	}
}

// segWait bounds how long one WR waits for the peer to send the segments
// and grant the keys it names.
const segWait = 2 * time.Second

// waitTimer starts the WR's bound on waits for the peer (segWait), if
// this is its first, and returns a timer that fires when it runs out.
// q.mu is held.
func (c *conn) waitTimer() *time.Timer {
	return time.NewTimer(time.Until(c.waitDeadline()))
}

// waitDeadline is the end of the WR's bound on waits for the peer,
// which starts (segWaitUntil) at its first wait. q.mu is held.
func (c *conn) waitDeadline() time.Time {
	if c.segWaitUntil.IsZero() {
		c.segWaitUntil = time.Now().Add(segWait)
		c.setHold(holdSegWait)
	}
	return c.segWaitUntil
}

// endWait ends the WR's bound on waits for the peer. q.mu is held.
func (c *conn) endWait() {
	c.clearHold(holdSegWait)
	c.segWaitUntil = time.Time{}
}

// procCopy copies between local memory b and the peer's process memory
// at addr: out writes the peer, else reads it.
func (c *conn) procCopy(b []byte, addr uint64, out bool) bool {
	if len(b) == 0 {
		return true
	}
	local := [1]unix.Iovec{{Base: &b[0]}}
	local[0].SetLen(len(b))
	rem := [1]unix.RemoteIovec{{Base: uintptr(addr), Len: len(b)}}
	var n int
	var err error
	if out {
		n, err = unix.ProcessVMWritev(c.pid, local[:], rem[:], 0)
	} else {
		n, err = unix.ProcessVMReadv(c.pid, local[:], rem[:], 0)
	}
	return err == nil && n == len(b)
}

// reshare sends the peer, after the QP's access flags changed, each
// segment of the QP's PD as it may now map it (writable, read-only), or
// tells it to unmap one it may no longer map. A segment sent again as it
// is mapped is dropped by the peer's absorb.
func (c *conn) reshare() {
	ctx := c.q.ctx
	ctx.segMu.Lock()
	defer ctx.segMu.Unlock()
	for id, si := range ctx.segs {
		if !si.inPD(c.q.pd) {
			continue
		}
		if ok, _ := si.shareable(c.q, false); ok {
			c.pushSegmentLocked(id, si, false)
		} else {
			c.sendCtrl(msgSegGone, id, 0)
		}
	}
}
