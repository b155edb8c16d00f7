package iwarp

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goverbs/goverbs/provider/iwarp/wire"
	"github.com/goverbs/goverbs/verbs/driver"
)

// The receiver: one goroutine per connection reads every FPDU, checks
// its headers, and reads its payload from the socket straight into the
// memory it targets: the registered region of a Write (after checking
// STag, bounds and rights), the receive buffer a Send consumes, the
// local buffers of the Read a Read Response answers. CRC32c is computed
// over what was read. A malformed or forbidden FPDU ends the stream with
// a Terminate: the QP moves to the error state and nothing more is
// placed.

// rxState is the receiver's state; only the receiving goroutine touches
// it.
type rxState struct {
	hdr   [wire.MaxHeaderLen + wire.TerminateMaxLen]byte
	tail  [3 + wire.CRCLen + wire.MinHeaderLen]byte
	ahead [wire.MinHeaderLen]byte // the start of the next FPDU's headers, read with a trailer
	have  int                     // bytes in ahead
	one   [1][]byte               // a one-segment list for readPayload
	crc   uint32

	msn [wire.NumQN]uint32 // the next MSN expected, per queue

	// The Send message being placed.
	send struct {
		active bool
		recv   rwqe
		segs   [maxSGE][]byte
		nseg   int
		room   uint64
		placed uint64
	}
	// The immediate lent to the next Send (a Send with immediate).
	immNext    bool
	immNextVal uint32
	// Writes: the length of the Write message in progress, and of the
	// last one completed (the length a Write with immediate reports).
	writeLen     uint64
	lastWriteLen uint64
	// The Read Response being placed.
	resp struct {
		active   bool
		segs     [maxSGE][]byte
		nseg     int
		size     uint32
		placed   uint32
		sinkSTag uint32
		sinkTO   uint64
	}
	drain [4096]byte
	// held: a receive completion waits in q.rxHeld for the next FPDU.
	held bool
}

// termError is a protocol error found in the stream: what the Terminate
// reports, and whether to copy the offending headers into it.
type termError struct {
	layer   wire.Layer
	etype   uint8
	ecode   uint8
	copyHdr bool
	event   driver.EventType
	what    string
}

func (e *termError) Error() string { return e.what }

func protoErr(layer wire.Layer, etype, ecode uint8, ev driver.EventType, format string, args ...any) *termError {
	return &termError{layer: layer, etype: etype, ecode: ecode, copyHdr: true, event: ev, what: fmt.Sprintf(format, args...)}
}

// truncated turns the end of the stream inside an FPDU into the error a
// Terminate reports; other errors (a reset, a closed socket) end the
// stream without one.
func truncated(err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return &termError{layer: wire.LayerLLP, etype: wire.LLPMPAError, ecode: wire.LLPConnectionLost,
			copyHdr: true, event: driver.EventQPFatal, what: "the stream ended inside an FPDU"}
	}
	return err
}

// errPeerTerminated ends the stream after a Terminate from the peer.
var errPeerTerminated = errors.New("the peer terminated the stream")

// rxLoop is the receiver.
func (c *conn) rxLoop() {
	defer c.wg.Done()
	defer c.finish()
	c.rx.msn = [wire.NumQN]uint32{1, 1, 1, 1}
	err := c.receive()
	if c.rx.held {
		c.releaseRecv()
	}
	debugf("QP %d: stream ended: %v", c.q.num, err)
	var te *termError
	if errors.As(err, &te) {
		c.protocolError(te)
	}
}

// protocolError ends the stream after an error the receiver found: the
// QP fails, the Terminate goes out after the responses already queued,
// and the receiver drains the socket until the peer closes (so that the
// Terminate is not lost to a reset), for a bounded time.
func (c *conn) protocolError(te *termError) {
	q := c.q
	q.mu.Lock()
	if q.c != c || q.destroyed {
		q.mu.Unlock()
		return
	}
	var hdr wire.Hdr
	if te.copyHdr {
		hdr = wire.Hdr(c.rx.hdr[:])
	}
	c.terminate(te.layer, te.etype, te.ecode, hdr)
	if q.attr.State != driver.QPSErr {
		q.ctx.event(te.event, q.userCtx)
		q.toErr()
	}
	q.mu.Unlock()
	deadline := time.Now().Add(terminateTimeout)
	c.nc.SetReadDeadline(deadline)
	for {
		if _, err := c.nc.Read(c.rx.drain[:]); err != nil {
			break
		}
	}
	// The peer may have closed its side before the Terminate went out:
	// give the transmitter the rest of the time to send it.
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-c.txDone:
	case <-t.C:
	}
}

