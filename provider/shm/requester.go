package shm

import (
	"encoding/binary"
	"sync/atomic"
	"unsafe"

	"github.com/goverbs/goverbs/internal/keytab"
	"github.com/goverbs/goverbs/internal/sglist"
	"github.com/goverbs/goverbs/internal/soft"
	"github.com/goverbs/goverbs/internal/swq"
	"github.com/goverbs/goverbs/verbs/driver"
)

// The requester: this process executes its QP's send queue itself,
// reaching into the peer's memory through the segments it mapped. Every
// value read from the peer's shared memory is checked before use.

// State implements swq.Engine (see swq.RNR.ExecState).
func (q *qp) State() driver.QPState { return q.rnr.ExecState(q.attr.State) }

// sqDrained raises EventSQDrained once a QP moved to SQD has drained its
// send queue: the WR retrying receiver-not-ready, if any, is done.
func (q *qp) sqDrained() {
	soft.SQDrained(&q.sqdPending, q.attr.State, q.rnr.Retrying(), q.ctx.EventQueue, q.userCtx)
}

// Stalled implements swq.Engine: an RNR retry is pending.
func (q *qp) Stalled() bool { return q.rnr.Waiting() || q.mwWait.waiting }

// Fail implements swq.Engine.
func (q *qp) Fail() { q.toErr() }

// accepts reports whether a responder in state s takes requests.
func accepts(s driver.QPState) bool {
	return s == driver.QPSRTR || s == driver.QPSRTS || s == driver.QPSSQD || s == driver.QPSSQE
}

// Execute implements swq.Engine: it performs one WR against the peer.
func (q *qp) Execute(s *swq.Slot) (driver.WCStatus, uint32) {
	st, n := q.execute(s)
	q.afterWR()
	return st, n
}

// postNow performs wr at once, in the poster's goroutine and straight
// from its WR, when it is a Send, an RDMA Write (either inline or not),
// a Read or an atomic with one SGE, the send queue is idle and has room,
// and all of it checks out: the WR is valid, the QP's peer is up, the
// local memory and the peer's resolve, and the peer's memory is mapped
// here. For anything else it reports false, having touched neither
// side's registered memory nor the queue, and the caller posts wr
// through the queue (Post, then Progress), whose Execute performs it —
// and produces its error: postNow is only the common case's short road.
// (What its lookups left behind — keys cached, segments mapped or asked
// for, the bound on segment waits — serves that Execute, whose afterWR
// clears it.) A Send that finds no receive posted is left to the queue
// too, which waits and retries (RNR); one that fails once it has taken
// the peer's receive cannot be, and is completed here as Progress
// completes a failed WR: with its status, the QP then moved to the error
// state. q.mu is held; the caller has checked that the QP is in RTS,
// with no RNR wait.
func (q *qp) postNow(wr *driver.SendWR) bool {
	if len(wr.SGList) != 1 || int(wr.Opcode) >= len(nowKinds) {
		return false
	}
	kind := nowKinds[wr.Opcode]
	sq := q.sq
	if kind == 0 || !sq.Idle() || !sq.Room() {
		return false
	}
	g := &wr.SGList[0]
	n := uint64(g.Length)
	// The checks of driver.CheckSendWR for these opcodes and one SGE; a
	// WR that fails one goes through Post, which reports it.
	need := driver.AccessLocalWrite // Reads and atomics write their local buffer
	if kind <= nowWrite {
		need = 0
	}
	if q.cap.MaxSendSGE == 0 || n == 0 || n > deviceAttr.MaxMsgSize || (kind == nowAtomic && n != 8) ||
		(wr.Flags&driver.SendInline != 0 && (need != 0 || n > uint64(q.cap.MaxInlineData))) {
		return false
	}
	c := q.conn
	if c == nil || !c.peerUp() {
		return false
	}
	b, ok := q.localSpan(g.LKey, g.Addr, n, need)
	if !ok {
		return false
	}
	c.announceRequest()
	t := &c.dst[0]
	st, byteLen := driver.WCSuccess, uint32(0)
	switch kind {
	case nowSend:
		q.local.One(b)
		if st = c.send(wr, &q.local); st == swq.RNRWait {
			return false // no receive taken: the queue waits for one
		}
	case nowWrite:
		if !c.target(t, wr.RKey, wr.RemoteAddr, n, driver.AccessRemoteWrite, true) || t.proc {
			return false
		}
		copySmall(t.b, b)
	case nowRead:
		if !c.peerReads() || !c.target(t, wr.RKey, wr.RemoteAddr, n, driver.AccessRemoteRead, false) || t.proc {
			return false
		}
		copySmall(b, t.b)
		byteLen = uint32(n)
	default:
		if !c.peerReads() || wr.RemoteAddr%8 != 0 {
			return false
		}
		word, ok := c.atomicWord(t, wr)
		if !ok {
			return false
		}
		binary.NativeEndian.PutUint64(b, applyAtomic(word, wr)) // n is 8
		byteLen = 8
	}
	if c.leftovers() {
		c.afterWR()
	}
	if seq, signaled := sq.Commit(wr); signaled || st != driver.WCSuccess {
		q.sendCQ.pushSend(q, seq, wr.WRID, st, wr.Opcode.CompletionOpcode(), byteLen)
	}
	if st != driver.WCSuccess {
		q.toErr() // a Send that failed once it took the receive
	}
	return true
}

