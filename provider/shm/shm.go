// Package shm is the cross-process provider of goverbs, device "shm0":
// two processes on one host, with the data path entirely in user space.
//
// Remotely accessible memory lives in shared memory. Each AllocMR is its
// own memfd, sealed against resizing; its owner hands it to each peer of
// the PDs with regions in it that have remote rights, and to the peers of
// the QPs whose receive queue (own or SRQ) had a receive posted into it,
// when it becomes shareable (or when the
// connection is made), so that even a first access needs nothing from the
// target, and tells a PD's peers to unmap it once no region of that PD
// that they reach lies in it (a hostile process may keep its mapping,
// and its descriptor). The peer maps it
// read-only unless a region on it grants remote write or atomic access or
// the peer must place a Send in it, so that the MMU, not only a check in
// code, enforces the right. Regions without remote
// access are never handed to a peer, except that a receive buffer's
// memory is handed to the peers whose Sends may fill it. RegMR of a sub-range
// of AllocMR memory shares that memfd; RegMR of ordinary Go memory is
// reached by peers with process_vm_readv/writev (one copy, one system call
// per access) and does not support remote atomics.
//
// The data plane is rings in shared memory. The initiator does the "DMA"
// itself: an RDMA Read is one copy from the mapped remote region into the
// local buffer, a Write the reverse, an atomic a CPU atomic instruction on
// the shared word, a Send one copy into the buffer the receiver posted,
// whose completion the sender writes into the receiving QP's completion
// ring, naming the receive by its position (the receiver takes its WRID
// from its own record). The remote CPU does nothing for one-sided
// operations.
//
// # Small Sends
//
// A Send of at most 96 bytes, into a receive of at most two buffers,
// travels inside its completion instead, and the receiver's Poll copies
// it into the buffers of its own record of the receive: the receiver
// places it, as RDMA NICs carry small sends inline and scatter small
// messages into the completion entry. The receiver places it because
// that moves fewer cache lines between the two processors. The sender
// writes the completion, a line the receiver then reads, whatever the
// message: the message rides along. The receive buffer, which the
// receiving application reads and reposts message after message, stays
// in the receiver's cache; a sender placing the message takes the
// buffer's line to its own processor, and the receiver's next read
// takes it back. A completion slot is two cache lines: a 32-byte header
// and the first 32 bytes of the message in one, the rest of the message
// in the other. A Send of up to 32 bytes therefore moves one line fewer
// than when the sender places it; one of 33 to 96 bytes moves the
// slot's second line instead of the buffer's (or instead of two, when
// the buffer straddles lines). The bound is the slot: a larger one would
// make every completion ring larger, and the copy longer. Larger Sends,
// and Sends into receives of more buffers, are placed by the sender
// (zero copy).
//
// Placement by the receiver costs instructions, which show where no line
// moves: the receiver looks its buffer's key up and makes a second copy,
// about 180 more for a Send of 8 to 96 bytes, its Poll and the PostRecv
// after it (1,875 against 1,693 for 64 bytes; scripts/instructions.sh
// counts them with both endpoints in one process), and PostRecv records
// the receive's buffers, about 25 more for every Send. The sender still claims the receive and checks its buffers
// (keys, rights, room), so that a Send fails as it would if it placed
// the message. The receiver believes no length it reads from the slot
// beyond the slot and its own record: a longer claim completes the
// receive as a length error and cuts the peer off, with nothing
// written; a buffer deregistered since the receive was posted completes
// it as a protection error, and the QP moves to the error state (Dereg
// waits for the Polls under way).
//
// The lines a Send moves between the two processors go one way each: the
// receive entry, which the receiver wrote when it posted the receive,
// to the sender (two entries of one buffer share a line), and the
// completion slot's one or two lines to the receiver. None comes back
// for each message: the receiver frees completion slots by moving its
// head, on a line of its own that the sender reads only when its last
// reading leaves no room, and PostRecv learns its queue's room from the
// receives Poll has completed, not from the head the sender's Sends
// move.
//
// The control plane is a Unix socket per connection (cm addresses
// shm:///path/to.sock and shm://@abstract-name): it carries the
// connection handshake and the memfds (SCM_RIGHTS), the rare requests a
// requester makes (map a segment; the peer's QP must move to the error
// state), and it is how each side sees the other die.
//
// A blocking wait (CQ.Wait) first sleeps its thread on a futex in the
// CQ's shared header, for up to a millisecond; then it parks its
// goroutine, as a wait on the completion channel (ReqNotify and Notify)
// does, and the CQ's notification goroutine waits in Go's network poller
// for the CQ's notification socket, which each peer is handed a notifier
// of in the handshake: a waiting CQ holds no thread. A producer makes a
// wake-up system call only when the CQ is armed, and only the ones its
// waiters ask for.
//
// A signaled one-sided operation — its PostSend and the Poll that takes
// its completion — costs three locked instructions: the QP's spin lock,
// the reservation of a completion slot, the CQ's spin lock. Completion
// slots, receive entries and freed send slots are published with release
// stores, not fences, so a producer may check the CQ's arming before its
// slot is visible; ReqNotify, after it arms, looks for completions
// reserved but not yet taken and notifies for them itself.
//
// Nothing is left behind, however a process ends: memfds have no name in
// any file system and are freed with the last mapping, and an abstract
// address (shm://@name) disappears with its socket. A path address
// (shm:///path/to.sock) is a socket file: Close of the listener removes
// it, but a listener that dies without closing it (SIGKILL) leaves the
// file behind — the kernel does not remove it — and the next Listen on
// the path, finding nobody answering there, takes it over.
//
// A peer is not trusted. Every value read from memory a peer can write —
// ring indices and entries, CQ slots, the key table, the peer QP's state,
// rights and attributes — and every control message is checked before
// use, so that a peer writing garbage there can make this process's QPs
// fail but cannot make it panic, hang, or touch memory outside the peer's
// segments and its own registered regions. process_vm_readv/writev aim at
// the process the kernel reports at the other end of the socket
// (SO_PEERCRED), not one the peer names. Every memfd has mode 0600, so a
// process of another user cannot reopen a read-only descriptor writable
// through /proc/self/fd; a hostile process of the same user can, or can
// ptrace this process, so the read-only mappings guard against it only
// by convention.
//
// # Trust
//
// A listener accepts only processes of its own user unless its
// cm.ListenConfig names other users (TrustUIDs) or primary groups
// (TrustGIDs); the kernel's SO_PEERCRED says who dials, and an untrusted
// process, or a user in back-off, is rejected as soon as its connection
// is accepted: before its request is read, and without taking one of the
// listener's handshake slots. (Only the
// listener checks: a dialler trusts the address it dials.)
//
// Keys are made by internal/keytab (an Indexed table): 8 bits of slot, 24
// random bits, so a peer guessing a region's key must search 2^24 keys.
// The shared key table and the grant tables are indexed by the slot, which
// caps a context at 256 regions (MaxMR). Each QP hands its
// peer a grant table of its own, read-only: the keys of the regions of
// the QP's protection domain that peers may reach (remote rights, or a
// receive posted in them), written before the key is returned by
// registration or the receive is posted, and revoked by Dereg. The peer
// never maps a table naming a local-only region (other than its own
// QP's receive buffers), a region of another PD, or a key of another
// connection. A bound memory window is a grant too: its key, range and
// rights, written into the tables of its PD's QPs (type 1) or of its QP
// (type 2) and taken out when it is unbound (mw.go). After every write
// of a grant table the QP moves on its connection's grant epoch, a word
// in a page this context hands the peer process read-only, shared by all
// its connections to it (epoch.go): a requester checks that one word per
// WR, not the key's slot. A key the peer's
// table lacks is asked for over the control socket; a refused one counts against the peer's
// user in the listener's guard (peerguard, ListenConfig.Strikes and
// Backoff), which ends the connection and rejects that user's Dials for
// a back-off period that doubles.
//
// What a hostile peer of a trusted user can still do: the unit of
// isolation is the segment (one AllocMR) and the PD, not the region or
// the key. A peer maps every segment holding a region of its QP's PD it
// may reach, and can read (and, where any region on it grants remote
// write or atomics or holds a posted receive, write) all of that segment
// directly, with no key at all; regions of one PD registered inside one
// AllocMR share that fate. Receive buffers are handed only to the peers
// of the receive queue they were posted to, so buffers of different
// peers share a writable mapping only if the application posts them into
// one AllocMR (or to one SRQ, whose buffers serve every peer of it). A
// peer of the same user can moreover ptrace this process or write it
// with process_vm_writev, which no provider can prevent; trust other
// users (TrustUIDs) to keep that out. What it cannot do: reach a segment
// with no region of its PD that peers may reach, learn the keys of other
// PDs or of local-only regions, or make this process panic, hang or
// touch memory outside the segments it was given.
package shm

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/goverbs/goverbs/internal/grant"
	"github.com/goverbs/goverbs/internal/keytab"
	"github.com/goverbs/goverbs/internal/soft"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/driver"
)