// receive reads FPDUs until the stream ends or breaks (the error is
// returned) or carries an error (a *termError).
func (c *conn) receive() error {
	rx := &c.rx
	for {
		n, err := c.readHeader()
		if err != nil {
			return err
		}
		h := wire.Hdr(rx.hdr[:n])
		if !c.heard.Load() {
			c.heard.Store(true)
		}
		if !c.gate.Load() {
			if err := c.firstFPDU(h); err != nil {
				return err
			}
		}
		held := rx.held
		rx.held = false
		switch op := h.Opcode(); op {
		case wire.OpWrite:
			err = c.rxWrite(h)
		case wire.OpReadResponse:
			err = c.rxReadResponse(h)
		case wire.OpSend, wire.OpSendInv, wire.OpSendSE, wire.OpSendSEInv:
			err = c.rxSend(h)
		case wire.OpReadRequest:
			err = c.rxReadRequest(h)
		case wire.OpTerminate:
			return c.rxTerminate(h)
		case wire.OpImmData, wire.OpImmDataSE:
			err = c.rxImmData(h)
		case wire.OpAtomicRequest:
			err = c.rxAtomicRequest(h)
		case wire.OpAtomicResponse:
			err = c.rxAtomicResponse(h)
		}
		if held {
			c.releaseRecv()
		}
		if err != nil {
			return err
		}
	}
}

// readHeader reads the headers of the next FPDU into rx.hdr and returns
// their length, having checked them as far as they go alone. It starts
// the FPDU's CRC.
func (c *conn) readHeader() (int, error) {
	rx := &c.rx
	have := copy(rx.hdr[:], rx.ahead[:rx.have])
	rx.have = 0
	if have < wire.MinHeaderLen {
		if _, err := io.ReadFull(c.nc, rx.hdr[have:wire.MinHeaderLen]); err != nil {
			if have == 0 && err == io.EOF {
				return 0, err // the stream ended between FPDUs
			}
			return 0, truncated(err)
		}
	}
	n, err := wire.ValidateHdr(rx.hdr[:wire.MinHeaderLen], c.ext)
	if err != nil {
		var he *wire.HeaderError
		errors.As(err, &he)
		return 0, &termError{layer: he.Layer, etype: he.EType, ecode: he.ECode, copyHdr: he.Layer != wire.LayerLLP,
			event: driver.EventQPReqErr, what: he.What}
	}
	if n > wire.MinHeaderLen {
		if _, err := io.ReadFull(c.nc, rx.hdr[wire.MinHeaderLen:n]); err != nil {
			return 0, truncated(err)
		}
	}
	if c.crc {
		rx.crc = crc32.Update(0, wire.Castagnoli, rx.hdr[:n])
	}
	return n, nil
}

// readPayload reads n payload bytes into segs, skipping the first skip
// bytes of the list, straight from the socket; the CRC covers them.
func (c *conn) readPayload(segs [][]byte, skip uint64, n int) error {
	for _, s := range segs {
		if n == 0 {
			break
		}
		if skip >= uint64(len(s)) {
			skip -= uint64(len(s))
			continue
		}
		s = s[skip:]
		skip = 0
		if len(s) > n {
			s = s[:n]
		}
		if _, err := io.ReadFull(c.nc, s); err != nil {
			return truncated(err)
		}
		if c.crc {
			c.rx.crc = crc32.Update(c.rx.crc, wire.Castagnoli, s)
		}
		n -= len(s)
	}
	return nil
}

// readTrailer reads the pad and CRC of the FPDU whose headers are h,
// with as much of the next FPDU's headers as has arrived (never past
// them), and checks the CRC.
func (c *conn) readTrailer(h wire.Hdr) error {
	rx := &c.rx
	t := wire.Pad(h.ULPDULen()) + wire.CRCLen
	n, err := io.ReadAtLeast(c.nc, rx.tail[:t+wire.MinHeaderLen], t)
	if err != nil {
		return truncated(err)
	}
	if c.crc {
		crc := crc32.Update(rx.crc, wire.Castagnoli, rx.tail[:t-wire.CRCLen])
		if got := wire.CRC(rx.tail[t-wire.CRCLen : t]); got != crc {
			return &termError{layer: wire.LayerLLP, etype: wire.LLPMPAError, ecode: wire.LLPCRCError, copyHdr: false,
				event: driver.EventQPFatal, what: fmt.Sprintf("MPA CRC %#08x, computed %#08x", got, crc)}
		}
	}
	rx.have = copy(rx.ahead[:], rx.tail[t:n])
	return nil
}