// postFast is postNow's shortest road, tried first: an RDMA Write, Read
// or atomic with one SGE (inline only if a Write within the QP's inline
// limit), whose local and remote keys are
// those of the last WR of its opcode that took it (the connection's
// fastPath for the opcode), on a connection with nothing to do between
// WRs (hold: no mapping change to absorb, nothing left for afterWR, the
// peer's QP past announceRequest). A WR whose keys are not those fills
// the fastPath first (fillFast), from the region the QP's last WR named
// (lastMR) and the connection's cache of remote keys. Its checks are
// postNow's, the lookups aside; it reports false, having touched
// nothing, for any other WR or any check that fails, and postNow takes
// the WR. PostSend tries postPath alone for a single WR, and
// postSendLocked all of postFast, in line, taking runs of WRs through
// postRun.

// fastPath is what postFast keeps of the WRs of one opcode that took it:
// their local and remote keys, and what those resolved to once every
// check that does not depend on a WR's addresses and length passed. A
// WR with the same keys is checked against it: the local region still
// registered, the peer's grant epoch word for the connection (epoch.go)
// at the value it had when the fastPath was filled, and the WR's spans in
// the two regions. Neither the key's slot nor the peer QP's header (its
// state, rights, responder depth, PD and gen) is read again: the peer
// moves the epoch on after every write of its grant table and of its
// header (keyTable.publish, qp.publish), so that a WR after either
// change takes the long road, which checks them again. The epoch words of a peer process's connections share a
// page: a requester going round many QPs misses the TLB on no page of
// the peer's of a connection's own. (A peer that changes its grants or
// header and not the epoch lets WRs into no memory but what its grants
// name.) It is guarded by q.mu, and forgotten with the rest of the key
// cache whenever a mapping goes (absorb, revocations, close): remote
// points into one.
type fastPath struct {
	mr         *mr    // the local region (nil: none, and llen is 0)
	lkey, rkey uint32 // the WRs' keys
	// local: the region's first byte, at address laddr, llen bytes of
	// it (at most the largest message: a WR within them is no longer).
	local       unsafe.Pointer
	laddr, llen uint64
	// remote: the remote region's first byte in its mapping, at address
	// raddr, and rlen bytes of it (keyEntry.fastWin); an atomic's is
	// aligned as raddr is, modulo 8.
	remote      unsafe.Pointer
	raddr, rlen uint64
	epoch       uint64 // the peer's grant epoch word as it was when filled
}

// postPath performs wr through the fastPath of its opcode, if wr has its
// keys and checks out; it reports false, having touched nothing, if not.
func (q *qp) postPath(wr *driver.SendWR) bool {
	c := q.hot // the connection's, read without reading the conn
	if c == nil {
		return false
	}
	op := wr.Opcode // wr is read after q: no test of wr for nil of its own
	if int(op) >= len(c.fast) || len(wr.SGList) != 1 {
		return false
	}
	t, g := &c.fast[op], &wr.SGList[0]
	if t.lkey != g.LKey || t.rkey != wr.RKey {
		return false
	}
	n := uint64(g.Length)
	// Every WR here is performed before PostSend returns, so an inline
	// Write is one like any other; an inline Read or atomic, or a Write
	// beyond the QP's inline limit, is an error Post reports.
	if wr.Flags&driver.SendInline != 0 && (op != driver.OpRDMAWrite || n > uint64(q.cap.MaxInlineData)) {
		return false
	}
	// The spans, in the two regions (a zero-length WR takes the long
	// road). An empty fastPath (mr nil) has llen 0, in which no span
	// lies: this refuses it before t.mr is read.
	loff, roff := g.Addr-t.laddr, wr.RemoteAddr-t.raddr
	if !inSpan(loff, n, t.llen) || !inSpan(roff, n, t.rlen) {
		return false
	}
	if c.hold.Load()|t.mr.ext.RevokedWord() != 0 {
		return false // the connection holds WRs, or the region was deregistered
	}
	if c.epoch.Load() != t.epoch {
		return false // the peer wrote its grant table since
	}
	sq := q.sq
	if !sq.Idle() {
		return false
	}
	if !sq.Room() {
		return false
	}
	local, remote := unsafe.Add(t.local, loff), unsafe.Add(t.remote, roff)
	var byteLen uint32
	wc := driver.WCRDMAWrite
	if n != 8 {
		// A copy that calls memmove: from here on, q, wr, byteLen and
		// wc alone, loaded again, are kept across the call (the length
		// is g's, loaded again, so that the 8-byte road below hands the
		// completion its byteLen in the same register).
		switch op {
		case driver.OpRDMAWrite:
			copySpan(remote, local, n)
		case driver.OpRDMARead:
			copySpan(local, remote, n)
			byteLen, wc = g.Length, driver.WCRDMARead
		default:
			return false // an atomic is 8 bytes
		}
	} else {
		// One load and one store, or the atomic instruction: no call,
		// so nothing is kept on the stack across one.
		switch op {
		case driver.OpRDMAWrite:
			*(*[8]byte)(remote) = *(*[8]byte)(local)
		case driver.OpRDMARead:
			*(*[8]byte)(local) = *(*[8]byte)(remote)
			byteLen, wc = 8, driver.WCRDMARead
		case driver.OpAtomicFetchAndAdd:
			if uintptr(remote)%8 != 0 {
				return false
			}
			add := wr.CompareAdd
			*(*uint64)(local) = atomic.AddUint64((*uint64)(remote), add) - add
			byteLen, wc = 8, driver.WCFetchAdd
		default:
			if uintptr(remote)%8 != 0 {
				return false
			}
			*(*uint64)(local) = applyAtomic((*uint64)(remote), wr)
			byteLen, wc = 8, driver.WCCompSwap
		}
	}
	if seq, signaled := q.sq.Commit(wr); signaled {
		// pushSend, in line: one call fewer.
		if cq := q.sendCQ; !cq.notOwn.Load() && cq.local.produceOwn(seq, wr.WRID, driver.WCSuccess, wc, byteLen) {
			cq.ring.notify(false, false)
		} else {
			cq.pushSendSlow(q, seq, wr.WRID, driver.WCSuccess, wc, byteLen)
		}
	}
	return true
}