// DeviceName is the name of the shm device.
const DeviceName = "shm0"

// maxSGE bounds scatter/gather lists.
const maxSGE = 16

// maxKeys is the capacity of a context's key table.
const maxKeys = keytab.Size

func init() {
	verbs.Register("shm", &provider{})
}

var deviceAttr = soft.DeviceAttr(DeviceName, "shm", soft.Limits{MaxMRSize: 1 << 36, MaxSGE: maxSGE,
	MaxQP: 1 << 12, MaxCQ: 1 << 12, MaxMR: maxKeys, MaxPD: 1 << 12, MaxSRQ: 1 << 10, MaxPrivateData: 256,
	Caps: driver.CapRNRRetry | driver.CapCrossProcess})

type provider struct{}

func (*provider) Devices() []driver.DeviceInfo {
	return []driver.DeviceInfo{{Name: DeviceName, Provider: "shm", Transport: "shm", GUID: 0x676f766572620002}}
}

func (*provider) Open(name string) (driver.Context, error) {
	return soft.Open(name, DeviceName, openDevice)
}

// openDevice opens a shm device context.
func openDevice() (driver.Context, error) {
	keys, err := newSegment("keys", maxKeys*keySlotSize)
	if err != nil {
		return nil, err
	}
	c := &devCtx{
		EventQueue: soft.NewEventQueue(),
		keySeg:     keys,
		keys:       viewKeyTable(keys.mem, maxKeys, 0),
		mrs:        keytab.Table[grant.Entry[*mr]]{Indexed: true},
		segs:       map[uint32]*segInfo{},
		pid:        os.Getpid(),
	}
	return c, nil
}