// discard reads and drops n payload bytes, CRC included.
func (c *conn) discard(n int) error {
	for n > 0 {
		k := min(n, len(c.rx.drain))
		if _, err := io.ReadFull(c.nc, c.rx.drain[:k]); err != nil {
			return truncated(err)
		}
		if c.crc {
			c.rx.crc = crc32.Update(c.rx.crc, wire.Castagnoli, c.rx.drain[:k])
		}
		n -= k
	}
	return nil
}

// firstFPDU handles the first FPDU of a responder's stream: it opens the
// transmitter (MPA lets the responder send only once the initiator has),
// and in peer-to-peer mode it must be the RTR agreed on.
func (c *conn) firstFPDU(h wire.Hdr) error {
	c.gate.Store(true)
	c.wakeTx()
	if c.wantRTR == 0 {
		return nil
	}
	ok := false
	switch h.Opcode() {
	case wire.OpWrite:
		ok = c.wantRTR&wire.RTRWrite != 0 && h.PayloadLen() == 0
		if ok && c.ext && h.TO()&0xffffffff00000000 == wire.RTRQPNTag {
			c.remoteQPN.Store(uint32(h.TO()))
		}
	case wire.OpReadRequest:
		ok = c.wantRTR&wire.RTRRead != 0 && wire.ReadRequest(h).Size() == 0
	}
	if !ok {
		return protoErr(wire.LayerLLP, wire.LLPMPAError, wire.LLPNoMatchingRTR, driver.EventQPReqErr,
			"the first FPDU is a %v, not the RTR negotiated", h.Opcode())
	}
	close(c.rtrSeen)
	return nil
}

