package iwarp

import (
	"io"
	"sync/atomic"
	"unsafe"

	"github.com/goverbs/goverbs/provider/iwarp/wire"
	"github.com/goverbs/goverbs/verbs/driver"
)

// The responder: the peer's requests (Sends and the receives they
// consume, RDMA Writes, Immediate Data, Read Requests, atomics), checked
// against the QP and the STag's region, bounds and rights, and performed;
// and the Read and Atomic Responses owed, built into the transmit batch
// (addResponses).

// irqKind is the kind of a queued response.
type irqKind uint8

const (
	irqRead   irqKind = iota // a Read Response
	irqAtomic                // an Atomic Response
)

// irqEntry is a response the transmitter owes the peer.
type irqEntry struct {
	kind     irqKind
	sinkSTag uint32
	sinkTO   uint64
	src      []byte // the memory read
	mr       *mr    // the region of src
	// req is the Read Request's headers, which a Terminate that cuts the
	// response short names (revokeRead).
	req   [wire.ReadRequestLen]byte
	off   int    // bytes of it sent
	id    uint32 // atomic request identifier
	value uint64 // atomic original value
}

// rxWriteBegin checks an RDMA Write segment's STag, bounds and rights:
// its payload goes straight to the region.
func (c *conn) rxWriteBegin(h wire.Hdr) error {
	q := c.q
	n := h.PayloadLen()
	if n == 0 {
		return nil
	}
	q.mu.Lock()
	ok := q.accepts() && q.attr.AccessFlags&driver.AccessRemoteWrite != 0
	q.mu.Unlock()
	b, m, ae := c.q.ctx.span(h.STag(), q.pd, q, h.TO(), uint64(n), driver.AccessRemoteWrite)
	if !ok && ae == accessOK {
		ae = accessRights
	}
	if ae != accessOK {
		return protoErr(wire.LayerDDP, wire.DDPTaggedError, taggedCode(ae), driver.EventQPAccessErr,
			"RDMA Write of %d bytes at STag %#x offset %#x: %v", n, h.STag(), h.TO(), ae)
	}
	c.rx.dst[0] = b
	c.rx.ndst = 1
	c.rx.dstMR[0], c.rx.ndstMR = m, 1
	return nil
}

// rxWriteEnd accounts for a placed RDMA Write segment.
func (c *conn) rxWriteEnd(h wire.Hdr) error {
	c.rx.writeLen += uint64(h.PayloadLen())
	if h.Last() {
		c.rx.lastWriteLen, c.rx.writeLen = c.rx.writeLen, 0
	}
	return nil
}

// taggedCode is the DDP tagged buffer error code of an access error.
func taggedCode(e accessError) uint8 {
	switch e {
	case accessBounds:
		return wire.DDPBaseBounds
	case accessNotAssoc:
		return wire.DDPSTagNotAssoc
	}
	return wire.DDPInvalidSTag
}

// rdmapCode is the RDMAP remote protection error code of an access error.
func rdmapCode(e accessError) uint8 {
	switch e {
	case accessBounds:
		return wire.RDMAPBaseBounds
	case accessNotAssoc:
		return wire.RDMAPSTagNotAssoc
	case accessRights:
		return wire.RDMAPAccessRights
	}
	return wire.RDMAPInvalidSTag
}

// untaggedCheck checks an untagged segment's queue and sequence number.
func (c *conn) untaggedCheck(h wire.Hdr, qn uint32) error {
	if h.QN() != qn {
		return protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPInvalidQN, driver.EventQPReqErr,
			"%v on DDP queue %d", h.Opcode(), h.QN())
	}
	if h.MSN() != c.rx.msn[qn] {
		return protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPInvalidMSN, driver.EventQPReqErr,
			"%v with MSN %d, expected %d", h.Opcode(), h.MSN(), c.rx.msn[qn])
	}
	return nil
}

