package iwarp

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/internal/atomicrel"
	"github.com/goverbs/goverbs/provider/iwarp/wire"
	"github.com/goverbs/goverbs/verbs/driver"
)

// The receiver reads every FPDU, checks its headers, and places its
// payload in the memory it targets: the registered region of a Write
// (after checking STag, bounds and rights), the receive buffer a Send
// consumes, the local buffers of the Read a Read Response answers.
// CRC32c is computed over what was placed. A
// malformed or forbidden FPDU ends the stream with a Terminate: the QP
// moves to the error state and nothing more is placed.
//
// A receiver that needs the next FPDU's headers reads what has arrived,
// up to stageLen bytes, into the stage, and takes FPDUs from there for as
// long as it holds them whole; the payload of an FPDU that runs past the
// stage is read straight from the socket into its target (one readv with
// the trailer). So a small message takes one read system call, as in a
// plain TCP ping-pong, and its payload is copied once from the stage —
// as many copies as a peek at its headers followed by a read into its
// target would make — while the bulk of a large one is never staged.

// stageLen is the most a receiver reads before it knows where the bytes
// go: the headers of the next FPDUs and small payloads.
const stageLen = 512

// rxState is the receiver's state; only the holder of rxMu touches it.
// Its scalars come first, and each array's after them, so that the
// lines an FPDU touches in the state of a connection that has not run
// for a while (round-robin over many) are few.
type rxState struct {
	// settled: the QP can raise no communication established event for
	// a request of this connection any more (requestArrived).
	settled bool
	// The stage (below): stage[sOff:sEnd] is read and not yet taken;
	// drained: a read in this round found the socket empty (it read
	// less than it could), so the round ends instead of reading again.
	drained    bool
	sOff, sEnd int
	// The FPDU whose headers were taken: its header, payload and
	// trailer lengths, and, while planned, the rest of it to read
	// straight: iovecs for one readv (want bytes in all, got of them
	// read), mirrored as slices (iov and segs, below).
	planned          bool
	hlen, plen, tlen int
	nseg             int
	at               int // the segment the next read starts in
	atOff            int // bytes of it already read
	want             int
	got              int
	trailer          [3 + wire.CRCLen]byte
	// Where its payload goes (rxBegin): dst (below) from offset skip;
	// discard: it is siw's answer to a zero-length Read, dropped (into
	// drainBuf) with its CRC unchecked (see oversizedAnswerMax).
	discard bool
	ndst    int
	skip    uint64
	// dstMR[:ndstMR] (below): the regions rx.dst lies in, whose
	// revocation (Dereg, invalidation) stops placement (dstRevoked).
	ndstMR int
	msn    [wire.NumQN]uint32 // the next MSN expected, per queue
	// The immediate lent to the next Send (a Send with immediate).
	immNext    bool
	immNextVal uint32
	// Writes: the length of the Write message in progress, and of the
	// last one completed (the length a Write with immediate reports).
	writeLen     uint64
	lastWriteLen uint64
	// held: a receive completion waits in q.rxHeld for the next FPDU.
	held bool
	// nextRead: the next FPDU, already staged, is a Read Request.
	nextRead bool
	// owe: the round queued responses or freed request slots, which the
	// transmitter should send now; lazy: it queued answers to zero-length
	// Reads, which may wait a little (see rxTry).
	owe, lazy bool
	// err ends receiving: every round returns it at once.
	err      error
	drainBuf []byte        // lazily: payload that is read and dropped
	stageIov [1]unix.Iovec // need's read into the stage (not on need's stack, which sockIO, a variable, would move to the heap)

	// The Read Response being placed.
	resp struct {
		active   bool
		size     uint32
		placed   uint32
		sinkSTag uint32
		sinkTO   uint64
		// dropped: bytes of an answer to a zero-length Read dropped so
		// far (see oversizedAnswerMax).
		dropped uint64
		nseg    int
		nmr     int
		segs    [maxSGE][]byte
		mrs     [maxSGE]*mr // the regions of segs
	}
	// hdr holds the headers of the FPDU being handled (and a
	// Terminate's copy of the terminated headers).
	hdr   [wire.MaxHeaderLen + wire.TerminateMaxLen]byte
	stage [stageLen]byte
	iov   [maxSGE + 3]unix.Iovec // the planned readv: the rest of the FPDU, and the stage to read ahead into
	segs  [maxSGE + 2][]byte     // iov's slices
	dst   [maxSGE + 1][]byte
	dstMR [maxSGE]*mr
	// The Send message being placed.
	send struct {
		active bool
		nseg   int
		room   uint64
		placed uint64
		recv   rwqe
		segs   [maxSGE][]byte
		mrs    [maxSGE]*mr // the regions of segs
	}
	// immRecv: the receive a Write with immediate consumes, kept here so
	// that its SGE list's capacity is reused and taking it allocates
	// nothing.
	immRecv rwqe
}

