// Package iwarp is goverbs' software iWARP provider, device "tcp0": RDMA
// over TCP on the standard wire, like Linux siw, so that a host running
// siw is a peer and Wireshark's iwarp_mpa and iwarp_ddp_rdmap dissectors
// decode its traffic. Import it for its side effect and connect QPs with
// cm at tcp://host:port:
//
//	import _ "github.com/goverbs/goverbs/provider/iwarp"
//
// The wire (package wire): one TCP connection per QP; MPA framing (RFC
// 5044) with the enhanced connection setup of RFC 6581 (IRD and ORD
// negotiation, peer-to-peer mode with a zero-length RDMA Write as the
// ready-to-receive message); CRC32c as MPA negotiates it (either side may
// ask for it; SetCRC chooses what this side asks); markers refused; DDP
// tagged and untagged buffers (RFC 5041); RDMAP Send, Send with Solicited
// Event, Send with Invalidate, RDMA Write, Read Request and Response,
// Terminate (RFC 5040); and the RFC 7306 atomics and immediate data when
// both ends negotiated them.
//
// RFC 7306 negotiation: siw knows nothing of RFC 7306, so the offer must
// cost it nothing. The initiator sets reserved MPA flag bit 0x01 in its
// Request; a goverbs responder answers with bit 0x02 in its Reply and an
// 8-byte block ("GVx1" and its QP number) after the RFC 6581 block, and
// the initiator's RTR Write then carries the initiator's QP number in
// its Tagged Offset. RFC 5044 tells receivers to ignore reserved bits,
// and siw does (it echoes the Request's bits in its Reply, so it never
// answers 0x02); neither side's application sees any of this in its
// private data. Without the extension, PostSend refuses OpSendWithImm,
// OpRDMAWriteWithImm and the atomics with ErrUnsupported, and receive
// completions report source QP 0. Immediate data goes in an Immediate
// Data message (opcode 8, or 9 with solicited event) whose first four
// bytes are the verbs immediate: after an RDMA Write it consumes a
// receive and completes it with the Write's length; before a Send (flag
// 1 in its last four bytes) it consumes nothing and lends its immediate
// to that Send's receive completion.
//
// Semantics and what differs from InfiniBand, as the device attributes
// declare: there is no RNR retry (no CapRNRRetry): a Send that finds no
// posted receive ends the stream with a Terminate, and both QPs move to
// the error state; its sender completes it with WCRNRRetryExcErr. A Send
// or RDMA Write completes only once the responder has placed it, which
// the requester learns from a later Read Response: when a Send or Write
// is not followed by a Read or atomic of its own, the requester adds a
// zero-length RDMA Read (legal on every iWARP peer) and completes the
// Send or Write when its response arrives — at once for a signaled WR;
// for unsignaled ones within a millisecond while the application polls
// (10 ms when it does not), and a later request usually covers them
// first. That is how a remote error (a bad STag, a receive too small)
// reaches the WR that caused it.
//
// Linux siw (6.1) departs from the RFCs in a few ways a peer meets, and
// tcp0 takes what it sends as long as the peer is not goverbs (no RFC
// 7306 block in its MPA frame) or the departure cannot be mistaken:
//
//   - The answer to a zero-length Read may carry data: siw answers one
//     that waited behind another of its messages with that message's
//     buffer, in as many segments as it takes. From a peer other than
//     goverbs tcp0 drops such an answer if it is one message in order
//     from the Read's sink, up to 4 GiB (oversizedAnswerMax); any other
//     Read Response must be exactly as long as its Read (RFC 5040).
//   - When that message was sent inline, siw fails its own connection
//     instead, with a Terminate that names a Read Request under a wrong
//     MSN. A Terminate that names a Read Request no WR matches concerns
//     the oldest Read not yet answered; the Sends and Writes before it
//     were placed and complete as successes, and the QP fails.
//   - siw lays out a Terminate's control word with the Layer and Error
//     Type swapped and the M, D and R flags in reserved bits; such a word
//     from a peer other than goverbs is read as siw means it
//     (siwTerminate).
//   - RFC 5044 lets the responder send only once the initiator's first
//     FPDU has arrived, and RFC 6581's peer-to-peer mode exists so that
//     the initiator sends one (its RTR). siw's initiator never asks for
//     that mode and sends nothing until its application does, so a
//     server whose protocol speaks first (librdmacm's cmatose) could
//     never speak to it: when the initiator does not ask for
//     peer-to-peer mode, a tcp0 responder sends 100 ms after its MPA
//     Reply (speakFirstDelay) if nothing came before, as siw's responder
//     sends at once. It waits so that the initiator has read the Reply:
//     siw's initiator fails the connection when FPDU bytes already
//     follow the Reply in its socket.
//   - siw's responder sends its MPA Reply before it hooks its socket,
//     so an RTR that arrives in between stays unread and siw never
//     completes the connection (its application never sees it
//     established; closing such connections has hit a BUG in Linux's
//     iWARP connection manager). A tcp0 initiator in peer-to-peer mode
//     with a peer other than goverbs sends zero-length RDMA Writes, a
//     few times over about a second, until something comes from the
//     peer (kickCheck), which makes siw read what it left.
//   - siw drops the Read Responses it owes when its application
//     disconnects, so a peer that disconnects as soon as it has received
//     a Send (librdmacm's cmatose server, rdma_client) leaves the Read
//     that confirms it unanswered. When a peer other than goverbs ends
//     the stream in order (a FIN between FPDUs, no Terminate) and its TCP
//     has acknowledged every byte sent, the Sends and Writes sent are
//     taken for placed (siw places what arrives as it arrives, and sends
//     a Terminate for what it cannot place) and complete as successes
//     rather than WCWRFlushErr (creditOrderlyEnd).
//
// What tcp0 cannot mend: a siw connection that meets the inline case
// above ends, though no WR of the application failed; siw's initiator
// that is slower than speakFirstDelay to read the Reply fails its
// connection.
// interop/siw.sh runs rping, ucmatose (against examples/cmatose) and
// rdma_server/rdma_client against siw in a VM, both ways.
//
// Timeouts: the QP's Timeout and RetryCnt (cm sets 14 and 7) become the
// socket's TCP_USER_TIMEOUT, 4.096 µs × 2^Timeout × (RetryCnt+1) but at
// least 4 s, since TCP's own retransmissions over a lossy path take that
// long; Timeout 0 never times out. Data the peer leaves unacknowledged
// that long, a window it keeps closed, or a request (a Read, an atomic,
// or the Read that confirms Sends and Writes) it leaves unanswered, once
// the socket holds no bytes either way, while nothing at all comes from
// it for that long (a peer whose process is stopped still has its TCP
// acknowledge and answer probes; a slow path only delays) or while no
// answer to any request comes for four times that and more than 32 MiB
// of other traffic does (a peer that keeps sending but answers nothing;
// one that sends less, slowly, looks like a slow path, and only delays)
// ends the connection: the WR it held up completes with WCRetryExcErr,
// the rest are flushed.
//
// Dereg: nothing is placed into a region once its Dereg has returned,
// and nothing of it is sent: a Read Response from it still queued, or
// part sent, ends the stream with a Terminate (invalid STag) that names
// the Read Request, so that the peer fails that Read, and the QP fails;
// bytes of it already in a writev are waited for, up to 2 s for a peer
// that reads nothing, after which the connection is dropped.
//
// Copies: the receiver reads what has arrived, up to 512 bytes, into a
// stage, and copies the payload it holds once into the registered memory
// it targets (the receive buffer of a Send, the region of a Write or Read
// Response) after checking STag, bounds and rights; payload past the
// stage is read from the socket straight into that memory. A small
// message thus costs one read system call and one copy (as many copies
// as peeking at its headers and reading it into place would), and a
// large one is placed straight from the socket but for its first few
// hundred bytes. Headers and registered memory go out together with one
// writev, straight from the registered memory — except a payload of up to
// 256 bytes, which is copied behind its headers so that a small message
// is one buffer and one write(2) (inline data, see inlineMax), and a Read
// Response under MPA CRC, whose payload is copied first so that the CRC
// covers what is sent even while the memory's owner writes it. The data
// path allocates nothing.
//
// Progress: an application polling a CQ drives the connections of its
// QPs (it reads, places and answers what has arrived), with no goroutine
// switch on the way; each connection's receive goroutine does the same
// for an application that sleeps on a CQ or is busy elsewhere. A poll
// that finds the CQ empty makes one read system call per connection of
// its QPs, or, of a CQ of more than four, one epoll_pwait that names the
// connections that have something, and reads those (ready.go); such a
// CQ, when it is the receive CQ of its QPs, also has a goroutine of its
// own that reads them so while no application polls, in place of their
// receive goroutines' waking one by one. While an application polls, the
// receive goroutine leaves the socket to it, and takes it back (or the
// CQ's receiver takes over) a millisecond or so after the polls stop (pollGrace, by design at most a
// quarter more, and later by as much as the runtime's timer is late on a
// busy machine):
// an application that polls and then waits on memory for a peer's RDMA
// Write (perftest's write_lat) should go on polling as it waits — Poll
// of an empty slice takes no completion and still drives the
// connections — or the Write may wait that millisecond to land, and its
// writer as long for the completion, which tcp0 gives once the peer has
// confirmed the Write.
//
// Coalescing: a Send or RDMA Write of up to 4 KiB posted alone to a
// QP whose send queue holds 16 or more WRs (posted and not yet
// retired by a poll of their completions: a stream), while the
// application polls the QP's CQs (within the last millisecond) and
// posts within 20 µs of its previous post, is left in the queue, and
// goes out with the post that makes 16 of them, at the next Poll of
// either of the QP's CQs, when the application arms one to sleep
// (ReqNotify, CQ.Wait), when the connection closes, or else when a
// timer fires (20 µs, later in an idle process, as the runtime's
// timers are), several to a writev: a system call costs more than
// building many small WRs' frames. A larger WR, one posted to a
// shallower queue, by an application that does not poll or posts now
// and then, or while one of the QP's CQs is armed (a goroutine may
// sleep on it), and every Read and atomic, goes out at once.
//
// Once a connection is up its socket is out of the Go runtime's poller,
// which wakes a thread at every segment that arrives on a socket it
// watches: two epoll instances of the connection's own watch it for
// input and for room, armed only when the receive goroutine or the
// transmitter is about to wait, so that while an application polls, the
// segments that arrive wake no thread.
//
// Trust: every tagged access is checked against the STag's region (PD,
// bounds, rights of the region and of the QP) before a byte moves; STags
// come from internal/keytab (32 random bits per registration), so a
// guess hits a given region with probability 2^-32, and one of N
// registered regions with N/2^32. A failed
// check ends the connection with a Terminate and counts against the
// peer's IP address in the guard of the listener that accepted it, which
// refuses that address for a back-off period once it has failed
// cm.ListenConfig.Strikes times (defaults: 4 strikes, 1 s doubling up to
// 1 h). Dialled connections are not guarded. The traffic itself is plain
// TCP: anyone on the path reads the data and the STags.
//
// Source map, by role (as Linux siw and rxe split theirs): iwarp.go,
// qp.go, srq.go, cq.go and cm.go are the device, its verbs objects and
// connection setup; conn.go is a connection's state and end, sock.go its
// socket, startup.go the RTR and the gate. Receiving: rxloop.go (who
// receives, and when), rxframe.go (reading FPDUs off the stream, their
// CRC, and the dispatch by opcode), placement.go (payload into memory),
// responder.go (the peer's requests, and the responses owed),
// completer.go (the answers to this side's requests, and the peer's
// Terminate), terminate.go (the errors that end a stream). Transmitting:
// requester.go (send WRs into frames), confirm.go (the zero-length Reads
// that confirm Sends and Writes), transmit.go (the transmitter) and
// batch.go (one writev). revoke.go keeps a deregistered region's bytes
// from going out; liveness.go ends a connection whose peer stops
// answering. Package wire holds the wire formats and the opcode table
// that rxframe.go dispatches by.
package iwarp