// soleSegmentCheck is untaggedCheck of a message that is nothing but its
// headers (a Read Request, an atomic, Immediate Data): it is one whole
// DDP segment, the last of its message and at message offset 0.
func (c *conn) soleSegmentCheck(h wire.Hdr, qn uint32) error {
	if err := c.untaggedCheck(h, qn); err != nil {
		return err
	}
	switch {
	case h.MO() != 0:
		return protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPInvalidMO, driver.EventQPReqErr,
			"%v at message offset %d, not 0", h.Opcode(), h.MO())
	case !h.Last():
		return protoErr(wire.LayerRDMAP, wire.RDMAPRemoteOperation, wire.RDMAPCatastrophicLocal, driver.EventQPReqErr,
			"%v without the DDP Last flag: it is a message of one segment", h.Opcode())
	}
	return nil
}

// rxSendBegin checks a Send segment and consumes the receive the
// message fills when it starts: the payload goes to that receive's
// buffers.
func (c *conn) rxSendBegin(h wire.Hdr) error {
	rx := &c.rx
	if err := c.untaggedCheck(h, h.Opcode().QN()); err != nil {
		return err
	}
	n := h.PayloadLen()
	if !rx.send.active {
		if h.MO() != 0 {
			return protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPInvalidMO, driver.EventQPReqErr,
				"a Send starts at message offset %d", h.MO())
		}
		if err := c.takeRecv(); err != nil {
			return err
		}
	}
	s := &rx.send
	if uint64(h.MO()) != s.placed {
		return protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPInvalidMO, driver.EventQPReqErr,
			"Send segment at message offset %d, expected %d", h.MO(), s.placed)
	}
	if uint64(n) > s.room-s.placed {
		c.completeSend(driver.WCLocLenErr)
		return c.sendTooLong(n)
	}
	rx.ndst = copy(rx.dst[:], s.segs[:s.nseg])
	rx.ndstMR = copy(rx.dstMR[:], s.mrs[:s.nseg])
	rx.skip = s.placed
	return nil
}

// sendTooLong is the error of a Send segment of n bytes that overruns
// its receive.
func (c *conn) sendTooLong(n int) error {
	s := &c.rx.send
	return protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPTooLong, driver.EventQPReqErr,
		"a Send of more than %d bytes for a %d-byte receive", s.placed+uint64(n), s.room)
}

// rxSendEnd accounts for a placed Send segment; the last completes the
// receive.
func (c *conn) rxSendEnd(h wire.Hdr) error {
	q := c.q
	rx := &c.rx
	s := &rx.send
	s.placed += uint64(h.PayloadLen())
	if !h.Last() {
		return nil
	}
	wc := c.sendDone(h)
	if h.Opcode().Invalidates() {
		stag := h.InvalidateSTag()
		if !q.ctx.invalidate(stag, q) {
			c.completeSend(driver.WCRemInvReqErr)
			return protoErr(wire.LayerRDMAP, wire.RDMAPRemoteOperation, wire.RDMAPCannotInvalidate, driver.EventQPReqErr,
				"Send with Invalidate of STag %#x, which names no region of the QP's PD that grants remote access", stag)
		}
		wc.Flags |= driver.WCWithInv
		wc.InvalidatedRKey = stag
	}
	c.completeSendWC(wc)
	return nil
}

// sendDone ends the Send message whose last segment, with headers h, is
// placed: the receive completion it gets (but for an invalidation).
func (c *conn) sendDone(h wire.Hdr) driver.WorkCompletion {
	rx := &c.rx
	rx.msn[wire.QNSend]++
	wc := driver.WorkCompletion{Opcode: driver.WCRecv, ByteLen: uint32(rx.send.placed), SrcQP: c.remoteQPN.Load()}
	if h.Opcode().Solicited() {
		wc.Flags |= driver.WCSolicited
	}
	if rx.immNext {
		rx.immNext = false
		wc.Flags |= driver.WCWithImm
		wc.Imm = rx.immNextVal
	}
	return wc
}