// devCtx is an open shm device.
type devCtx struct {
	pid             int
	soft.EventQueue // Events, and Event to deliver one

	// epochs: the pages of grant epoch words handed to peer processes
	// (epoch.go).
	epochs epochPages

	mu     sync.RWMutex // guards what follows; readers: key lookups on the data path
	keySeg *segment
	keys   *keyTable                      // every region, as serveKey grants it to peers; this process's alone
	mrs    keytab.Table[grant.Entry[*mr]] // regions and windows; written under mu, read without it
	pds    int
	nextPD uint32
	cqs    map[*cq]bool
	qps    map[*qp]bool
	srqs   map[*srq]bool
	closed bool

	// segMu guards the AllocMR segments, which peers ask for by id; it is
	// taken alone, or after mu.
	segMu   sync.Mutex
	segs    map[uint32]*segInfo
	nextSeg uint32

	// connMu guards the live connections, to which segments are pushed
	// as they become shareable; taken alone, or after segMu.
	connMu sync.Mutex
	conns  map[*conn]bool
}

func (c *devCtx) remember(cn *conn) {
	c.connMu.Lock()
	if c.conns == nil {
		c.conns = map[*conn]bool{}
	}
	c.conns[cn] = true
	c.connMu.Unlock()
}

func (c *devCtx) forget(cn *conn) {
	c.connMu.Lock()
	delete(c.conns, cn)
	c.connMu.Unlock()
}