import (
	"fmt"
	"maps"
	"runtime"
	"slices"
	"sync"
	"unsafe"

	"github.com/goverbs/goverbs/internal/grant"
	"github.com/goverbs/goverbs/internal/keytab"
	"github.com/goverbs/goverbs/internal/soft"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/driver"
)

// DeviceName is the name of the iWARP device.
const DeviceName = "tcp0"

// maxSGE bounds scatter/gather lists.
const maxSGE = 16

// maxRdAtomic is the most Reads and atomics a QP has outstanding as a
// requester (ORD) or serves at once as a responder (IRD).
const maxRdAtomic = soft.MaxRdAtomic

// maxPrivateData is the private data cm carries: what Linux takes in an
// MPA frame (256 bytes) less the RFC 6581 block and goverbs' extension
// block.
const maxPrivateData = 244

var deviceAttr = soft.DeviceAttr(DeviceName, "iwarp", soft.Limits{MaxMRSize: 1 << 36, MaxSGE: maxSGE,
	MaxQP: 1 << 14, MaxCQ: 1 << 14, MaxMR: keytab.MaxLen, MaxPD: 1 << 14, MaxSRQ: 1 << 12, MaxPrivateData: maxPrivateData,
	Caps: driver.CapCrossProcess | driver.CapTransportRetry})