// postRun performs wrs, from the first, through postPath as long as it
// takes them, and reports how many it performed: a run of WRs with the
// kept keys goes without postSendLocked's work between WRs. It stops at a
// WR postPath refuses, and after one whose completion overran the send
// CQ, which failed the QP.
func (q *qp) postRun(wrs []driver.SendWR) int {
	for i := range wrs {
		if q.attr.State != driver.QPSRTS || !q.postPath(&wrs[i]) {
			return i
		}
	}
	return len(wrs)
}

// fillFast fills the fastPath of wr's opcode for wr's keys, if wr is one
// postFast takes and every check that does not depend on its addresses
// and length passes, without lookups: the local key names the region the
// QP's last WR named, the remote key is in the connection's cache, its
// region is mapped, and the connection has nothing to do between WRs. It
// reports whether it did.
func (q *qp) fillFast(wr *driver.SendWR) bool {
	if int(wr.Opcode) >= len(fastOps) || fastOps[wr.Opcode].rneed == 0 {
		return false // Sends, above all, leave here
	}
	f := fastOps[wr.Opcode]
	c, m, sgl := q.conn, q.lastMR, wr.SGList
	if len(sgl) != 1 || c == nil || m == nil || q.cap.MaxSendSGE == 0 {
		return false
	}
	g := &sgl[0]
	if m.key != g.LKey || m.access&f.need != f.need || m.ext.Revoked() || c.hot.hold.Load() != 0 {
		return false
	}
	// The epoch first, then the slot's version (cachedFast), then the
	// header: the peer writes a slot or its header before it moves the
	// epoch on, so what is read here is at least as new as the epoch
	// kept.
	epoch := c.hot.epoch.Load()
	e := c.cachedFast(wr.RKey, f.rneed != driver.AccessRemoteRead)
	if e == nil || len(e.fastWin) == 0 {
		return false
	}
	h := c.peerHdr // peerUp (ended is in hold), peerReads and allows
	w0, w1 := h.qpWords()
	var v [4]uint32 // the four fields, as they lie in the words
	*(*[2]uint64)(unsafe.Pointer(&v)) = [2]uint64{w0, w1}
	state, access, attrs, pd := v[0], v[1], v[2], v[3]
	if !accepts(driver.QPState(state)) || h.gen.Load() != c.peerGen || f.need != 0 && attrs>>8&0xff == 0 {
		return false
	}
	if e.k.access&(driver.AccessFlags(access)|^driver.RemoteAccess)&f.rneed != f.rneed || e.k.pd != pd {
		return false
	}
	remote := unsafe.Pointer(unsafe.SliceData(e.fastWin))
	if f.rneed == driver.AccessRemoteAtomic && uint64(uintptr(remote))%8 != e.k.addr%8 {
		return false
	}
	c.hot.fast[wr.Opcode] = fastPath{mr: m, lkey: m.key, rkey: e.k.key,
		local: unsafe.Pointer(unsafe.SliceData(m.buf)), laddr: m.addr, llen: min(uint64(len(m.buf)), deviceAttr.MaxMsgSize),
		remote: remote, raddr: e.k.addr, rlen: uint64(len(e.fastWin)),
		epoch: epoch}
	return true
}