// publishSegment pushes segment id to every connected peer of a PD with a
// region in it (of only, if not nil), once it may be shared (or shared
// writable). segMu is held.
func (c *devCtx) publishSegment(id uint32, si *segInfo, only *pd) {
	c.connMu.Lock()
	defer c.connMu.Unlock()
	for cn := range c.conns {
		if ok, _ := si.shareable(cn.q, false); ok && si.inPD(cn.q.pd) && (only == nil || cn.q.pd == only) {
			cn.pushSegmentLocked(id, si, false)
		}
	}
}

// announceSegment publishes segment id after a region of p came to be
// reached in it: to the peers of every PD with such a region if the
// segment's rights widened, else, if that region is p's first there, to
// p's peers alone. segMu is held.
func (c *devCtx) announceSegment(id uint32, si *segInfo, widened, firstOfPD bool, p *pd) {
	switch {
	case widened:
		c.publishSegment(id, si, nil)
	case firstOfPD:
		c.publishSegment(id, si, p)
	}
}

// withdrawSegment tells the peers of only's QPs (every peer, if only is
// nil) that segment id is gone for them: freed, or holding no region of
// only that they reach any more. segMu is held.
func (c *devCtx) withdrawSegment(id uint32, only *pd) {
	c.connMu.Lock()
	defer c.connMu.Unlock()
	for cn := range c.conns {
		if only == nil || cn.q.pd == only {
			cn.sendCtrl(msgSegGone, id, 0)
		}
	}
}

// segInfo is an AllocMR segment with what decides whether, and how, a
// peer may map it: the union of the remote rights of the regions
// registered on it, and the receive queues (a QP's, or an SRQ's) that had
// receives posted into it (their peers' Sends must then write it).
type segInfo struct {
	seg    *segment
	access driver.AccessFlags // guarded by devCtx.segMu
	refs   int                // regions registered in it; guarded by devCtx.segMu
	pds    map[*pd]int        // of those, per PD, the ones peers reach (see count); guarded by devCtx.segMu
	recvBy map[*recvSet]bool  // guarded by devCtx.segMu
}

// recvSet records the regions a receive queue (a QP's own, or an SRQ)
// had receives posted into: by key slot, the region's key. Only the peers
// of the QPs drawing from that queue may write those regions' segments
// for a Send; the peers of other QPs are not handed them on that account,
// so that receive buffers of different peers never share a writable
// mapping unless the application posts them into one segment.
type recvSet [maxKeys]atomic.Uint32

// has reports whether a receive was posted into the region of key.
func (rs *recvSet) has(key uint32) bool { return rs[keytab.Index(key)].Load() == key }

// recvFor reports whether q's receive queue had receives posted into the
// segment. devCtx.segMu is held.
func (si *segInfo) recvFor(q *qp) bool { return si.recvBy[q.recvSet()] }

// inPD reports whether a region of p that peers reach lies in the
// segment: only the peers of p's QPs, whose keys must name regions of p,
// are ever handed it, and only for such a region. devCtx.segMu is held.
func (si *segInfo) inPD(p *pd) bool { return si != nil && si.pds[p] > 0 }

