package iwarp

import (
	"fmt"
	"time"

	"github.com/goverbs/goverbs/provider/iwarp/wire"
	"github.com/goverbs/goverbs/verbs/driver"
)

// Connection startup: the initiator's RTR (RFC 6581 peer-to-peer mode),
// the gate that keeps a responder silent until the initiator's first FPDU
// has arrived (RFC 5044), and the kick that works around Linux siw's
// setup race.

// watchRTR ends the connection (a responder's in peer-to-peer mode) if
// the initiator's RTR has not arrived within d: the QP moves to the error
// state and its WRs are flushed, as when the stream breaks.
func (c *conn) watchRTR(d time.Duration) {
	c.kickMu.Lock()
	defer c.kickMu.Unlock()
	c.rtrTimer = time.AfterFunc(d, func() {
		select {
		case <-c.rtrSeen:
		default:
			debugf("QP %d: no RTR from the initiator within %v", c.q.num, d)
			c.streamBroken(errNoRTR)
		}
	})
}

// errNoRTR ends a connection whose initiator did not send its RTR.
var errNoRTR = fmt.Errorf("%w: no RTR from the initiator in time after the MPA Reply", driver.ErrDisconnected)

// speakFirst opens the gate of a responder whose initiator did not ask
// for peer-to-peer mode d after the MPA Reply, if the initiator's first
// FPDU has not opened it before. RFC 5044 lets a responder send only
// once the initiator's first FPDU has arrived; an initiator without
// peer-to-peer mode sends first only if its application does, and Linux
// siw's never asks for that mode, so a server whose protocol speaks first
// (librdmacm's cmatose, rdma_server-style services) would wait forever.
// siw's own responder sends as soon as its Reply is out. The wait gives
// the initiator time to read the Reply first: siw's initiator reads the
// Reply's private data with a receive of 4 bytes more, and fails the
// connection if FPDU bytes already follow it in the socket.
func (c *conn) speakFirst(d time.Duration) {
	c.kickMu.Lock()
	defer c.kickMu.Unlock()
	c.gateTimer = time.AfterFunc(d, func() {
		if !c.aborted.Load() && !c.gate.Load() {
			debugf("QP %d: the initiator has sent nothing %v after the MPA Reply: sending first", c.q.num, d)
			c.openGate()
		}
	})
}

// The first kick and the last wait of the startup kick.
const (
	kickFirst = 5 * time.Millisecond
	kickLast  = time.Second
)

// kickCheck works around a race in Linux siw's connection setup (6.1 and
// later): siw sends its MPA Reply before it hooks the socket's data
// callback for RDMA mode, so FPDUs that arrive in between sit in its
// socket unread until more data comes. An initiator that has heard
// nothing from the peer sends a zero-length RDMA Write (a no-op any
// iWARP responder takes), a few times with growing waits, which makes
// siw read what was stranded: while it waits for a response, and, with
// a peer other than goverbs in peer-to-peer mode, from the start, since
// siw's responder completes its side of the connection (rdma_accept's
// ESTABLISHED event) only once it has read the RTR. A responder left
// without it keeps the connection half set up, and Linux's iWARP
// connection manager has been seen to hit a BUG when such connections
// are closed. A goverbs responder has no such race and is not kicked
// but while a response is awaited.
func (c *conn) kickCheck() {
	if c.heard.Load() || c.aborted.Load() {
		return
	}
	q := c.q
	q.mu.Lock()
	if q.c == c && (q.req.orqLen() > 0 || c.kickRTR) {
		c.kickNow = true
		c.wakeTx()
	}
	q.mu.Unlock()
	c.kickMu.Lock()
	if c.kickDelay *= 2; c.kickDelay <= kickLast && !c.aborted.Load() {
		c.kickTimer.Reset(c.kickDelay)
	}
	c.kickMu.Unlock()
}

// openGate lets the transmitter send once the first FPDU has arrived
// (the accepting side sends nothing before it: see gate).
func (c *conn) openGate() {
	c.gate.Store(true)
	c.wakeTx()
}

// firstFPDU handles the first FPDU of a responder's stream: it opens the
// transmitter (MPA lets the responder send only once the initiator has),
// and in peer-to-peer mode it must be the RTR agreed on.
func (c *conn) firstFPDU(h wire.Hdr) error {
	c.openGate()
	if c.wantRTR == 0 {
		return nil
	}
	ok := false
	switch h.Opcode() {
	case wire.OpWrite:
		ok = c.wantRTR&wire.RTRWrite != 0 && h.PayloadLen() == 0
		if ok && c.ext && h.TO()&0xffffffff00000000 == wire.RTRQPNTag {
			c.remoteQPN.Store(uint32(h.TO()))
			c.q.mu.Lock()
			if c.q.c == c {
				c.q.attr.DestQPNum = uint32(h.TO())
			}
			c.q.mu.Unlock()
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