// rxWrite places an RDMA Write segment in the region its STag names.
func (c *conn) rxWrite(h wire.Hdr) error {
	q := c.q
	n := h.PayloadLen()
	if n > 0 {
		q.mu.Lock()
		ok := q.accepts() && q.attr.AccessFlags&driver.AccessRemoteWrite != 0
		q.mu.Unlock()
		b, ae := c.q.ctx.span(h.STag(), q.pd, h.TO(), uint64(n), driver.AccessRemoteWrite)
		if !ok && ae == accessOK {
			ae = accessRights
		}
		if ae != accessOK {
			return protoErr(wire.LayerDDP, wire.DDPTaggedError, taggedCode(ae), driver.EventQPAccessErr,
				"RDMA Write of %d bytes at STag %#x offset %#x: %v", n, h.STag(), h.TO(), ae)
		}
		c.rx.one[0] = b
		err := c.readPayload(c.rx.one[:], 0, n)
		c.rx.one[0] = nil
		if err != nil {
			return err
		}
	}
	if err := c.readTrailer(h); err != nil {
		return err
	}
	c.rx.writeLen += uint64(n)
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

// rxReadResponse places a Read Response segment in the local buffers of
// the Read at the head of the ORQ.
func (c *conn) rxReadResponse(h wire.Hdr) error {
	q := c.q
	rx := &c.rx
	if !rx.resp.active {
		q.mu.Lock()
		r := &q.req
		if r.orqHead == r.orqTail || r.orq[r.orqHead%maxRdAtomic].kind == orqAtomic {
			q.mu.Unlock()
			return protoErr(wire.LayerDDP, wire.DDPTaggedError, wire.DDPInvalidSTag, driver.EventQPFatal,
				"a Read Response with no Read outstanding")
		}
		e := &r.orq[r.orqHead%maxRdAtomic]
		rx.resp.nseg = copy(rx.resp.segs[:], e.segs[:e.nseg])
		rx.resp.size, rx.resp.placed = e.size, 0
		rx.resp.sinkSTag, rx.resp.sinkTO = e.sinkSTag, e.sinkTO
		rx.resp.active = true
		q.mu.Unlock()
	}
	n := h.PayloadLen()
	if rx.resp.size == 0 && h.STag() == rx.resp.sinkSTag {
		// A zero-length Read places nothing, whatever comes back: Linux
		// siw answers one that waited behind another response with the
		// bytes of the last buffer it sent (in 6.1, siw_activate_tx
		// leaves the previous work request's SGE in place), so the
		// payload is dropped rather than the stream failed.
		n = 0
		if err := c.discard(h.PayloadLen()); err != nil {
			return err
		}
	}
	switch {
	case h.STag() != rx.resp.sinkSTag:
		return protoErr(wire.LayerDDP, wire.DDPTaggedError, wire.DDPInvalidSTag, driver.EventQPFatal,
			"Read Response for STag %#x, the Read named %#x", h.STag(), rx.resp.sinkSTag)
	case h.TO() != rx.resp.sinkTO+uint64(rx.resp.placed) || uint64(n) > uint64(rx.resp.size-rx.resp.placed):
		return protoErr(wire.LayerDDP, wire.DDPTaggedError, wire.DDPBaseBounds, driver.EventQPFatal,
			"Read Response of %d bytes at offset %#x outside the %d-byte Read", n, h.TO(), rx.resp.size)
	case h.Last() && uint64(rx.resp.placed)+uint64(n) != uint64(rx.resp.size):
		return protoErr(wire.LayerDDP, wire.DDPTaggedError, wire.DDPBaseBounds, driver.EventQPFatal,
			"Read Response ends after %d bytes of a %d-byte Read", uint64(rx.resp.placed)+uint64(n), rx.resp.size)
	}
	if err := c.readPayload(rx.resp.segs[:rx.resp.nseg], uint64(rx.resp.placed), n); err != nil {
		return err
	}
	if err := c.readTrailer(h); err != nil {
		return err
	}
	rx.resp.placed += uint32(n)
	if h.Last() {
		rx.resp.active = false
		clear(rx.resp.segs[:rx.resp.nseg])
		q.mu.Lock()
		if q.c == c && q.accepts() {
			q.responseDone(rx.resp.placed)
		}
		q.mu.Unlock()
	}
	return nil
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

// rxSend places a Send segment in the receive the message consumes.
func (c *conn) rxSend(h wire.Hdr) error {
	q := c.q
	rx := &c.rx
	if err := c.untaggedCheck(h, wire.QNSend); err != nil {
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
		return protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPTooLong, driver.EventQPReqErr,
			"a Send of more than %d bytes for a %d-byte receive", s.placed+uint64(n), s.room)
	}
	if err := c.readPayload(s.segs[:s.nseg], s.placed, n); err != nil {
		return err
	}
	if err := c.readTrailer(h); err != nil {
		return err
	}
	s.placed += uint64(n)
	if !h.Last() {
		return nil
	}
	rx.msn[wire.QNSend]++
	wc := driver.WorkCompletion{Opcode: driver.WCRecv, ByteLen: uint32(s.placed), SrcQP: c.remoteQPN.Load()}
	if op := h.Opcode(); op == wire.OpSendSE || op == wire.OpSendSEInv {
		wc.Flags |= driver.WCSolicited
	}
	if rx.immNext {
		rx.immNext = false
		wc.Flags |= driver.WCWithImm
		wc.Imm = rx.immNextVal
	}
	if op := h.Opcode(); op == wire.OpSendInv || op == wire.OpSendSEInv {
		stag := h.InvalidateSTag()
		if !q.ctx.invalidate(stag, q.pd) {
			c.completeSend(driver.WCRemInvReqErr)
			return protoErr(wire.LayerRDMAP, wire.RDMAPRemoteOperation, wire.RDMAPCannotInvalidate, driver.EventQPReqErr,
				"Send with Invalidate of STag %#x, which names no region of the QP's PD", stag)
		}
		wc.Flags |= driver.WCWithInv
		wc.InvalidatedRKey = stag
	}
	c.completeSendWC(wc)
	return nil
}

// takeRecv consumes the receive the Send that starts now fills, and
// resolves its buffers.
func (c *conn) takeRecv() error {
	q := c.q
	s := &c.rx.send
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.accepts() || q.c != c {
		return io.EOF
	}
	if !q.takeRecv(&s.recv) {
		return protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPNoBuffer, driver.EventQPReqErr,
			"a Send arrived and no receive is posted (iWARP has no RNR retry: post receives before the peer sends)")
	}
	q.rxActive, q.rxWRID = true, s.recv.wrid
	s.active, s.nseg, s.room, s.placed = true, 0, 0, 0
	q.ctx.mu.RLock()
	defer q.ctx.mu.RUnlock()
	for i := range s.recv.sge {
		g := &s.recv.sge[i]
		b, e := q.ctx.spanLocked(g.LKey, q.pd, g.Addr, uint64(g.Length), driver.AccessLocalWrite)
		if e != accessOK {
			q.rxActive, s.active = false, false
			q.completeRecv(driver.WorkCompletion{WRID: s.recv.wrid, Status: driver.WCLocProtErr, Opcode: driver.WCRecv})
			return protoErr(wire.LayerDDP, wire.DDPCatastrophic, 0, driver.EventQPAccessErr,
				"receive buffer %d of WR %#x: %v", i, s.recv.wrid, e)
		}
		s.segs[s.nseg] = b
		s.nseg++
		s.room += uint64(len(b))
	}
	return nil
}