// count adds m, which peers have come to reach (it has remote rights, or
// a receive was posted into it), to its PD's count in the segment, once,
// and reports whether it is the PD's first. devCtx.segMu is held.
func (si *segInfo) count(m *mr) bool {
	if m.counted {
		return false
	}
	m.counted = true
	if si.pds == nil {
		si.pds = map[*pd]int{}
	}
	si.pds[m.pd]++
	return si.pds[m.pd] == 1
}

// uncount takes m out of its PD's count at its Dereg, and reports whether
// it was the PD's last. devCtx.segMu is held.
func (si *segInfo) uncount(m *mr) bool {
	if !m.counted {
		return false
	}
	m.counted = false
	if si.pds[m.pd]--; si.pds[m.pd] > 0 {
		return false
	}
	delete(si.pds, m.pd)
	return true
}

// shareable says whether the peer of q may map the segment, and whether
// writable: only segments with remote rights that q grants too
// (peerRights) or receive buffers of q's receive queue are ever handed
// out, and writable only for remote write, atomics or those receives.
// devCtx.segMu is held.
func (si *segInfo) shareable(q *qp, write bool) (ok, writable bool) {
	recv := si.recvFor(q)
	if write {
		w := recv || q.peerRights(si.access)&(driver.AccessRemoteWrite|driver.AccessRemoteAtomic) != 0
		return w, w
	}
	return recv || q.peerRights(si.access) != 0, false
}

func (c *devCtx) QueryDevice() driver.DeviceAttr { return deviceAttr }

func (c *devCtx) AllocPD() (driver.PD, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	life, err := soft.NewPD(c.closed, &c.pds, deviceAttr.MaxPD, &c.mu)
	if err != nil {
		return nil, err
	}
	c.nextPD++
	return &pd{PD: life, ctx: c, id: c.nextPD}, nil
}

// Close destroys every QP, CQ and SRQ, deregisters every region and
// releases the shared memory.
func (c *devCtx) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	qps := slices.Collect(maps.Keys(c.qps))
	cqs := slices.Collect(maps.Keys(c.cqs))
	srqs := slices.Collect(maps.Keys(c.srqs))
	c.mu.Unlock()
	for _, q := range qps {
		q.Destroy()
	}
	for _, s := range srqs {
		s.Destroy()
	}
	for _, q := range cqs {
		q.Destroy()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mrs.Range(func(key uint32, e grant.Entry[*mr]) bool {
		if e.MR != nil {
			e.MR.ext.Revoke()
		}
		c.keys.revoke(keytab.Index(key))
		c.mrs.Remove(key)
		return true
	})
	c.segMu.Lock()
	for id, s := range c.segs {
		s.seg.close()
		delete(c.segs, id)
	}
	c.segMu.Unlock()
	c.keySeg.close()
	return nil
}

type pd struct {
	soft.PD // Dealloc; guarded by the context's lock
	ctx     *devCtx
	id      uint32
}

// mr is a registered region; its key is both lkey and rkey, made by the
// context's key table (internal/keytab): a slot index and 24 random bits.
type mr struct {
	ctx    *devCtx
	pd     *pd
	key    uint32
	buf    []byte
	addr   uint64
	access driver.AccessFlags
	segID  uint32   // the segment the region lies in (with si)
	si     *segInfo // the segment the region lies in, or nil (process memory)
	// recvPosted: a receive was posted into the region, which a peer's
	// Send may then write (Dereg has such a region's peers confirm).
	recvPosted atomic.Bool
	// counted: m is in its segment's pds (it has remote rights, a
	// receive was posted into it, or a window was bound to it); guarded
	// by devCtx.segMu.
	counted bool
	// ext is the region to the key check, revoked at Dereg.
	ext grant.Extent
	// windowed: a window was bound to the region, which peers may then
	// reach through it (Dereg has its peers confirm).
	windowed atomic.Bool
}

// Extent implements grant.Region.
func (m *mr) Extent() *grant.Extent { return &m.ext }