// inSpan reports whether the n bytes at offset off of a span of size
// bytes lie in it, as soft.Within does for n > 0; false for n == 0 (n-1
// wraps), which postFast leaves to the long road.
func inSpan(off, n, size uint64) bool { return off < size && n-1 < size-off }

// copySpan copies the n bytes at src to dst, spans that inSpan accepted:
// one load and one store for the 8 bytes of a word-sized operation, a
// call of memmove otherwise.
func copySpan(dst, src unsafe.Pointer, n uint64) {
	if n == 8 {
		*(*[8]byte)(dst) = *(*[8]byte)(src)
	} else {
		copy(unsafe.Slice((*byte)(dst), n), unsafe.Slice((*byte)(src), n))
	}
}

// fastOp is what postFast needs to know of an opcode it takes: the local
// and remote rights, and the completion's opcode. rneed is 0 for the
// opcodes it does not take.
type fastOp struct {
	need, rneed driver.AccessFlags
	wc          driver.WCOpcode
}

var fastOps = [...]fastOp{
	driver.OpRDMAWrite:         {0, driver.AccessRemoteWrite, driver.OpRDMAWrite.CompletionOpcode()},
	driver.OpRDMARead:          {driver.AccessLocalWrite, driver.AccessRemoteRead, driver.OpRDMARead.CompletionOpcode()},
	driver.OpAtomicFetchAndAdd: {driver.AccessLocalWrite, driver.AccessRemoteAtomic, driver.OpAtomicFetchAndAdd.CompletionOpcode()},
	driver.OpAtomicCmpAndSwp:   {driver.AccessLocalWrite, driver.AccessRemoteAtomic, driver.OpAtomicCmpAndSwp.CompletionOpcode()},
}

// The kinds of WR postNow performs, by opcode (0: none of them).
const (
	nowSend = 1 + iota
	nowWrite
	nowRead
	nowAtomic
)

var nowKinds = [...]uint8{
	driver.OpSend: nowSend, driver.OpSendWithImm: nowSend, driver.OpRDMAWrite: nowWrite,
	driver.OpRDMARead: nowRead, driver.OpAtomicFetchAndAdd: nowAtomic, driver.OpAtomicCmpAndSwp: nowAtomic,
}

// copySmall is copy(dst, src) for slices of the same length, with one
// load and one store for the 8 bytes of a word-sized operation instead of
// a call of memmove.
func copySmall(dst, src []byte) {
	if len(dst) == 8 && len(src) == 8 {
		binary.NativeEndian.PutUint64(dst, binary.NativeEndian.Uint64(src))
	} else {
		copy(dst, src)
	}
}

// afterWR is what Execute does between two WRs: unmap the mappings the
// WR's lookups dropped, end its bound on segment waits, and answer a
// revocation the peer waits for (awaitRevokeAnswer).
func (q *qp) afterWR() {
	if c := q.conn; c != nil && c.leftovers() {
		c.afterWR() // out of line: afterWR inlines
	}
}

// leftovers reports whether the WR just executed left work for afterWR.
func (c *conn) leftovers() bool {
	return c.hot.hold.Load()&(holdRetired|holdSegWait|holdRevoke) != 0
}

// afterWR is qp.afterWR when there is something to do.
func (c *conn) afterWR() {
	h := c.hot.hold.Load()
	if h&holdRetired != 0 {
		c.closeRetired()
	}
	if h&holdSegWait != 0 {
		c.endWait()
	}
	if h&holdRevoke != 0 {
		c.answerRevoke()
	}
}

// execute performs the WR of slot s.
func (q *qp) execute(s *swq.Slot) (driver.WCStatus, uint32) {
	wr := &s.WR
	if wr.Opcode == driver.OpBindMW || wr.Opcode == driver.OpLocalInv {
		return q.windowOp(s) // local: no peer takes part
	}
	c := q.conn
	if c == nil {
		// A QP moved to RTR by hand: shm QPs are connected with cm, so
		// nobody answers and the transport retries run out.
		return driver.WCRetryExcErr, 0
	}
	if !c.peerUp() {
		// The connection is gone (the peer's QP failed, or the peer
		// died): the QP moves to the error state, flushing this WR too.
		q.toErr()
		return driver.WCWRFlushErr, 0
	}
	local := &q.local
	if len(wr.SGList) == 1 && !s.IsInline {
		// swq.ResolveLocal's common case, without its calls through
		// swq.Memory.
		g := &wr.SGList[0]
		b, ok := q.localSpan(g.LKey, g.Addr, uint64(g.Length), swq.NeedOf(wr.Opcode))
		if !ok {
			return driver.WCLocProtErr, 0
		}
		local.One(b)
	} else if !swq.ResolveLocal(local, s, q) {
		return driver.WCLocProtErr, 0
	}
	length := local.Len()
	if length > deviceAttr.MaxMsgSize {
		return driver.WCLocLenErr, 0
	}
	// The request leaves: a WR that failed at its requester reached
	// nobody.
	c.announceRequest()
	switch wr.Opcode {
	case driver.OpSend, driver.OpSendWithImm, driver.OpSendWithInv:
		return q.rnrCheck(c.send(wr, local)), 0
	case driver.OpRDMAWrite, driver.OpRDMAWriteWithImm:
		return q.rnrCheck(c.write(wr, local)), 0
	case driver.OpRDMARead:
		return c.read(wr, local), uint32(length)
	case driver.OpAtomicCmpAndSwp, driver.OpAtomicFetchAndAdd:
		old, st := c.atomic(wr)
		if st == driver.WCSuccess {
			swq.PlaceResult(local, &q.result, old)
		}
		return st, 8
	}
	return driver.WCLocQPOpErr, 0
}