// sysRead is one non-blocking read system call into iov on the
// connection's own descriptor: the number of bytes read, or 0 and false
// when nothing has arrived. A descriptor of c's, never the net package's,
// so that a poller can read while the receive goroutine waits in the
// runtime's poller; abort waits for the call in progress (rxBusy).
func (c *conn) sysRead(iov []unix.Iovec) (int, bool, error) {
	c.rxBusy.Add(1)
	defer c.rxBusy.Add(-1)
	// An abort comes first, as in place: a revoked destination is a
	// protocol error, which an ended connection no longer reports.
	if c.aborted.Load() {
		return 0, false, net.ErrClosed
	}
	if c.rx.dstRevoked() {
		return 0, false, c.rx.revokedErr()
	}
	return c.stageRead(iov)
}

// stageRead is sysRead into the stage alone, the connection's own
// memory: it needs no announcement (rxBusy), which is two locked
// instructions of every empty poll. The descriptor stays open meanwhile:
// the receive goroutine releases it under rxMu, which the caller holds.
func (c *conn) stageRead(iov []unix.Iovec) (int, bool, error) {
	if c.aborted.Load() {
		return 0, false, net.ErrClosed
	}
	for {
		n, e := sockIO(unix.SYS_READV, uintptr(c.sk.fd), iov)
		switch e {
		case 0:
			if n == 0 {
				return 0, true, io.EOF
			}
			if raceEnabled {
				raceAcquire(c.sk.fd)
			}
			return int(n), true, nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return 0, false, nil
		}
		c.noteErr(e)
		return 0, false, e
	}
}

// raceAcquire gives the race detector the edge from the peer's socket
// writes (see raceRelease) to what follows this read: a read(2) of
// nothing through the syscall package, which the runtime annotates.
func raceAcquire(fd int) { syscall.Read(fd, nil) }

// need makes sure that k bytes are staged, reading what has arrived into
// the stage: false when they have not arrived (or the round already found
// the socket drained). The end of the stream between FPDUs is io.EOF.
func (c *conn) need(k int) (bool, error) {
	rx := &c.rx
	for rx.sEnd-rx.sOff < k {
		if rx.drained {
			return false, nil
		}
		if rx.sOff > 0 {
			rx.sEnd = copy(rx.stage[:], rx.stage[rx.sOff:rx.sEnd])
			rx.sOff = 0
		}
		room := len(rx.stage) - rx.sEnd
		iov := rx.stageIov[:]
		iov[0].Base = &rx.stage[rx.sEnd]
		iov[0].SetLen(room)
		n, ok, err := c.stageRead(iov)
		if err != nil {
			if err == io.EOF && rx.sEnd == 0 {
				return false, err
			}
			return false, truncated(err)
		}
		if !ok {
			rx.drained = true
			return false, nil
		}
		rx.sEnd += n
		rx.drained = n < room
	}
	return true, nil
}

