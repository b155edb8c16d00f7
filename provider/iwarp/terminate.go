package iwarp

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goverbs/goverbs/provider/iwarp/wire"
	"github.com/goverbs/goverbs/verbs/driver"
)

// Terminates: a protocol error found in the stream (termError) ends it
// with a Terminate that goes out after the responses already queued
// (protocolError, terminate); a Terminate from the peer is read here
// (siwTerminate, terminateKept) and applied to the WR it names by the
// completer (rxTerminate).

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
		q.ctx.Event(te.event, q.userCtx)
		q.toErr()
	}
	q.mu.Unlock()
	deadline := time.Now().Add(terminateTimeout)
	var drain [4096]byte
	// The deadline holds even for a peer that keeps the socket full.
	for time.Now().Before(deadline) {
		n, err := c.sk.read(drain[:])
		if err == unix.EAGAIN || err == unix.EINTR {
			err = c.sk.waitInUntil(deadline)
			if errors.Is(err, os.ErrDeadlineExceeded) && time.Now().Before(deadline) {
				err = nil // a poller's kick (kickRx)
			}
		} else if err == nil && n == 0 {
			break
		}
		if err != nil {
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

// terminate queues a Terminate for the transmitter, which sends it after
// the responses already queued and then half-closes the stream. The
// headers hdr of the offending segment are copied into it. q.mu is held.
func (c *conn) terminate(layer wire.Layer, etype, ecode uint8, hdr wire.Hdr) {
	if c.term {
		return
	}
	c.term = true
	c.termLen = wire.SetTerminate(c.termBuf[:], 1, layer, etype, ecode, hdr)
	c.wakeTx()
}

// siwTerminate reads the control word of a Terminate from a peer other
// than goverbs as Linux siw means it, when it is in siw's layout
// (wire.Terminate.FromSiw).
func siwTerminate(t wire.Terminate) { t.FromSiw() }

// terminateKept is how much of a Terminate's payload (the terminated
// headers) is kept: what the longest headers need.
func terminateKept(h wire.Hdr) int {
	return min(h.PayloadLen(), wire.TerminateMaxLen-wire.TerminateLen)
}