func (p *pd) AllocMR(size int, access driver.AccessFlags) (driver.MR, error) {
	seg, err := newSegment("mr", size)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", driver.ErrNoResources, err)
	}
	p.ctx.mu.Lock()
	defer p.ctx.mu.Unlock()
	if p.ctx.closed || p.Released() {
		seg.close()
		return nil, driver.ErrClosed
	}
	p.ctx.segMu.Lock()
	p.ctx.nextSeg++
	id := p.ctx.nextSeg
	p.ctx.segs[id] = &segInfo{seg: seg}
	p.ctx.segMu.Unlock()
	m, err := p.registerLocked(seg.mem[:size], access, kindSegment, id, 0)
	if err != nil {
		p.ctx.segMu.Lock()
		delete(p.ctx.segs, id)
		p.ctx.segMu.Unlock()
		seg.close()
		return nil, err
	}
	return m, nil
}

func (p *pd) RegMR(buf []byte, access driver.AccessFlags) (driver.MR, error) {
	p.ctx.mu.Lock()
	defer p.ctx.mu.Unlock()
	if p.ctx.closed || p.Released() {
		return nil, driver.ErrClosed
	}
	start := uint64(uintptr(unsafe.Pointer(&buf[0])))
	p.ctx.segMu.Lock()
	for id, s := range p.ctx.segs {
		base := uint64(uintptr(unsafe.Pointer(&s.seg.mem[0])))
		if start >= base && start-base+uint64(len(buf)) <= uint64(len(s.seg.mem)) {
			p.ctx.segMu.Unlock()
			return p.registerLocked(buf, access, kindSegment, id, start-base)
		}
	}
	p.ctx.segMu.Unlock()
	if access&driver.AccessRemoteAtomic != 0 {
		return nil, fmt.Errorf("%w: remote atomics need shared memory: register memory from AllocMR", driver.ErrUnsupported)
	}
	return p.registerLocked(buf, access, kindProcess, 0, 0)
}