// LocalSpan implements swq.Memory: the SGE's bytes in a region of q's PD
// that grants need.
func (q *qp) LocalSpan(g *driver.SGE, need driver.AccessFlags) ([]byte, bool) {
	return q.localSpan(g.LKey, g.Addr, uint64(g.Length), need)
}

// localSpan is devCtx.span for q's PD, which remembers the region the
// last key named: while that region is registered (Dereg revokes its
// extent before it unmaps), a WR naming the same key reads neither the
// key table nor the region's PD. q.mu is held.
func (q *qp) localSpan(key uint32, addr, n uint64, need driver.AccessFlags) ([]byte, bool) {
	m := q.lastMR
	if m == nil || m.key != key || m.ext.Revoked() {
		if m = q.ctx.lookupMR(key); m == nil || m.pd != q.pd {
			return nil, false
		}
		q.lastMR = m
	}
	if m.access&need != need {
		return nil, false
	}
	return soft.Within(m.buf, m.addr, addr, n)
}

// rnrCheck retries a receiver-not-ready condition after the responder's
// RNR timer, up to the QP's RNRRetry count.
func (q *qp) rnrCheck(st driver.WCStatus) driver.WCStatus {
	if st != swq.RNRWait {
		q.rnr.Answered()
		return st
	}
	return q.rnrWait() // out of line: rnrCheck inlines
}

// rnrWait starts the wait before a receiver-not-ready retry.
func (q *qp) rnrWait() driver.WCStatus {
	d := driver.RNRTimer(q.conn.peerHdr.attrs.Load() & 31).Duration()
	return q.rnr.Wait(q.attr.RNRRetry, d)
}

// rnrExpired retries the stalled WR once its RNR wait is over.
func (q *qp) rnrExpired() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.destroyed && q.rnr.Expired() {
		q.sq.Progress(q)
		q.sqDrained()
	}
}

// remote is peer memory a request names: a mapped slice, or a range of
// the peer's process memory.
type remote struct {
	b    []byte
	addr uint64 // process memory: the peer's address
	n    uint64
	proc bool
}

// target resolves key, addr and n in the peer's key table, requiring need
// of the region (and of the peer QP, for remote access), and maps it into
// t. (t is filled in place: a returned struct read back with wider loads
// than it was stored with stalls the CPU.)
func (c *conn) target(t *remote, key uint32, addr, n uint64, need driver.AccessFlags, write bool) bool {
	if c.hot.hold.Load()&holdDirty != 0 {
		c.absorb() // the mappings change: this forgets the cached keys
	}
	e := c.cached(key, write)
	if e == nil {
		var ok bool
		if e, ok = c.resolve(key, write); !ok {
			return false
		}
	}
	if !c.allows(&e.k, need) {
		return false
	}
	t.n = n
	if e.seg == nil {
		_, ok := e.k.span(addr, n)
		t.b, t.addr, t.proc = nil, addr, true
		return ok
	}
	b, ok := e.span(addr, n)
	t.b, t.addr, t.proc = b, 0, false
	return ok
}

// allows reports whether the peer's key k grants need, with the peer
// QP's PD and, for remote access, the peer QP's rights. (The bounds are
// the caller's: k.span.)
func (c *conn) allows(k *keyInfo, need driver.AccessFlags) bool {
	// The peer QP's rights bound the remote ones only.
	rights := k.access & (driver.AccessFlags(c.peerHdr.access.Load()) | ^driver.RemoteAccess)
	return rights&need == need && k.pd == c.peerHdr.pd.Load()
}

// mappedRegion returns the bytes of the region of k that lie in mem, its
// segment as mapped here: the whole region, or as much of its start as the
// mapping holds (a WR beyond it fails); false if the region starts beyond
// the mapping, where no span of it, not even an empty one, is valid.
func mappedRegion(mem []byte, k *keyInfo) ([]byte, bool) {
	if k.segOff > uint64(len(mem)) {
		return nil, false
	}
	return mem[k.segOff:][:min(k.length, uint64(len(mem))-k.segOff)], true
}