// takeRecv consumes the receive the Send that starts now fills, and
// resolves its buffers.
func (c *conn) takeRecv() error {
	q := c.q
	q.mu.Lock()
	defer q.mu.Unlock()
	return c.takeRecvLocked()
}

// takeRecvLocked is takeRecv with q.mu held.
func (c *conn) takeRecvLocked() error {
	q := c.q
	s := &c.rx.send
	if !q.accepts() || q.c != c {
		return io.EOF
	}
	if !q.takeRecv(&s.recv) {
		return protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPNoBuffer, driver.EventQPReqErr,
			"a Send arrived and no receive is posted (iWARP has no RNR retry: post receives before the peer sends)")
	}
	q.rxActive, q.rxWRID = true, s.recv.WRID
	s.active, s.nseg, s.room, s.placed = true, 0, 0, 0
	for i := range s.recv.SGE {
		b, m, e := q.localSpan(&s.recv.SGE[i], driver.AccessLocalWrite)
		if e != accessOK {
			q.rxActive, s.active = false, false
			q.completeRecv(driver.WorkCompletion{WRID: s.recv.WRID, Status: driver.WCLocProtErr, Opcode: driver.WCRecv})
			return protoErr(wire.LayerDDP, wire.DDPCatastrophic, 0, driver.EventQPAccessErr,
				"receive buffer %d of WR %#x: %v", i, s.recv.WRID, e)
		}
		s.segs[s.nseg], s.mrs[s.nseg] = b, m
		s.nseg++
		s.room += uint64(len(b))
	}
	return nil
}

// completeSend completes the receive being filled with an error status.
func (c *conn) completeSend(status driver.WCStatus) {
	c.completeSendWC(driver.WorkCompletion{Status: status, Opcode: driver.WCRecv})
}

// releaseRecv delivers the receive completion held back by
// completeSendWC, unless the move to the error state already did.
func (c *conn) releaseRecv() {
	q := c.q
	q.mu.Lock()
	if q.rxHeld && q.c == c {
		q.rxHeld = false
		q.completeRecv(q.rxHeldWC)
	}
	q.mu.Unlock()
}

// completeSendWC completes the receive being filled with wc. A
// successful one is held back until the next FPDU is handled when that
// FPDU is a Read Request that arrived with it: a peer follows its
// Sends with a Read (a zero-length one where it has nothing else to
// read) to learn that they were placed, and answering it before the
// application hears of the Send means that an application that
// disconnects as soon as it has the message still lets the peer's Send
// complete as a success, as an InfiniBand acknowledgement would.
func (c *conn) completeSendWC(wc driver.WorkCompletion) {
	q := c.q
	q.mu.Lock()
	c.completeSendLocked(wc)
	q.mu.Unlock()
}

// completeSendLocked is completeSendWC with q.mu held.
func (c *conn) completeSendLocked(wc driver.WorkCompletion) {
	q := c.q
	s := &c.rx.send
	s.active = false
	clear(s.segs[:s.nseg])
	clear(s.mrs[:s.nseg])
	if q.rxActive && q.c == c {
		q.rxActive = false
		wc.WRID = s.recv.WRID
		if wc.Status != driver.WCSuccess {
			wc = driver.WorkCompletion{WRID: wc.WRID, Status: wc.Status, Opcode: driver.WCRecv}
			q.completeRecv(wc)
		} else if c.rx.nextRead {
			q.rxHeld, q.rxHeldWC = true, wc
			c.rx.held = true
		} else {
			q.completeRecv(wc)
		}
	}
}

// rxImmDataBegin refuses Immediate Data inside another message: it
// comes between messages, and lends its immediate to one Send at most.
func (c *conn) rxImmDataBegin(h wire.Hdr) error {
	if c.rx.send.active || c.rx.immNext {
		return protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPInvalidMO, driver.EventQPReqErr,
			"Immediate Data inside another message")
	}
	return nil
}