// completeSend completes the receive being filled with an error status.
func (c *conn) completeSend(status driver.WCStatus) {
	c.completeSendWC(driver.WorkCompletion{Status: status, Opcode: driver.WCRecv})
}

// readRequestNext reports whether the headers of the next FPDU, as far
// as they have arrived with the last trailer, are a Read Request's.
func (c *conn) readRequestNext() bool {
	h := wire.Hdr(c.rx.ahead[:c.rx.have])
	return len(h) >= 4 && !h.Tagged() && h.Opcode() == wire.OpReadRequest
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
// FPDU is a Read Request that has begun to arrive: a peer follows its
// Sends with a Read (a zero-length one where it has nothing else to
// read) to learn that they were placed, and answering it before the
// application hears of the Send means that an application that
// disconnects as soon as it has the message still lets the peer's Send
// complete as a success, as an InfiniBand acknowledgement would.
func (c *conn) completeSendWC(wc driver.WorkCompletion) {
	q := c.q
	s := &c.rx.send
	s.active = false
	clear(s.segs[:s.nseg])
	q.mu.Lock()
	if q.rxActive && q.c == c {
		q.rxActive = false
		wc.WRID = s.recv.wrid
		if wc.Status != driver.WCSuccess {
			wc = driver.WorkCompletion{WRID: wc.WRID, Status: wc.Status, Opcode: driver.WCRecv}
			q.completeRecv(wc)
		} else if c.readRequestNext() {
			q.rxHeld, q.rxHeldWC = true, wc
			c.rx.held = true
		} else {
			q.completeRecv(wc)
		}
	}
	q.mu.Unlock()
}

// rxImmData handles RFC 7306 Immediate Data: lent to the next Send, or
// consuming a receive that completes a Write with immediate.
func (c *conn) rxImmData(h wire.Hdr) error {
	q := c.q
	rx := &c.rx
	if err := c.untaggedCheck(h, wire.QNSend); err != nil {
		return err
	}
	if h.PayloadLen() != 0 || rx.send.active || rx.immNext {
		return protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPInvalidMO, driver.EventQPReqErr,
			"Immediate Data inside another message")
	}
	if err := c.readTrailer(h); err != nil {
		return err
	}
	rx.msn[wire.QNSend]++
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
	var r rwqe
	if !q.takeRecv(&r) {
		return protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPNoBuffer, driver.EventQPReqErr,
			"an RDMA Write with immediate arrived and no receive is posted")
	}
	wc := driver.WorkCompletion{WRID: r.wrid, Opcode: driver.WCRecvRDMAWithImm, Flags: driver.WCWithImm,
		Imm: d.Imm(), ByteLen: uint32(rx.lastWriteLen), SrcQP: c.remoteQPN.Load()}
	if h.Opcode() == wire.OpImmDataSE {
		wc.Flags |= driver.WCSolicited
	}
	q.completeRecv(wc)
	return nil
}