func init() {
	verbs.Register("iwarp", &provider{})
}

type provider struct{}

func (*provider) Devices() []driver.DeviceInfo {
	return []driver.DeviceInfo{{Name: DeviceName, Provider: "iwarp", Transport: "iwarp", GUID: 0x676f766572620003}}
}

func (*provider) Open(name string) (driver.Context, error) {
	return soft.Open(name, DeviceName, func() (driver.Context, error) {
		return &devCtx{EventQueue: soft.NewEventQueue(),
			qps: map[*qp]bool{}, cqs: map[*cq]bool{}, srqs: map[*srq]bool{}}, nil
	})
}

// devCtx is an open iWARP device.
type devCtx struct {
	soft.EventQueue // Events, and Event to deliver one

	mu     sync.RWMutex                   // guards what follows; readers: STag lookups on the data path
	mrs    keytab.Table[grant.Entry[*mr]] // regions and windows; written under mu
	pds    int
	qps    map[*qp]bool
	cqs    map[*cq]bool
	srqs   map[*srq]bool
	closed bool
}

func (c *devCtx) QueryDevice() driver.DeviceAttr { return deviceAttr }

func (c *devCtx) AllocPD() (driver.PD, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	life, err := soft.NewPD(c.closed, &c.pds, deviceAttr.MaxPD, &c.mu)
	if err != nil {
		return nil, err
	}
	return &pd{PD: life, ctx: c}, nil
}