// span returns the n bytes at addr of e's region in its segment's
// mapping: false unless they lie both in the region and in the mapping.
// (The test of addr against the region's start is Within's too, but for a
// region a lying peer says wraps around the address space.)
func (e *keyEntry) span(addr, n uint64) ([]byte, bool) {
	if addr < e.k.addr || !e.mapped {
		return nil, false
	}
	return soft.Within(e.win, e.k.addr, addr, n)
}

// keyCache remembers the requester's last resolved keys, so that a WR
// naming one of them reads a single word of the peer's key table: a slot
// whose version is unchanged still says what it said (Dereg and every
// re-registration change it). An entry holds the segment the key maps
// to; absorb, which unmaps segments, forgets every entry. Guarded by q.mu.
type keyCache struct {
	e    [2]keyEntry // cachedFast looks at both
	next int         // the entry to replace
}

// keyEntry is one resolved key: the key slot as read, and the peer's
// segment it lies in, mapped writable if rw (nil for process memory), and
// win, the region's bytes in that mapping (mappedRegion), whose first byte
// is at the key's addr, mapped false if the region starts beyond the
// mapping: a WR's remote span is checked against them alone (span).
//
// slot is the key's slot in the peer's key table, whose version says
// whether k is current; fastWin is win for postFast, nil unless the
// region is mapped and does not wrap around the address space, so that
// an address is in it exactly when its offset from the key's addr is.
type keyEntry struct {
	k       keyInfo
	slot    *keySlot
	seg     *segment
	win     []byte
	fastWin []byte
	mapped  bool
	rw      bool
	valid   bool
}

// cached returns the entry of key if it is still current (and maps its
// segment writable, if write); nil otherwise.
func (c *conn) cached(key uint32, write bool) *keyEntry {
	for i := range c.kc.e {
		e := &c.kc.e[i]
		if e.valid && e.k.key == key && (e.rw || !write) {
			if c.keys.current(&e.k) {
				return e
			}
			e.valid = false
		}
	}
	return nil
}

// cachedFast is cached for postFast: the entry of key if it is current
// (and maps its segment writable, if write); nil otherwise, leaving a
// stale entry for cached to drop.
func (c *conn) cachedFast(key uint32, write bool) *keyEntry {
	e := &c.kc.e[0]
	if !e.names(key, write) {
		if e = &c.kc.e[1]; !e.names(key, write) {
			return nil
		}
	}
	if e.slot.ver.Load() != e.k.ver {
		return nil
	}
	return e
}

// names reports whether e holds key, mapped writable if write.
func (e *keyEntry) names(key uint32, write bool) bool {
	return e.k.key == key && e.valid && (e.rw || !write)
}

// resolve looks key up in the peer's key table, maps its segment, and
// caches the result.
func (c *conn) resolve(key uint32, write bool) (*keyEntry, bool) {
	k, ok := c.keys.lookup(key)
	if !ok {
		// Not granted yet: the peer's grant table holds only the keys
		// this side asked for. (A peer never granting it makes the WR
		// fail like a wrong key.)
		if !c.askKey(key) {
			return nil, false
		}
		if k, ok = c.keys.lookup(key); !ok {
			return nil, false
		}
	}
	var seg *segment
	switch k.kind {
	case kindSegment:
		if seg, ok = c.segment(k.segID, write); !ok {
			return nil, false
		}
	case kindProcess:
	default:
		return nil, false
	}
	e := &c.kc.e[c.kc.next]
	c.kc.next = (c.kc.next + 1) % len(c.kc.e)
	*e = keyEntry{k: k, slot: c.keys.slot(keytab.Index(k.key)), seg: seg, rw: seg != nil && c.segRW[k.segID], valid: true}
	if seg != nil {
		e.win, e.mapped = mappedRegion(seg.mem, &k)
		if e.mapped && k.addr+uint64(len(e.win)) >= k.addr {
			e.fastWin = e.win
		}
	}
	return e, true
}