// rxReadRequest queues the Read Response to an RDMA Read Request, after
// checking the STag, bounds and rights of the memory read and the IRD.
func (c *conn) rxReadRequest(h wire.Hdr) error {
	q := c.q
	if err := c.untaggedCheck(h, wire.QNRead); err != nil {
		return err
	}
	if h.PayloadLen() != 0 {
		return protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPInvalidMO, driver.EventQPReqErr,
			"a Read Request with %d bytes of payload", h.PayloadLen())
	}
	if err := c.readTrailer(h); err != nil {
		return err
	}
	c.rx.msn[wire.QNRead]++
	r := wire.ReadRequest(h)
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.accepts() || q.c != c {
		return io.EOF
	}
	if c.irqTail-c.irqHead >= uint64(len(c.irq)) {
		return protoErr(wire.LayerRDMAP, wire.RDMAPRemoteOperation, wire.RDMAPCatastrophicLocal, driver.EventQPReqErr,
			"more Read Requests outstanding than the IRD of %d this side offered", len(c.irq))
	}
	var src []byte
	if size := r.Size(); size > 0 {
		var ae accessError
		src, ae = q.ctx.span(r.SrcSTag(), q.pd, r.SrcTO(), uint64(size), driver.AccessRemoteRead)
		if ae == accessOK && q.attr.AccessFlags&driver.AccessRemoteRead == 0 {
			ae = accessRights
		}
		if ae != accessOK {
			return protoErr(wire.LayerRDMAP, wire.RDMAPRemoteProtect, rdmapCode(ae), driver.EventQPAccessErr,
				"RDMA Read of %d bytes at STag %#x offset %#x: %v", size, r.SrcSTag(), r.SrcTO(), ae)
		}
	}
	c.irq[c.irqTail%uint64(len(c.irq))] = irqEntry{kind: irqRead, sinkSTag: r.SinkSTag(), sinkTO: r.SinkTO(), src: src}
	c.irqTail++
	c.wakeTx()
	return nil
}

// rxAtomicRequest performs an RFC 7306 atomic on the word it names, with
// a CPU atomic instruction, and queues the response with the word's
// original value.
func (c *conn) rxAtomicRequest(h wire.Hdr) error {
	q := c.q
	if err := c.untaggedCheck(h, wire.QNAtomic); err != nil {
		return err
	}
	if err := c.readTrailer(h); err != nil {
		return err
	}
	c.rx.msn[wire.QNAtomic]++
	a := wire.AtomicRequest(h)
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.accepts() || q.c != c {
		return io.EOF
	}
	switch {
	case c.irqTail-c.irqHead >= uint64(len(c.irq)):
		return protoErr(wire.LayerRDMAP, wire.RDMAPRemoteOperation, wire.RDMAPCatastrophicLocal, driver.EventQPReqErr,
			"more atomics outstanding than the IRD of %d this side offered", len(c.irq))
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
	b, ae := q.ctx.span(a.STag(), q.pd, a.TO(), 8, driver.AccessRemoteAtomic)
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
	c.wakeTx()
	return nil
}

// rxAtomicResponse completes the atomic at the head of the ORQ.
func (c *conn) rxAtomicResponse(h wire.Hdr) error {
	q := c.q
	if err := c.untaggedCheck(h, wire.QNAtomic); err != nil {
		return err
	}
	if err := c.readTrailer(h); err != nil {
		return err
	}
	c.rx.msn[wire.QNAtomic]++
	a := wire.AtomicResponse(h)
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.c != c || !q.accepts() {
		return io.EOF
	}
	if !q.atomicDone(a.ID(), a.Value()) {
		return protoErr(wire.LayerRDMAP, wire.RDMAPRemoteOperation, wire.RDMAPUnexpectedOpcode, driver.EventQPFatal,
			"an Atomic Response for request %d, which is not the one outstanding", a.ID())
	}
	return nil
}

// rxTerminate handles a Terminate from the peer: the WR it names fails
// with the error it reports, and the QP moves to the error state.
func (c *conn) rxTerminate(h wire.Hdr) error {
	q := c.q
	n := h.PayloadLen()
	if n > wire.TerminateMaxLen-wire.TerminateLen {
		// Too long to be a Terminate of RFC 5040: keep what fits.
		n = wire.TerminateMaxLen - wire.TerminateLen
	}
	c.rx.one[0] = c.rx.hdr[wire.TerminateLen : wire.TerminateLen+n]
	if err := c.readPayload(c.rx.one[:], 0, n); err != nil {
		return err
	}
	t := wire.Terminate(c.rx.hdr[:wire.TerminateLen+n])
	status := terminateStatus(t.Layer(), t.EType(), t.ECode())
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.c != c || q.destroyed {
		return errPeerTerminated
	}
	q.terminated(t.Terminated(), status)
	q.completeInOrder()
	if q.attr.State != driver.QPSErr {
		q.ctx.event(driver.EventQPFatal, q.userCtx)
		q.toErr()
	}
	return errPeerTerminated
}