// Close destroys every QP (breaking its connection), SRQ and CQ and
// invalidates every STag.
func (c *devCtx) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	qps := slices.Collect(maps.Keys(c.qps))
	c.mu.Unlock()
	for _, q := range qps {
		q.Destroy()
	}
	c.mu.Lock()
	var cqs []*cq
	defer func() {
		c.mu.Unlock()
		// Their receivers stop without the lock, which their rounds may
		// need.
		for _, q := range cqs {
			q.waitReceiver()
		}
	}()
	for s := range c.srqs {
		s.destroyLocked()
	}
	for q := range c.cqs {
		q.destroyLocked()
		cqs = append(cqs, q)
	}
	c.mrs.Range(func(stag uint32, e grant.Entry[*mr]) bool {
		if e.MR != nil {
			e.MR.revokeLocked()
		}
		c.mrs.Remove(stag)
		return true
	})
	return nil
}

type pd struct {
	soft.PD // Dealloc; guarded by the context's lock
	ctx     *devCtx
}

// mr is a registered region. Its STag serves as lkey and rkey; the
// context's key table (internal/keytab) makes it: 32 random bits, so that
// stale and guessed STags miss. (RFC 5040 leaves the STag's layout to its
// owner; peers treat it as opaque.)
type mr struct {
	ctx    *devCtx
	pd     *pd
	stag   uint32
	buf    []byte
	addr   uint64
	access driver.AccessFlags
	// ext is the region to the key check; it is revoked (deregistered
	// or invalidated) under ctx.mu, and receivers also check it without
	// ctx.mu before each placement into the region (see Dereg).
	ext grant.Extent
	// A memory window's binding resolves to a view of its region: an mr
	// of its own (parent the region, stag the window's key, buf and
	// access the binding's), so that what is under way through the
	// window is tracked and revoked apart from the region. views are
	// the region's live views, revoked with it; guarded by ctx.mu.
	parent *mr
	views  []*mr
}