// send places a Send into the peer's next posted receive and writes the
// receive's completion into the peer's CQ. A Send of at most inlineMax
// bytes, into a receive of at most recSGEs buffers, travels in the
// completion instead, and the peer's Poll places it; the receive's
// buffers are checked here all the same, so that a Send fails alike
// either way.
func (c *conn) send(wr *driver.SendWR, src *sglist.List) driver.WCStatus {
	r := &c.rent
	if st := c.claimRecv(); st != driver.WCSuccess {
		return st
	}
	var wc driver.WorkCompletion
	c.recvCompletion(&wc, wr, r.pos, driver.WCRecv)
	dst := &c.dst
	var room uint64
	for i := range r.n {
		g := &r.sge[i]
		if !c.target(&dst[i], g.LKey, g.Addr, uint64(g.Length), driver.AccessLocalWrite, true) {
			wc.Status = driver.WCLocProtErr
			c.peerComplete(&wc, nil)
			c.peerError(driver.EventQPAccessErr)
			return driver.WCRemOpErr
		}
		room += dst[i].n
	}
	if src.Len() > room {
		wc.Status = driver.WCLocLenErr
		c.peerComplete(&wc, nil)
		c.peerError(driver.EventQPReqErr)
		return driver.WCRemInvReqErr
	}
	if wr.Opcode == driver.OpSendWithInv {
		// The peer invalidates its window once the receive is known to
		// take the message, and before it is placed (mw.go): a Send
		// that fails at the receive leaves the window bound, and one
		// the peer may not invalidate places nothing.
		if !c.askInvalidate(wr.InvalidateRKey) {
			wc.Status = driver.WCRemInvReqErr
			c.peerComplete(&wc, nil)
			c.peerError(driver.EventQPReqErr)
			return driver.WCRemInvReqErr
		}
		wc.Flags |= driver.WCWithInv
		wc.InvalidatedRKey = wr.InvalidateRKey
	}
	if n := src.Len(); n <= inlineMax && r.n <= recSGEs {
		wc.ByteLen = uint32(n)
		c.peerComplete(&wc, src)
		return driver.WCSuccess
	}
	n, ok := c.copyOut(dst[:r.n], src)
	if !ok {
		wc.Status = driver.WCLocProtErr
		c.peerComplete(&wc, nil)
		c.peerError(driver.EventQPAccessErr)
		return driver.WCRemOpErr
	}
	wc.ByteLen = uint32(n)
	c.peerComplete(&wc, nil)
	return driver.WCSuccess
}

// claimRecv takes the peer's next posted receive into c.rent: WCSuccess,
// swq.RNRWait if none is posted, or WCRemOpErr if the peer's ring makes
// no sense (the connection is then ended).
func (c *conn) claimRecv() driver.WCStatus {
	ok, err := c.peerRecv.consume(&c.rent)
	if err != nil {
		c.peerBroke()
		return driver.WCRemOpErr
	}
	if !ok {
		return swq.RNRWait
	}
	if c.peerSRQ {
		c.checkSRQLimit()
	}
	return driver.WCSuccess
}

// write places an RDMA Write; Write with immediate then consumes a
// receive. A zero-length Write checks no rkey.
func (c *conn) write(wr *driver.SendWR, src *sglist.List) driver.WCStatus {
	n := src.Len()
	dst := c.dst[:1]
	if n > 0 && !c.target(&dst[0], wr.RKey, wr.RemoteAddr, n, driver.AccessRemoteWrite, true) {
		c.peerError(driver.EventQPAccessErr)
		return driver.WCRemAccessErr
	}
	r := &c.rent
	if wr.Opcode == driver.OpRDMAWriteWithImm {
		if st := c.claimRecv(); st != driver.WCSuccess {
			return st
		}
	}
	if n > 0 {
		if _, ok := c.copyOut(dst, src); !ok {
			if wr.Opcode == driver.OpRDMAWriteWithImm {
				// The receive taken is out of the ring, where the
				// peer's flush would not find it: it completes here,
				// flushed, as the peer's QP moves to the error state.
				c.peerComplete(&driver.WorkCompletion{WRID: r.pos, Status: driver.WCWRFlushErr,
					Opcode: driver.WCRecv}, nil)
			}
			c.peerError(driver.EventQPAccessErr)
			return driver.WCRemAccessErr
		}
	}
	if wr.Opcode == driver.OpRDMAWriteWithImm {
		var wc driver.WorkCompletion
		c.recvCompletion(&wc, wr, r.pos, driver.WCRecvRDMAWithImm)
		wc.ByteLen = uint32(n)
		c.peerComplete(&wc, nil)
	}
	return driver.WCSuccess
}

// peerReads reports whether the peer's QP takes RDMA Reads and atomics
// (a responder depth, max_dest_rd_atomic, above 0).
func (c *conn) peerReads() bool { return c.peerHdr.attrs.Load()>>8&0xff != 0 }

// read serves an RDMA Read into the local list dst.
func (c *conn) read(wr *driver.SendWR, dst *sglist.List) driver.WCStatus {
	if !c.peerReads() {
		c.peerError(driver.EventQPReqErr)
		return driver.WCRemInvReqErr
	}
	n := dst.Len()
	if n == 0 {
		return driver.WCSuccess
	}
	t := &c.dst[0]
	if !c.target(t, wr.RKey, wr.RemoteAddr, n, driver.AccessRemoteRead, false) || !c.copyIn(dst, t) {
		c.peerError(driver.EventQPAccessErr)
		return driver.WCRemAccessErr
	}
	return driver.WCSuccess
}

// atomic runs an 8-byte atomic with a CPU atomic instruction on the
// shared word and returns its previous value.
func (c *conn) atomic(wr *driver.SendWR) (uint64, driver.WCStatus) {
	if !c.peerReads() || wr.RemoteAddr%8 != 0 {
		c.peerError(driver.EventQPReqErr)
		return 0, driver.WCRemInvReqErr
	}
	word, ok := c.atomicWord(&c.dst[0], wr)
	if !ok {
		c.peerError(driver.EventQPAccessErr)
		return 0, driver.WCRemAccessErr
	}
	return applyAtomic(word, wr), driver.WCSuccess
}