// rxNext takes the next FPDU's headers from the stage and places what
// of it is staged; the rest is planned (rxRead) or, when all of it was
// staged, the FPDU completes. idle: its headers have not all arrived.
func (c *conn) rxNext() (idle bool, err error) {
	rx := &c.rx
	if ok, err := c.need(wire.MinHeaderLen); !ok {
		return err == nil, err
	}
	hl, err := wire.ValidateHdr(rx.stage[rx.sOff:rx.sEnd], c.ext)
	if err != nil {
		if !c.gate.Load() {
			// A malformed first FPDU is the first FPDU all the same:
			// the Terminate for it may go out.
			c.openGate()
		}
		copy(rx.hdr[:], rx.stage[rx.sOff:rx.sEnd])
		var he *wire.HeaderError
		errors.As(err, &he)
		return false, &termError{layer: he.Layer, etype: he.EType, ecode: he.ECode, copyHdr: he.Layer != wire.LayerLLP,
			event: driver.EventQPReqErr, what: he.What}
	}
	if ok, err := c.need(hl); !ok {
		if err == io.EOF {
			err = truncated(err)
		}
		return err == nil, err
	}
	copy(rx.hdr[:hl], rx.stage[rx.sOff:])
	rx.sOff += hl
	h := wire.Hdr(rx.hdr[:hl])
	if !c.heard.Load() {
		c.heard.Store(true)
	}
	setup := false
	if !c.gate.Load() {
		if err := c.firstFPDU(h); err != nil {
			return false, err
		}
		setup = c.wantRTR != 0 // peer-to-peer mode's RTR, no request of the peer's
	}
	if !rx.settled && !setup && h.Opcode().Kind() == wire.KindRequest {
		c.requestArrived()
	}
	rx.hlen, rx.plen, rx.tlen = hl, h.PayloadLen(), wire.Pad(h.ULPDULen())+wire.CRCLen
	if done, err := c.rxStagedSend(h); done || err != nil {
		return false, err
	}
	if err := c.rxBegin(h); err != nil {
		return false, err
	}
	// What is staged of the payload and trailer is copied out; the rest
	// is read straight into place.
	k := min(rx.plen, rx.sEnd-rx.sOff)
	if err := c.place(rx.stage[rx.sOff : rx.sOff+k]); err != nil {
		return false, err
	}
	rx.sOff += k
	rx.nseg, rx.at, rx.atOff, rx.got, rx.want = 0, 0, 0, 0, 0
	t := 0
	if k < rx.plen {
		rx.planDst(uint64(k), rx.plen-k)
	} else {
		t = copy(rx.trailer[:rx.tlen], rx.stage[rx.sOff:rx.sEnd])
		rx.sOff += t
	}
	if t < rx.tlen {
		rx.addSeg(rx.trailer[t:rx.tlen])
	}
	if rx.nseg > 0 {
		// What follows the FPDU, up to a stage's worth, comes with the
		// same readv (the stage is empty: the FPDU ran past it).
		rx.sOff, rx.sEnd = 0, 0
		rx.iov[rx.nseg].Base = &rx.stage[0]
		rx.iov[rx.nseg].SetLen(len(rx.stage))
		rx.planned = true
		return false, nil
	}
	return false, c.rxComplete()
}

// requestArrived tells the QP that a request of the peer has reached it
// (soft.QP.RequestArrived: the first, in RTR, raises EventCommEst), until
// the QP says that no request can raise the event any more.
func (c *conn) requestArrived() {
	q := c.q
	q.mu.Lock()
	if q.c == c {
		c.rx.settled = q.RequestArrived(q.ctx.EventQueue, q.userCtx)
	}
	q.mu.Unlock()
}

// rxRead reads the planned bytes, as far as they have arrived: done when
// all have. The read that completes them may bring the start of what
// follows into the stage.
func (c *conn) rxRead() (done bool, err error) {
	rx := &c.rx
	for rx.got < rx.want {
		if rx.atOff > 0 {
			s := rx.segs[rx.at][rx.atOff:]
			rx.iov[rx.at].Base = &s[0]
			rx.iov[rx.at].SetLen(len(s))
		}
		n, ok, err := c.sysRead(rx.iov[rx.at : rx.nseg+1])
		if err != nil {
			return false, truncated(err)
		}
		if !ok {
			rx.drained = true
			return false, nil
		}
		if ahead := rx.got + n - rx.want; ahead > 0 {
			rx.sEnd = ahead
			n -= ahead
			rx.drained = ahead < len(rx.stage)
		} else {
			rx.drained = false
		}
		rx.got += n
		for n > 0 {
			left := len(rx.segs[rx.at]) - rx.atOff
			if n < left {
				rx.atOff += n
				break
			}
			n -= left
			rx.at++
			rx.atOff = 0
		}
	}
	return true, nil
}