// rxImmData handles RFC 7306 Immediate Data: lent to the next Send, or
// consuming a receive that completes a Write with immediate.
func (c *conn) rxImmData(h wire.Hdr) error {
	q := c.q
	rx := &c.rx
	d := wire.ImmData(h)
	if d.Flags()&wire.ImmWithSend != 0 {
		rx.immNext, rx.immNextVal = true, d.Imm()
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.accepts() || q.c != c {
		return io.EOF
	}
	r := &rx.immRecv
	if !q.takeRecv(r) {
		return protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPNoBuffer, driver.EventQPReqErr,
			"an RDMA Write with immediate arrived and no receive is posted")
	}
	wc := driver.WorkCompletion{WRID: r.WRID, Opcode: driver.WCRecvRDMAWithImm, Flags: driver.WCWithImm,
		Imm: d.Imm(), ByteLen: uint32(rx.lastWriteLen), SrcQP: c.remoteQPN.Load()}
	if h.Opcode().Solicited() {
		wc.Flags |= driver.WCSolicited
	}
	q.completeRecv(wc)
	return nil
}

// rxReadRequest queues the Read Response to an RDMA Read Request, after
// checking the STag, bounds and rights of the memory read and the IRD.
func (c *conn) rxReadRequest(h wire.Hdr) error {
	q := c.q
	r := wire.ReadRequest(h)
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := c.admit("Read Requests"); err != nil {
		return err
	}
	var src []byte
	var m *mr
	if size := r.Size(); size > 0 {
		var ae accessError
		src, m, ae = q.ctx.span(r.SrcSTag(), q.pd, q, r.SrcTO(), uint64(size), driver.AccessRemoteRead)
		if ae == accessOK && q.attr.AccessFlags&driver.AccessRemoteRead == 0 {
			ae = accessRights
		}
		if ae != accessOK {
			return protoErr(wire.LayerRDMAP, wire.RDMAPRemoteProtect, rdmapCode(ae), driver.EventQPAccessErr,
				"RDMA Read of %d bytes at STag %#x offset %#x: %v", size, r.SrcSTag(), r.SrcTO(), ae)
		}
	}
	e := &c.irq[c.irqTail%uint64(len(c.irq))]
	*e = irqEntry{kind: irqRead, sinkSTag: r.SinkSTag(), sinkTO: r.SinkTO(), src: src, mr: m}
	copy(e.req[:], h)
	c.irqTail++
	if len(src) > 0 {
		c.rx.owe = true
	} else {
		c.rx.lazy = true
	}
	return nil
}

// admit checks that a request of the peer (of kind what, which must be
// answered) may be served: io.EOF once the QP no longer takes what this
// connection receives, and an error when the responses already owed
// leave no room for it (the peer has more outstanding than the IRD this
// side offered). q.mu is held.
func (c *conn) admit(what string) error {
	if q := c.q; !q.accepts() || q.c != c {
		return io.EOF
	}
	if c.irqTail-c.irqHead < uint64(len(c.irq)) {
		return nil
	}
	return protoErr(wire.LayerRDMAP, wire.RDMAPRemoteOperation, wire.RDMAPCatastrophicLocal, driver.EventQPReqErr,
		"more %s outstanding than the IRD of %d this side offered", what, len(c.irq))
}

