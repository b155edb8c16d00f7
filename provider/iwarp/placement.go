package iwarp

import (
	"hash/crc32"
	"net"

	"github.com/goverbs/goverbs/provider/iwarp/wire"
	"github.com/goverbs/goverbs/verbs/driver"
)

// Placement: the payload of an FPDU is copied from the stage, or read
// straight from the socket (rxRead), into the memory rxBegin chose for
// it, and never into a region revoked under the placement (Dereg,
// invalidation) nor once the connection is aborted.

// place copies the first bytes of the payload, staged, into its target,
// unless the connection was aborted: abort waits for a copy in progress
// (rxBusy), as for a read, so nothing is placed once it returns.
func (c *conn) place(b []byte) error {
	rx := &c.rx
	return c.placeInto(rx.dst[:rx.ndst], rx.dstMR[:rx.ndstMR], rx.skip, b)
}

// placeInto is place into dst from byte skip on, dst lying in the
// regions mrs, none of which may have been revoked.
func (c *conn) placeInto(dst [][]byte, mrs []*mr, skip uint64, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	c.rxBusy.Add(1)
	defer c.rxBusy.Add(-1)
	if c.aborted.Load() {
		return net.ErrClosed
	}
	if anyRevoked(mrs) {
		return c.rx.revokedErr()
	}
	copyInto(dst, skip, b)
	return nil
}

// rxStagedSend handles, as rxBegin, place and rxComplete would, a Send
// message of one FPDU (headers h, taken from the stage) whose payload and
// trailer are staged too: the common small message. It takes the
// receive, places the payload and completes the receive under one hold of
// q.mu, where that road takes it twice. done is false, with nothing
// done, for any other FPDU, or one whose CRC is wrong (the long road
// reports it); err is the error that ends receiving.
func (c *conn) rxStagedSend(h wire.Hdr) (done bool, err error) {
	rx := &c.rx
	if op := h.Opcode(); !op.IsSend() || op.Invalidates() || !h.Last() || h.MO() != 0 ||
		rx.send.active || rx.held || h.QN() != wire.QNSend || h.MSN() != rx.msn[wire.QNSend] ||
		rx.sEnd-rx.sOff < rx.plen+rx.tlen {
		return false, nil
	}
	payload := rx.stage[rx.sOff : rx.sOff+rx.plen]
	trailer := rx.stage[rx.sOff+rx.plen : rx.sOff+rx.plen+rx.tlen]
	if c.crc && checkTrailer(crc32.Update(crc32.Update(0, wire.Castagnoli, h), wire.Castagnoli, payload), trailer) != nil {
		return false, nil
	}
	q := c.q
	q.mu.Lock()
	err = c.takeRecvLocked()
	if err == nil && uint64(rx.plen) > rx.send.room {
		err = c.sendTooLong(rx.plen)
		c.completeSendLocked(driver.WorkCompletion{Status: driver.WCLocLenErr, Opcode: driver.WCRecv})
	}
	if err == nil {
		clear(rx.dstMR[:rx.ndstMR]) // the last FPDU's, as rxBegin clears them
		rx.ndstMR = 0
		s := &rx.send
		err = c.placeInto(s.segs[:s.nseg], s.mrs[:s.nseg], 0, payload)
	}
	if err == nil {
		rx.sOff += rx.plen + rx.tlen
		rx.send.placed = uint64(rx.plen)
		rx.lookAhead()
		c.rxCounted(h)
		c.completeSendLocked(c.sendDone(h))
	}
	q.mu.Unlock()
	return true, err
}

// dstRevoked reports whether a region the payload goes to has been
// deregistered or invalidated since the FPDU began: nothing more may be
// placed there. Called between rxBusy's increment and the placement
// (see Dereg).
func (rx *rxState) dstRevoked() bool { return anyRevoked(rx.dstMR[:rx.ndstMR]) }

// anyRevoked reports whether a region of mrs has been revoked.
func anyRevoked(mrs []*mr) bool {
	for _, m := range mrs {
		if m.ext.Revoked() {
			return true
		}
	}
	return false
}

// revokedErr ends the stream when a region being placed into was
// deregistered or invalidated under the placement.
func (rx *rxState) revokedErr() error {
	return protoErr(wire.LayerDDP, wire.DDPTaggedError, wire.DDPInvalidSTag, driver.EventQPAccessErr,
		"a region the payload of the FPDU being received goes to was deregistered or invalidated while it was placed")
}

// dstSeg returns destination segment i from offset off within it (nil
// when off is past its end).
func (rx *rxState) dstSeg(i int, off uint64) []byte {
	s := rx.dst[i]
	if off >= uint64(len(s)) {
		return nil
	}
	return s[off:]
}

// copyInto copies b into the segments dst from byte off of them on.
// Under the race detector the copy is out of its sight, as the readv
// that places the rest of a payload is: an application may poll memory
// that a peer's RDMA Write is landing in (perftest's write_lat, a credit
// word), which RDMA allows.
func copyInto(dst [][]byte, off uint64, b []byte) {
	for _, s := range dst {
		if len(b) == 0 {
			return
		}
		if off >= uint64(len(s)) {
			off -= uint64(len(s))
			continue
		}
		s = s[off:]
		off = 0
		n := min(len(s), len(b))
		if raceEnabled {
			copyUnwatched(s, b)
		} else {
			copy(s, b)
		}
		b = b[n:]
	}
}

// planDst adds n bytes of the payload destination, from payload offset
// off, to the plan.
func (rx *rxState) planDst(off uint64, n int) {
	off += rx.skip
	for i := 0; i < rx.ndst && n > 0; i++ {
		s := rx.dstSeg(i, off)
		off -= min(off, uint64(len(rx.dst[i])))
		s = s[:min(len(s), n)]
		rx.addSeg(s)
		n -= len(s)
	}
}

// addSeg appends s to the plan.
func (rx *rxState) addSeg(s []byte) {
	if len(s) == 0 {
		return
	}
	rx.segs[rx.nseg] = s
	rx.iov[rx.nseg].Base = &s[0]
	rx.iov[rx.nseg].SetLen(len(s))
	rx.nseg++
	rx.want += len(s)
}