// Extent implements grant.Region.
func (m *mr) Extent() *grant.Extent { return &m.ext }

// revokeLocked revokes m and its views. ctx.mu is held.
func (m *mr) revokeLocked() {
	m.ext.Revoke()
	for _, v := range m.views {
		v.ext.Revoke()
	}
	m.views = nil
}

func (p *pd) AllocMR(size int, access driver.AccessFlags) (driver.MR, error) {
	// Back the region with uint64s so that it is 8-byte aligned for atomics.
	words := make([]uint64, (size+7)/8)
	return p.register(unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), size), access)
}

func (p *pd) RegMR(buf []byte, access driver.AccessFlags) (driver.MR, error) {
	return p.register(buf, access)
}

func (p *pd) register(buf []byte, access driver.AccessFlags) (driver.MR, error) {
	c := p.ctx
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || p.Released() {
		return nil, driver.ErrClosed
	}
	var m *mr
	_, err := c.mrs.Insert(func(stag uint32) grant.Entry[*mr] {
		addr := uint64(uintptr(unsafe.Pointer(&buf[0])))
		m = &mr{ctx: c, pd: p, stag: stag, buf: buf, addr: addr, access: access,
			ext: grant.Extent{Addr: addr, Len: uint64(len(buf)), Access: access, PD: p}}
		return grant.RegionEntry(m)
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %v", driver.ErrNoResources, err)
	}
	return m, nil
}

func (m *mr) LKey() uint32               { return m.stag }
func (m *mr) RKey() uint32               { return m.stag }
func (m *mr) Addr() uint64               { return m.addr }
func (m *mr) Bytes() []byte              { return m.buf }
func (m *mr) Access() driver.AccessFlags { return m.access }

func (m *mr) Dereg() error {
	c := m.ctx
	c.mu.Lock()
	if cur, _ := c.mrs.Lookup(m.stag); cur.MR != m {
		c.mu.Unlock()
		return driver.ErrClosed
	}
	views := m.views
	m.revokeLocked()
	c.mrs.Remove(m.stag)
	var buf [16]*conn
	conns := c.liveConns(buf[:0])
	c.mu.Unlock()
	for _, v := range views {
		c.quiesce(v, conns) // the views' Reads are cut as well
	}
	// Nothing is placed into the region once Dereg returns: a receiver
	// checks revoked after it has announced a read or copy (rxBusy), so
	// one that announced later sees it, and one that announced earlier
	// is waited for. Placement under q.mu (an atomic's result) is
	// waited for by taking each QP's lock.
	for _, cn := range conns {
		for cn.rxBusy.Load() != 0 {
			runtime.Gosched()
		}
		cn.q.mu.Lock()
		cn.q.forgetMR(m)
		cn.q.mu.Unlock()
	}
	// Nor is anything of it sent: the peer's Reads of it are cut short.
	var wg sync.WaitGroup
	cutReads(conns, m, &wg)
	wg.Wait()
	return nil
}

// liveConns appends the live connections of c's QPs to conns (the
// caller's buffer, so that a context of a few connections allocates
// nothing). c.mu is held.
func (c *devCtx) liveConns(conns []*conn) []*conn {
	for q := range c.qps {
		if cn := q.live.Load(); cn != nil {
			conns = append(conns, cn)
		}
	}
	return conns
}

// cutReads cuts short the peers' Reads of m, revoked: on every connection
// that sends or owes a Read Response from it, at once, each in a
// goroutine of its own (revokeRead may wait for its peer), which wg, if
// not nil, waits for. A connection that does neither now never will: the
// revocation keeps new Read Requests of m out and its bytes out of new
// batches.
func cutReads(conns []*conn, m *mr, wg *sync.WaitGroup) {
	for _, cn := range conns {
		if !cn.holds(m) {
			continue
		}
		if wg == nil {
			go cn.revokeRead(m)
			continue
		}
		wg.Add(1)
		go revokeReadDone(cn, m, wg)
	}
}

// revokeReadDone is cn.revokeRead(m), then wg.Done.
func revokeReadDone(cn *conn, m *mr, wg *sync.WaitGroup) {
	defer wg.Done()
	cn.revokeRead(m)
}

// accessError says why an STag check failed, in the terms of a Terminate.
type accessError uint8

const (
	accessOK       accessError = iota
	accessBadSTag              // no valid region has the STag
	accessNotAssoc             // the region belongs to another protection domain
	accessRights               // the region (or the QP) does not grant the access
	accessBounds               // the range is not inside the region
)

// spanLocked returns the bytes [addr, addr+n) that stag grants need on,
// for an access arriving on QP q of p (nil: a local access, by lkey),
// and the region (or a window's view of it) they lie in. c.mu is held
// for reading.
func (c *devCtx) spanLocked(stag uint32, p *pd, q *qp, addr, n uint64, need driver.AccessFlags) ([]byte, *mr, accessError) {
	var m *mr
	var f grant.Fault
	if q == nil {
		m, f = grant.CheckLocal(&c.mrs, stag, p, addr, n, need)
	} else {
		m, f = grant.Check(&c.mrs, stag, p, q, addr, n, need)
	}
	switch f {
	case grant.OK:
		off := addr - m.addr
		return m.buf[off : off+n], m, accessOK
	case grant.NotAssoc:
		return nil, nil, accessNotAssoc
	case grant.Rights:
		return nil, nil, accessRights
	case grant.Bounds:
		return nil, nil, accessBounds
	}
	return nil, nil, accessBadSTag
}

// span is spanLocked of m, the region found for stag (nil if none).
func (m *mr) span(stag uint32, p *pd, addr, n uint64, need driver.AccessFlags) ([]byte, *mr, accessError) {
	switch {
	case m == nil || m.stag != stag || m.ext.Revoked():
		return nil, nil, accessBadSTag
	case m.pd != p:
		return nil, nil, accessNotAssoc
	case m.access&need != need:
		return nil, nil, accessRights
	}
	b, ok := soft.Within(m.buf, m.addr, addr, n)
	if !ok {
		return nil, nil, accessBounds
	}
	return b, m, accessOK
}

// span is spanLocked for callers that do not hold c.mu.
func (c *devCtx) span(stag uint32, p *pd, q *qp, addr, n uint64, need driver.AccessFlags) ([]byte, *mr, accessError) {
	c.mu.RLock()
	b, m, e := c.spanLocked(stag, p, q, addr, n, need)
	c.mu.RUnlock()
	return b, m, e
}

// invalidate invalidates the region of stag on p for a Send with
// Invalidate: later remote access with it fails, and the Read Responses
// from it that any connection still owes are cut short (cutReads: their
// QPs fail), since the application may reuse the region once it sees the
// invalidation. It reports false when no such region exists, or when the
// region grants no remote access: its STag is a local key only, which a
// peer may not revoke.
//
// A window's key invalidates the window if it may (grant.RemoteInvalidate:
// a type 2 window bound to q), and its view of the region is revoked as a
// region's would be.
func (c *devCtx) invalidate(stag uint32, q *qp) bool {
	p := q.pd
	if v, isWindow, err := grant.RemoteInvalidate(&c.mrs, stag, q, p); isWindow {
		if err != nil {
			return false
		}
		c.revokeView(v, false)
		return true
	}
	c.mu.Lock()
	e, _ := c.mrs.Lookup(stag)
	m := e.MR
	if m == nil || m.stag != stag || m.pd != p || m.access&driver.RemoteAccess == 0 {
		c.mu.Unlock()
		return false
	}
	if m.ext.Revoked() {
		// Invalid already: the verbs let an STag be invalidated
		// again, as siw does.
		c.mu.Unlock()
		return true
	}
	views := m.views
	m.revokeLocked()
	var buf [16]*conn
	conns := c.liveConns(buf[:0])
	c.mu.Unlock()
	cutReads(conns, m, nil) // not waited for: the caller is a receiving round
	for _, v := range views {
		cutReads(conns, v, nil)
	}
	return true
}

// errString describes an accessError for error messages.
func (e accessError) String() string {
	switch e {
	case accessBadSTag:
		return "no valid region has this STag"
	case accessNotAssoc:
		return "the region belongs to another protection domain"
	case accessRights:
		return "the region does not grant the access"
	case accessBounds:
		return "the range is outside the region"
	}
	return fmt.Sprintf("accessError(%d)", uint8(e))
}