// rxComplete completes the FPDU whose headers rxNext took, all of it
// placed: its CRC is checked, then what it does is done.
func (c *conn) rxComplete() error {
	rx := &c.rx
	h := wire.Hdr(rx.hdr[:rx.hlen])
	err := c.rxCheckCRC(h)
	for i := range rx.nseg {
		rx.segs[i], rx.iov[i] = nil, unix.Iovec{}
	}
	rx.iov[rx.nseg] = unix.Iovec{}
	rx.nseg = 0
	clear(rx.dst[:rx.ndst])
	if err != nil {
		return err
	}
	rx.lookAhead()
	return c.rxEndFrame(h)
}

// lookAhead sees whether the next FPDU is a Read Request staged whole
// (nextRead), which this round handles: a receive completion is held
// back only for such a one, since a peer that sent part of one and
// stalls would otherwise keep a received Send from completing.
func (rx *rxState) lookAhead() {
	next := wire.Hdr(rx.stage[rx.sOff:rx.sEnd])
	rx.nextRead = len(next) >= readRequestFPDU && !next.Tagged() && next.Opcode() == wire.OpReadRequest
}

// readRequestFPDU is the length of an FPDU carrying a Read Request.
var readRequestFPDU = wire.FPDULen(wire.HeaderLen(wire.OpReadRequest) - wire.LenFieldLen)

// rxCheckCRC checks the MPA CRC of the FPDU with headers h, its payload
// in place and its trailer in rx.trailer, when CRCs are in use: all but
// a segment of siw's answer to a zero-length Read, which is dropped and
// whose CRC siw may have computed over other bytes (see
// oversizedAnswerMax); its headers were checked against the Read.
func (c *conn) rxCheckCRC(h wire.Hdr) error {
	rx := &c.rx
	if !c.crc || rx.discard {
		return nil
	}
	crc := crc32.Update(0, wire.Castagnoli, h)
	off, n := rx.skip, rx.plen
	for i := 0; i < rx.ndst && n > 0; i++ {
		s := rx.dstSeg(i, off)
		off -= min(off, uint64(len(rx.dst[i])))
		s = s[:min(len(s), n)]
		crc = crc32.Update(crc, wire.Castagnoli, s)
		n -= len(s)
	}
	return checkTrailer(crc, rx.trailer[:rx.tlen])
}

// checkTrailer checks the trailer t (pad and CRC) of an FPDU whose CRC
// over its headers and payload is crc.
func checkTrailer(crc uint32, t []byte) error {
	crc = crc32.Update(crc, wire.Castagnoli, t[:len(t)-wire.CRCLen])
	if got := wire.CRC(t[len(t)-wire.CRCLen:]); got != crc {
		return &termError{layer: wire.LayerLLP, etype: wire.LLPMPAError, ecode: wire.LLPCRCError, copyHdr: false,
			event: driver.EventQPFatal, what: fmt.Sprintf("MPA CRC %#08x, computed %#08x", got, crc)}
	}
	return nil
}

// rxEndFrame completes the FPDU with headers h once all of it is read,
// with the held receive completion released after it.
func (c *conn) rxEndFrame(h wire.Hdr) error {
	rx := &c.rx
	c.rxCounted(h)
	held := rx.held
	rx.held = false
	err := c.rxEnd(h)
	if held {
		c.releaseRecv()
	}
	return err
}

