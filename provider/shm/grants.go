package shm

import "github.com/goverbs/goverbs/verbs/driver"

// What a QP's peer is handed is bounded by the QP's access flags as well
// as by the regions' rights: a QP without remote write hands its peer no
// writable mapping and no grant with remote write, whatever the regions
// of its PD allow. peerRights is the one check; reaches, shareable and
// grantLocked go through it.

// peerRights is what q's peer may do to memory registered with access:
// the remote rights that both the memory and the QP's access flags grant.
func (q *qp) peerRights(access driver.AccessFlags) driver.AccessFlags {
	return access & driver.AccessFlags(q.peerAccess.Load()) & driver.RemoteAccess
}

// noteAccess records the QP's remote access flags for peerRights and,
// when they changed while a connection is being made or stands, rewrites
// the peer's grant table and hands it its segments again as they may now
// be mapped (regrant). q.mu is held (publish).
func (q *qp) noteAccess() {
	a := uint32(q.attr.AccessFlags & driver.RemoteAccess)
	if q.destroyed || q.peerAccess.Swap(a) == a {
		return
	}
	q.regrant()
}

// regrant brings the peer's grants in line with the QP's access flags:
// the grant table is refilled (grantTo), and a started connection's peer
// is sent each segment of the QP's PD again, writable or read-only as it
// may now map it, or told to unmap it. An honest peer then maps what it
// is sent; a hostile one may keep a writable mapping it was handed
// before rights were taken away (see docs/limitations.md). q.mu is held.
func (q *qp) regrant() {
	q.grantMu.Lock()
	c := q.grantConn
	q.grantMu.Unlock()
	if c == nil {
		return
	}
	q.grantTo(c)
	if c.started.Load() {
		c.reshare()
	}
}