func (p *pd) registerLocked(buf []byte, access driver.AccessFlags, kind, segID uint32, segOff uint64) (*mr, error) {
	c := p.ctx
	var m *mr
	_, err := c.mrs.Insert(func(key uint32) grant.Entry[*mr] {
		addr := uint64(uintptr(unsafe.Pointer(&buf[0])))
		m = &mr{ctx: c, pd: p, key: key, buf: buf, addr: addr, access: access,
			ext: grant.Extent{Addr: addr, Len: uint64(len(buf)), Access: access, PD: p}}
		return grant.RegionEntry(m)
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", driver.ErrNoResources, err)
	}
	if kind == kindSegment {
		c.segMu.Lock()
		if si := c.segs[segID]; si != nil {
			before := si.access
			si.access |= access & driver.RemoteAccess
			si.refs++
			m.si, m.segID = si, segID
			first := access&driver.RemoteAccess != 0 && si.count(m)
			c.announceSegment(segID, si, si.access != before, first, p)
		}
		c.segMu.Unlock()
	}
	c.keys.publish(keytab.Index(m.key), keyInfo{key: m.key, access: access, kind: kind, segID: segID, segOff: segOff, addr: m.addr, length: uint64(len(buf)), pd: p.id})
	if access&driver.RemoteAccess != 0 {
		c.grantAll(m)
	}
	return m, nil
}

// reaches reports whether q's peer may reach m: it is a region of q's PD
// with remote rights that q grants too (peerRights), or one a receive of
// q's receive queue was posted in.
func (q *qp) reaches(m *mr) bool {
	return m.pd == q.pd && (q.peerRights(m.access) != 0 || q.recvSet().has(m.key))
}

// recvSet is the set of q's receive queue: its SRQ's, or its own.
func (q *qp) recvSet() *recvSet {
	if q.srq != nil {
		return &q.srq.recvExposed
	}
	return &q.recvExposed
}

// forgetRecvs takes a destroyed receive queue's set out of every segment.
func (c *devCtx) forgetRecvs(rs *recvSet) {
	c.segMu.Lock()
	defer c.segMu.Unlock()
	for _, si := range c.segs {
		delete(si.recvBy, rs)
	}
}

// grantAll writes m's key, a region with remote rights, into the grant
// table of every QP of its PD whose access flags grant one of them, so that the peers' first access needs
// nothing from this process. devCtx.mu is held (for reading, at least).
func (c *devCtx) grantAll(m *mr) {
	for q := range c.qps {
		if q.reaches(m) {
			q.grantMu.Lock()
			q.grantLocked(m.key)
			q.grantMu.Unlock()
		}
	}
}

// grantLocked copies key's slot of the context's table into the QP's
// grant table, with only the remote rights the QP grants too; false if
// the key is not registered. q.grantMu is held.
func (q *qp) grantLocked(key uint32) bool {
	k, ok := q.ctx.keys.lookup(key)
	if ok {
		k.access = k.access&^driver.RemoteAccess | q.peerRights(k.access)
		q.grants.publish(keytab.Index(key), k)
	}
	return ok
}

func (m *mr) LKey() uint32               { return m.key }
func (m *mr) RKey() uint32               { return m.key }
func (m *mr) Addr() uint64               { return m.addr }
func (m *mr) Bytes() []byte              { return m.buf }
func (m *mr) Access() driver.AccessFlags { return m.access }

// Dereg revokes the key in the shared table first, so that peers stop
// using it, then, for a region peers can reach (remote rights, or a
// receive posted into it), has every peer of its PD confirm that no WR of
// its still uses the key (revokePeer: a WR checks the key once, before
// its copy, and a peer answers between two WRs), then releases the region's segment if no other region lies in it. A
// peer that does not confirm within revokeTimeout is taken for dead and
// its connection ended; one that is stopped (SIGSTOP) in the middle of a
// copy into the region finishes that copy when it resumes. A peer that
// mapped the segment keeps its mapping until it next looks the key up;
// the memory it maps is no longer this process's.
//
// Local lookups of keys take no lock (the data path): before it unmaps a
// segment, Dereg waits until every QP of the context has passed a point
// where it holds no reference from before the key was revoked — each QP
// executes under its lock, so taking and releasing every QP's lock once
// is that grace period.
func (m *mr) Dereg() error {
	c := m.ctx
	c.mu.Lock()
	if c.lookupMR(m.key) != m {
		c.mu.Unlock()
		return driver.ErrClosed
	}
	m.ext.Revoke()
	c.keys.revoke(keytab.Index(m.key))
	c.mrs.Remove(m.key)
	for q := range c.qps {
		q.revokeGrant(m.key)
	}
	c.ungrantWindowsOf(m)
	var dead *segment
	if si := m.si; si != nil {
		// The segment lives while any region lies in it: AllocMR memory
		// stays mapped for the regions registered inside it.
		c.segMu.Lock()
		if si.refs--; si.refs == 0 {
			delete(c.segs, m.segID)
			c.withdrawSegment(m.segID, nil)
			dead = si.seg
		} else if si.uncount(m) {
			// The last region of m's PD in it that peers reach: its
			// peers are told to unmap it.
			c.withdrawSegment(m.segID, m.pd)
		}
		c.segMu.Unlock()
	}
	qps := slices.Collect(maps.Keys(c.qps))
	var cqs []*cq
	if m.recvPosted.Load() {
		cqs = slices.Collect(maps.Keys(c.cqs))
	}
	c.mu.Unlock()
	// The peers' requesters write and read the region directly, and check
	// its key once per WR: each peer confirms that no WR of its still
	// uses the key (a WR that checked it before the revocation may be
	// copying now, up to a whole message), so that nothing touches the
	// memory once Dereg returns.
	// Only peers of the region's PD can reach it, and only a region with
	// remote rights, one a receive was posted into, or one a window was
	// bound to.
	var conns []*conn
	if m.access&driver.RemoteAccess != 0 || m.recvPosted.Load() || m.windowed.Load() {
		c.connMu.Lock()
		for cn := range c.conns {
			if cn.q.pd == m.pd {
				conns = append(conns, cn)
			}
		}
		c.connMu.Unlock()
	}
	for _, cn := range conns {
		cn.revokePeer()
	}
	// A Send carried in its completion is placed into a receive's
	// buffer by this process's Poll, under its CQ's lock, which looked
	// the key up before the revocation perhaps: taking and releasing
	// every CQ's lock once lets such a copy end before Dereg returns.
	for _, cq := range cqs {
		cq.mu.Lock()
		cq.mu.Unlock()
	}
	if dead != nil {
		for _, q := range qps {
			q.mu.Lock()
			q.mu.Unlock()
		}
		dead.close()
	}
	return nil
}

// exposeForRecv marks the segments of a receive's buffers, posted to the
// receive queue whose set is rs, as shareable with the peers whose Sends
// fill that queue, and grants them the buffers' keys.
func (c *devCtx) exposeForRecv(sg []driver.SGE, rs *recvSet) {
	for i := range sg {
		if rs.has(sg[i].LKey) {
			continue // the region's first receive on this queue has been seen to
		}
		m := c.lookupMR(sg[i].LKey)
		if m == nil {
			continue
		}
		m.recvPosted.Store(true)
		// Before the receive is published: the peer whose Send fills it
		// finds its key granted.
		c.mu.RLock()
		if c.lookupMR(m.key) == m {
			rs[keytab.Index(m.key)].Store(m.key)
			for q := range c.qps {
				if q.pd == m.pd && q.recvSet() == rs {
					q.grantMu.Lock()
					q.grantLocked(m.key)
					q.grantMu.Unlock()
				}
			}
		}
		c.mu.RUnlock()
		if m.si == nil {
			continue
		}
		c.segMu.Lock()
		// The segment is published only while it lives: a Dereg since
		// the lookup may have dropped it, and then closes its
		// descriptor, whose number another file may take. Nor is a
		// region counted that its Dereg has taken out of the table
		// (before it takes segMu), which would not uncount it.
		if c.segs[m.segID] == m.si && c.lookupMR(m.key) == m {
			newPD := m.si.count(m)
			first := !m.si.recvBy[rs]
			if first {
				if m.si.recvBy == nil {
					m.si.recvBy = map[*recvSet]bool{}
				}
				m.si.recvBy[rs] = true
			}
			c.announceSegment(m.segID, m.si, first, newPD, m.pd) // the queue's first receive: now writable for its peers
		}
		c.segMu.Unlock()
	}
}

// span returns the local bytes [addr, addr+n) of the region of key, if it
// belongs to p, grants need and contains the range. It takes no lock:
// callers hold their QP's lock, which Dereg waits for before it unmaps.
func (c *devCtx) span(key uint32, p *pd, addr, n uint64, need driver.AccessFlags) ([]byte, bool) {
	e, _ := c.mrs.Lookup(key)
	m := e.MR // a window's key names no local memory
	if m == nil || m.pd != p || m.access&need != need {
		return nil, false
	}
	return soft.Within(m.buf, m.addr, addr, n)
}

// lookupMR returns the region of key, or nil. It takes no lock.
func (c *devCtx) lookupMR(key uint32) *mr {
	e, _ := c.mrs.Lookup(key)
	return e.MR
}

// revokeGrant takes key out of the QP's grant table, if its peer was
// granted it. devCtx.mu is held.
func (q *qp) revokeGrant(key uint32) {
	q.grantMu.Lock()
	defer q.grantMu.Unlock()
	idx := keytab.Index(key)
	if q.grants.slot(idx).key.Load() == key {
		q.grants.revoke(idx)
	}
}