// rxAtomicRequest performs an RFC 7306 atomic on the word it names, with
// a CPU atomic instruction, and queues the response with the word's
// original value.
func (c *conn) rxAtomicRequest(h wire.Hdr) error {
	q := c.q
	a := wire.AtomicRequest(h)
	q.mu.Lock()
	defer q.mu.Unlock()
	if err := c.admit("atomics"); err != nil {
		return err
	}
	switch {
	case a.TO()%8 != 0:
		return protoErr(wire.LayerRDMAP, wire.RDMAPRemoteOperation, wire.RDMAPUnspecified, driver.EventQPReqErr,
			"atomic on offset %#x, which is not 8-byte aligned", a.TO())
	case a.Op() == wire.AtomicFetchAdd && a.AddSwapMask() != 0:
		return protoErr(wire.LayerRDMAP, wire.RDMAPRemoteOperation, wire.RDMAPUnspecified, driver.EventQPReqErr,
			"masked FetchAdd is not supported")
	case a.Op() > wire.AtomicCmpSwap:
		return protoErr(wire.LayerRDMAP, wire.RDMAPRemoteOperation, wire.RDMAPUnspecified, driver.EventQPReqErr,
			"unknown atomic operation %d", a.Op())
	}
	b, _, ae := q.ctx.span(a.STag(), q.pd, q, a.TO(), 8, driver.AccessRemoteAtomic)
	if ae == accessOK && q.attr.AccessFlags&driver.AccessRemoteAtomic == 0 {
		ae = accessRights
	}
	if ae == accessOK && uintptr(unsafe.Pointer(&b[0]))%8 != 0 {
		ae = accessBounds
	}
	if ae != accessOK {
		return protoErr(wire.LayerRDMAP, wire.RDMAPRemoteProtect, rdmapCode(ae), driver.EventQPAccessErr,
			"atomic at STag %#x offset %#x: %v", a.STag(), a.TO(), ae)
	}
	word := (*uint64)(unsafe.Pointer(&b[0]))
	var old uint64
	switch a.Op() {
	case wire.AtomicFetchAdd:
		old = atomic.AddUint64(word, a.AddSwap()) - a.AddSwap()
	default: // swap, compare and swap, each under its masks
		cmp, cmask := a.Compare(), a.CompareMask()
		if a.Op() == wire.AtomicSwap {
			cmask = 0
		}
		swap, smask := a.AddSwap(), a.AddSwapMask()
		for {
			old = atomic.LoadUint64(word)
			if old&cmask != cmp&cmask {
				break
			}
			if atomic.CompareAndSwapUint64(word, old, old&^smask|swap&smask) {
				break
			}
		}
	}
	c.irq[c.irqTail%uint64(len(c.irq))] = irqEntry{kind: irqAtomic, id: a.ID(), value: old}
	c.irqTail++
	c.rx.owe = true
	return nil
}

// addResponses builds the queued Read and Atomic Responses into b, in
// order, as far as the batch takes them. q.mu is held.
func (c *conn) addResponses(b *txBatch) {
	src := &b.src
	for c.irqHead != c.irqTail {
		e := &c.irq[c.irqHead%uint64(len(c.irq))]
		switch e.kind {
		case irqAtomic:
			if !b.room(wire.AtomicRespLen, 0) {
				return
			}
			c.q.req.msn[wire.QNAtomic]++
			wire.AtomicResponse(b.header(wire.AtomicRespLen)).Set(c.q.req.msn[wire.QNAtomic], e.id, e.value)
			b.endFrame(nil, 0, 0)
		case irqRead:
			if e.mr != nil {
				// Pinned first, then checked: a Dereg that revokes
				// the region after the check finds it pinned.
				if !c.crc {
					c.pin(e.mr)
				}
				if e.mr.ext.Revoked() {
					// Dereg ends the stream (revokeRead): nothing
					// more of the region goes out.
					return
				}
			}
			src.One(e.src)
			for first := true; first || e.off < len(e.src); first = false {
				n := min(len(e.src)-e.off, maxPayload)
				if !b.room(wire.TaggedLen, n) {
					return
				}
				last := e.off+n == len(e.src)
				wire.Hdr(b.header(wire.TaggedLen)).SetTagged(wire.OpReadResponse, last, e.sinkSTag, e.sinkTO+uint64(e.off), n)
				if c.crc && !b.inlines(n) {
					// The memory read may be written while the frame
					// goes out (a Read of it then returns torn data, as
					// on any device); its CRC must cover the bytes
					// sent, so they are copied first (an inline payload
					// is a copy already).
					b.snapSrc.One(b.snapshot(e.src[e.off : e.off+n]))
					b.endFrame(&b.snapSrc, 0, n)
				} else {
					b.endFrame(src, uint64(e.off), n)
				}
				e.off += n
			}
		}
		*e = irqEntry{}
		c.irqHead++
	}
}