// atomicWord resolves the target of an atomic wr into t, and returns the
// shared word: false if the target does not resolve to mapped memory
// that allows atomics, aligned to 8 bytes. The caller has checked that
// the peer takes atomics (peerReads) and that the address is aligned.
func (c *conn) atomicWord(t *remote, wr *driver.SendWR) (*uint64, bool) {
	if !c.target(t, wr.RKey, wr.RemoteAddr, 8, driver.AccessRemoteAtomic, true) || t.proc || uintptr(unsafe.Pointer(&t.b[0]))%8 != 0 {
		return nil, false
	}
	return (*uint64)(unsafe.Pointer(&t.b[0])), true
}

// applyAtomic performs wr's atomic on word with a CPU atomic instruction
// and returns the word's previous value.
func applyAtomic(word *uint64, wr *driver.SendWR) uint64 {
	if wr.Opcode == driver.OpAtomicFetchAndAdd {
		return atomic.AddUint64(word, wr.CompareAdd) - wr.CompareAdd
	}
	for {
		old := atomic.LoadUint64(word)
		if old != wr.CompareAdd || atomic.CompareAndSwapUint64(word, old, wr.Swap) {
			return old
		}
	}
}

// recvCompletion starts the peer's completion of a message, into the
// receive at position pos of its queue, in wc (filled in place: a
// returned struct read back with wider loads than it was stored with
// stalls the CPU). The completion names the receive by pos, in its WRID
// field: the peer takes the WRID from its own record.
func (c *conn) recvCompletion(wc *driver.WorkCompletion, wr *driver.SendWR, pos uint64, op driver.WCOpcode) {
	*wc = driver.WorkCompletion{WRID: pos, Opcode: op, SrcQP: c.q.num}
	if wr.Opcode.HasImm() {
		wc.Flags |= driver.WCWithImm
		wc.Imm = wr.Imm
	}
	if wr.Flags&driver.SendSolicited != 0 {
		wc.Flags |= driver.WCSolicited
	}
}

// peerComplete writes a receive completion, with the message payload if
// it is not nil, into the peer QP's completion ring and wakes the peer if
// its CQ waits for one. A full ring is the peer's CQ overrun: it is told,
// and its QP fails.
func (c *conn) peerComplete(wc *driver.WorkCompletion, payload *sglist.List) {
	if !c.peerCQ.produce(wc, payload) {
		c.sendCtrl(msgOverrun, 0, 0)
		return
	}
	c.peerBells.ring(c.peerBell)
	c.peerNotify.notify(wc.Flags&driver.WCSolicited != 0, wc.Status != driver.WCSuccess)
}

// copyOut copies src into the peer memory dst, in order.
func (c *conn) copyOut(dst []remote, src *sglist.List) (uint64, bool) {
	if len(dst) == 1 && src.N() == 1 && !dst[0].proc {
		return uint64(copy(dst[0].b, src.Seg(0))), true
	}
	var total uint64
	si, soff := 0, 0
	for i := range dst {
		d := &dst[i]
		var doff uint64
		for doff < d.n && si < src.N() {
			s := src.Seg(si)[soff:]
			k := min(uint64(len(s)), d.n-doff)
			if d.proc {
				if !c.procCopy(s[:k], d.addr+doff, true) {
					return total, false
				}
			} else {
				copy(d.b[doff:doff+k], s[:k])
			}
			doff += k
			soff += int(k)
			total += k
			if soff == len(src.Seg(si)) {
				si, soff = si+1, 0
			}
		}
	}
	return total, true
}

// copyIn copies the peer memory src into the local list dst.
func (c *conn) copyIn(dst *sglist.List, src *remote) bool {
	if !src.proc {
		dst.Fill(src.b)
		return true
	}
	off := uint64(0)
	for i := range dst.N() {
		b := dst.Seg(i)
		if !c.procCopy(b, src.addr+off, false) {
			return false
		}
		off += uint64(len(b))
	}
	return true
}

// isBroken reports whether the connection has ended.
func (c *conn) isBroken() bool { return c.ended.Load() }

// peerUp reports whether the connection stands and the peer's QP takes
// requests on it: the QP has not been reset since this connection was
// made (its gen), which a peer that has not yet heard of the reset
// would otherwise miss once the QP is connected again.
func (c *conn) peerUp() bool {
	return !c.isBroken() && accepts(driver.QPState(c.peerHdr.state.Load())) && c.peerHdr.gen.Load() == c.peerGen
}

// checkSRQLimit raises the peer SRQ's limit event when a Send left fewer
// receives than its armed limit.
func (c *conn) checkSRQLimit() {
	h := c.peerRecv.h
	lim := h.state.Load()
	if lim > 0 && c.peerRecv.count() < uint64(lim) && h.state.CompareAndSwap(lim, 0) {
		c.sendCtrl(msgSRQLimit, 0, 0)
	}
}