// rxCounted counts the FPDU with headers h as received.
func (c *conn) rxCounted(h wire.Hdr) {
	// One writer (under rxMu): release stores, not locked additions.
	atomicrel.StoreUint64(&c.rxFrames, c.rxFrames.Load()+1)
	atomicrel.StoreUint64(&c.rxBytes, c.rxBytes.Load()+uint64(h.PayloadLen()))
	switch op := h.Opcode(); {
	case op.Kind() == wire.KindResponse:
		atomicrel.StoreUint64(&c.rxAnswers, c.rxAnswers.Load()+1)
	case op.Kind() == wire.KindRequest && !op.Bare(): // a Write or a Send
		if mid := !h.Last(); mid != c.peerMid.Load() {
			c.peerMid.Store(mid)
		}
	}
}

// rxBegin checks the headers h of the FPDU about to be read, does what
// must precede its payload, and sets where the payload goes (rx.dst,
// skipping rx.skip bytes; payload beyond them is dropped).
func (c *conn) rxBegin(h wire.Hdr) error {
	rx := &c.rx
	rx.ndst, rx.skip, rx.discard = 0, 0, false
	clear(rx.dstMR[:rx.ndstMR])
	rx.ndstMR = 0
	n := h.PayloadLen()
	op := h.Opcode()
	if op.Bare() {
		if err := c.soleSegmentCheck(h, op.QN()); err != nil {
			return err
		}
		if n != 0 {
			return protoErr(wire.LayerDDP, wire.DDPUntaggedError, wire.DDPInvalidMO, driver.EventQPReqErr,
				"%v with %d bytes of payload", op, n)
		}
	}
	if begin := rxHandlers[op.Msg()].begin; begin != nil {
		if err := begin(c, h); err != nil {
			return err
		}
	}
	// What the destinations do not take (all of it when discarding) is
	// read into the drain and dropped.
	room := uint64(0)
	for _, s := range rx.dst[:rx.ndst] {
		room += uint64(len(s))
	}
	if rx.discard || room <= rx.skip {
		clear(rx.dst[:rx.ndst])
		rx.ndst, rx.skip, room = 0, 0, 0
	} else {
		room -= rx.skip
	}
	n = h.PayloadLen() - int(min(uint64(h.PayloadLen()), room))
	if n > 0 {
		// Payload nobody takes: read into the drain and dropped.
		if rx.drainBuf == nil {
			rx.drainBuf = make([]byte, 1<<16)
		}
		rx.dst[rx.ndst] = rx.drainBuf[:n]
		rx.ndst++
	}
	return nil
}

// rxEnd completes the FPDU with headers h: its payload and trailer are
// read and checked.
func (c *conn) rxEnd(h wire.Hdr) error {
	op := h.Opcode()
	if op.Bare() {
		c.rx.msn[op.QN()]++ // the message is whole: the next has the next MSN
	}
	if end := rxHandlers[op.Msg()].end; end != nil {
		return end(c, h)
	}
	return nil
}

// rxHandler is what the receiver does with the FPDUs of a message: begin
// (rxBegin, after the checks of a bare message) checks the headers and
// sets where the payload goes, before it is read; end (rxEnd) does what
// the FPDU does, once all of it is read and checked.
type rxHandler struct {
	begin, end func(*conn, wire.Hdr) error
}

// rxHandlers dispatches an FPDU by the message its opcode carries
// (wire.OpInfo.Msg): requests to the responder, responses and
// Terminates to the completer.
var rxHandlers = [wire.NumMessages]rxHandler{
	wire.MsgWrite:          {(*conn).rxWriteBegin, (*conn).rxWriteEnd},
	wire.MsgReadRequest:    {nil, (*conn).rxReadRequest},
	wire.MsgReadResponse:   {(*conn).rxReadResponseBegin, (*conn).rxReadResponseEnd},
	wire.MsgSend:           {(*conn).rxSendBegin, (*conn).rxSendEnd},
	wire.MsgTerminate:      {(*conn).rxTerminateBegin, (*conn).rxTerminate},
	wire.MsgImmData:        {(*conn).rxImmDataBegin, (*conn).rxImmData},
	wire.MsgAtomicRequest:  {nil, (*conn).rxAtomicRequest},
	wire.MsgAtomicResponse: {nil, (*conn).rxAtomicResponse},
}
