package shm

import (
	"encoding/binary"
	"errors"
	"runtime"
	"sync/atomic"
	"unsafe"

	"github.com/goverbs/goverbs/internal/atomicrel"
	"github.com/goverbs/goverbs/internal/keytab"
	"github.com/goverbs/goverbs/internal/sglist"
	"github.com/goverbs/goverbs/verbs/driver"
)

// Shared-memory layouts. Every ring starts with a ringHeader whose hot
// words sit on cache lines of their own; the entries follow. A process
// never trusts a size or index it reads from memory a peer can write:
// sizes come from its own records (checked against the mapping when the
// segment arrived), indices are masked, counts are bounded.

const (
	headerSize = 256
	ringMagic  = 0x676f7672 // "govr"
)

type ringHeader struct {
	magic     uint32
	entries   uint32
	entrySize uint32
	_         [13]uint32
	tail      atomic.Uint64 // producers
	_         [7]uint64
	head      atomic.Uint64 // consumers
	_         [7]uint64
	armed     atomic.Uint32 // CQ: notification arming
	wake      atomic.Uint32 // CQ: futex word, bumped by each notification
	state     atomic.Uint32 // QP block: the QP's state; SRQ: limit
	access    atomic.Uint32 // QP block: the responder's access flags
	attrs     atomic.Uint32 // QP block: MinRNRTimer | MaxDestRdAtomic<<8
	pd        atomic.Uint32 // QP block: the QP's protection domain
	gen       atomic.Uint32 // QP block: bumped at each Reset, so that a peer of an earlier connection takes the QP for gone (conn.peerUp)
	// CQ: how many threads sleep on wake (CQ.Wait's own sleep), and
	// whether the notification goroutine waits for its socket: a
	// notification makes only the system calls these ask for (fire).
	sleepers    atomic.Uint32
	eventWaiter atomic.Uint32
	_           [7]uint32
}

// qpWords returns a QP block's state and access (the first word) and
// its attrs and pd (the second), each pair read at once, as they lie in
// memory.
func (h *ringHeader) qpWords() (uint64, uint64) {
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&h.state))), atomic.LoadUint64((*uint64)(unsafe.Pointer(&h.attrs)))
}

// qpWords reads state with access, and attrs with pd, as aligned words.
var _ = [1]struct{}{}[unsafe.Offsetof(ringHeader{}.state)%8+unsafe.Offsetof(ringHeader{}.attrs)%8+
	unsafe.Offsetof(ringHeader{}.access)-unsafe.Offsetof(ringHeader{}.state)-4+
	unsafe.Offsetof(ringHeader{}.pd)-unsafe.Offsetof(ringHeader{}.attrs)-4]

var errGarbage = errors.New("shm: inconsistent shared memory from the peer")

func header(mem []byte) *ringHeader { return (*ringHeader)(unsafe.Pointer(&mem[0])) }

// ringSize is the segment size of a ring of n entries of size bytes.
func ringSize(n, size int) int { return headerSize + n*size }

// pow2 rounds n up to a power of two.
func pow2(n int) int {
	p := 1
	for p < n {
		p <<= 1
	}
	return p
}

// ---- completion queue ring ----

// cqSlot is one completion. The ring is a bounded multi-producer queue:
// a producer reserves position pos by moving the header's tail from pos
// to pos+1 (compare-and-swap), fills the slot, and publishes it by
// storing pos+1 in seq; the consumer takes the slot when seq says so and
// then frees it by moving the header's head past it. Only producers
// write a slot, so the line a consumer polls moves one way, producer to
// consumer; the consumer's head, on a line of its own, is read by a
// producer only when the ring looks full from its last reading
// (cqRing.seenHead). In a QP's
// receive completion ring, a completion names the receive it completes by
// its position in its queue (mod 2^32), not by a WRID: the owner takes
// the WRID from its own record of what it posted there (recvLog), and the
// QP is the ring's. A Send of at most inlineMax bytes travels in the
// slot itself (placed): the receiver's Poll copies it into the receive's
// buffers (qp.placeInline). The header takes 32 bytes of the slot's first
// cache line: a Send of at most 32 bytes fits in that line.
type cqSlot struct {
	seq     atomic.Uint64
	pos     uint32
	status  uint8
	opcode  uint8
	flags   uint8
	placed  uint8 // 1: the message is in inline, byteLen bytes of it
	byteLen uint32
	imm     uint32
	invRKey uint32
	srcQP   uint32
	inline  [inlineMax]byte
}

// inlineMax is the largest Send that travels in its receive completion
// rather than being copied into the receive's buffers by the sender: what
// fills a completion slot to two cache lines (see the package doc for
// why the receiver places small messages, and how far that pays).
const inlineMax = 96

const cqSlotSize = int(unsafe.Sizeof(cqSlot{}))

// A slot is two whole cache lines, and slots start on a 128-byte
// boundary (headerSize): one slot never shares a line with another.
var _ = [1]struct{}{}[cqSlotSize-128]

// cqRing is a view of a QP's receive completion ring, in the QP's block:
// its peer and its owner (flushing) add receive completions; the owner
// alone consumes, in Poll of the QP's receive CQ. (Send completions,
// which only the owner produces, go to the CQ's private localRing.) A
// CQ's own segment is a header (notifyRing), its arming and futex word,
// and then its doorbells (viewDoorbells).
type cqRing struct {
	h     *ringHeader
	slots []cqSlot
	mask  uint64
	head  uint64 // consumer position, private to the owner
	// taken is head as the consumer last published it, for the owner's
	// own produces (pushRecv), which must not believe the shared head a
	// peer can write; own says that this view is the owner's.
	taken atomic.Uint64
	own   bool
	// seenHead is the consumers' head as this view's producer last read
	// it (under the producer's lock: the peer's QP's, or the owner's):
	// the head only moves forward, so an old reading says there are at
	// least as many completions outstanding as there are.
	seenHead uint64
	// notifier is this side's notifier of the CQ (event.go), which a
	// notification sends a byte through (fire) to wake the owner's
	// notification goroutine, parked in Go's network poller; noNotifier
	// on a view that notifies no one (a QP's completion ring).
	notifier notifier
}

// initCQRing lays out a fresh CQ of n (a power of two) entries in mem.
func initCQRing(mem []byte, n int) *cqRing {
	h := header(mem)
	h.magic, h.entries, h.entrySize = ringMagic, uint32(n), uint32(cqSlotSize)
	r := viewCQRing(mem, n)
	r.own = true
	for i := range r.slots {
		r.slots[i].seq.Store(uint64(i))
	}
	return r
}

// notifyRing views a CQ's segment, a header with no slots: what peers
// use of it is its arming and futex word (notify).
func notifyRing(mem []byte) *cqRing {
	if len(mem) < headerSize {
		return nil
	}
	return &cqRing{h: header(mem), notifier: noNotifier}
}

// viewCQRing views a ring of n completions, n known from the owner's
// handshake.
func viewCQRing(mem []byte, n int) *cqRing {
	if n <= 0 || n&(n-1) != 0 || len(mem) < ringSize(n, cqSlotSize) {
		return nil
	}
	slots := unsafe.Slice((*cqSlot)(unsafe.Pointer(&mem[headerSize])), n)
	return &cqRing{h: header(mem), slots: slots, mask: uint64(n - 1), notifier: noNotifier}
}

// maxProduceTries bounds a producer's retries, so that a peer scribbling
// on the ring makes completions fail (an overrun) instead of a hang.
const maxProduceTries = 1 << 12

// produce adds a completion, carrying the message payload inline if it is
// not nil (at most inlineMax bytes); false if the ring is full (or
// corrupt). The producer reads no slot: whether the one it reserves is
// free it knows from the consumers' head, read again only when its last
// reading (seenHead) leaves no room. The owner's view reads the head the
// consumer keeps for it (taken) instead of the shared one, which a peer
// may have written: a lying head would otherwise have the owner write
// over completions not yet taken.
func (r *cqRing) produce(wc *driver.WorkCompletion, payload *sglist.List) bool {
	for range maxProduceTries {
		pos := r.h.tail.Load()
		if pos-r.seenHead > r.mask {
			r.seenHead = r.consumed()
			switch d := pos - r.seenHead; {
			case int64(d) < 0:
				continue // taken past the tail read: read it again
			case d > r.mask:
				return false // full, or a head that makes no sense
			}
		}
		if !r.h.tail.CompareAndSwap(pos, pos+1) {
			continue
		}
		r.slots[pos&r.mask].publish(wc, payload, pos)
		return true
	}
	return false
}

// produceOwn is produce for the ring's only producer (cq.addSender),
// whose lock orders its produces: the slot is free (the consumer reads
// none before its seq says so), so it is filled first, and then release
// stores reserve and publish it. The slots hold the QP's number already
// (ownedBy).
func (r *localRing) produceOwn(retire, wrid uint64, st driver.WCStatus, op driver.WCOpcode, n uint32) bool {
	pos := r.tail.Load()
	s := r.at(pos)
	if s.seq.Load() != pos {
		return false // full
	}
	s.wc.WRID, s.wc.Status, s.wc.Opcode, s.wc.ByteLen, s.retire = wrid, st, op, n, retire
	pos++
	atomicrel.StoreUint64(&r.tail, pos)
	atomicrel.StoreUint64(&s.seq, pos)
	return true
}

// ownedBy writes the number of the ring's first producer into every slot,
// before that QP can produce: while it is the only one, produceOwn need
// not. (A second producer's produce writes its number in each slot it
// fills, and so does the first's from then on.)
func (r *localRing) ownedBy(qpNum uint32) {
	for i := range r.slots {
		r.slots[i].wc.QPNum = qpNum
	}
}

// consumed is the consumer's head, as a producer of this view may
// believe it.
func (r *cqRing) consumed() uint64 {
	if r.own {
		return r.taken.Load()
	}
	return r.h.head.Load()
}

// pending reports whether completions have been reserved in the ring
// that the consumer has not taken; with solicitedOnly, whether one of
// them is solicited or failed. The consumer's lock is held.
//
// Producers publish a slot with a release store and then check the CQ's
// arming, a check that may be performed before the store is visible; the
// arming side calls pending after it arms, and notifies if it reports
// true. A slot reserved before the arming is seen here in tail (the
// producer's CAS and the arming's swap are locked instructions, totally
// ordered); one reserved after it is followed by a check that sees the
// arming. Such a producer has executed its publishing store, which a
// processor makes visible within nanoseconds, so pending waits for a
// reserved slot only briefly (publishWait): a slot that a peer reserved
// and never published, or indices that make no sense, are not pending —
// a peer scribbling on the ring must not keep waiters from sleeping. (A
// producer still short of its store checks the arming after it, and so
// sees it.)
func (r *cqRing) pending(solicitedOnly bool) bool {
	tail := r.h.tail.Load()
	if tail == r.head || tail-r.head > r.mask+1 {
		return false
	}
	waited := false
	for pos := r.head; pos != tail; pos++ {
		s := &r.slots[pos&r.mask]
		if s.seq.Load() != pos+1 {
			if waited || !awaitPublished(&s.seq, pos+1, publishWait) {
				return false // Poll takes slots in order: none after this one
			}
			waited = true
		}
		if !solicitedOnly || s.flags&uint8(driver.WCSolicited) != 0 || s.status != uint8(driver.WCSuccess) {
			return true
		}
	}
	return false
}

// publishWait bounds how long pending waits for a reserved slot to be
// published: yields of the processor.
const publishWait = 64

// awaitPublished waits until the sequence word seq reads want — a slot
// reserved whose producer has yet to publish it — yielding in between, at
// most tries times (0: until it does); false if it never did.
func awaitPublished(seq *atomic.Uint64, want uint64, tries int) bool {
	for i := 0; tries == 0 || i < tries; i++ {
		if seq.Load() == want {
			return true
		}
		runtime.Gosched()
	}
	return false
}

// publish fills the slot reserved at pos with wc, and payload if it is
// not nil, and publishes it with a release store (see pending for the
// notification handshake that leaves to the arming side).
func (s *cqSlot) publish(wc *driver.WorkCompletion, payload *sglist.List, pos uint64) {
	s.placed = 0
	if payload != nil {
		s.placed = 1
		if payload.N() == 1 {
			copy(s.inline[:], payload.Seg(0))
		} else {
			b := s.inline[:]
			for i := range payload.N() {
				b = b[copy(b, payload.Seg(i)):]
			}
		}
	}
	s.pos, s.status, s.opcode, s.flags = uint32(wc.WRID), uint8(wc.Status), uint8(wc.Opcode), uint8(wc.Flags)
	s.byteLen, s.imm, s.invRKey, s.srcQP = wc.ByteLen, wc.Imm, wc.InvalidatedRKey, wc.SrcQP
	atomicrel.StoreUint64(&s.seq, pos+1)
}

// ready reports whether a completion waits to be taken.
func (r *cqRing) ready() bool { return r.slots[r.head&r.mask].seq.Load() == r.head+1 }

// take takes the oldest completion, which ready said is there, dropping
// any payload it carries.
func (r *cqRing) take(wc *driver.WorkCompletion) {
	r.peek(wc)
	r.release()
}

// peek reads the oldest completion, which ready said is there, into wc
// and returns its slot, which stays the consumer's, its payload with it,
// until release.
func (r *cqRing) peek(wc *driver.WorkCompletion) *cqSlot {
	s := &r.slots[r.head&r.mask]
	*wc = driver.WorkCompletion{WRID: uint64(s.pos), Status: driver.WCStatus(s.status), Opcode: driver.WCOpcode(s.opcode),
		Flags: driver.WCFlags(s.flags), ByteLen: s.byteLen, Imm: s.imm, InvalidatedRKey: s.invRKey, SrcQP: s.srcQP}
	sanitizeRecv(wc)
	return s
}

// release hands the slot peek returned back to the producers: the
// peer's, through the shared head, and the owner's, through taken.
// (Release stores: the slot has been read before either is seen.)
func (r *cqRing) release() {
	r.head++
	atomicrel.StoreUint64(&r.h.head, r.head)
	atomicrel.StoreUint64(&r.taken, r.head)
}

// sanitizeRecv makes a receive completion read from the shared ring,
// which peers write, say only what a receive completion of shm0 can say:
// a known status; the opcode of a Send or a Write with immediate; only
// the immediate, solicited and invalidation flags;
// and, for a success, no more bytes than a message may have. A
// completion that breaks the last two is returned as a failure with no
// byte count. (That a Send's byte count fits the buffers the receive
// posted, and that the receive was posted at all, the owner checks
// against its own record: qp.acceptRecv.)
func sanitizeRecv(wc *driver.WorkCompletion) {
	if wc.Status > driver.WCGeneralErr {
		wc.Status = driver.WCGeneralErr
	}
	wc.Flags &= driver.WCWithImm | driver.WCSolicited | driver.WCWithInv // WCWithInv: see qp.checkInvalidated
	if wc.Flags&driver.WCWithInv == 0 {
		wc.InvalidatedRKey = 0
	}
	if wc.Opcode != driver.WCRecv && wc.Opcode != driver.WCRecvRDMAWithImm {
		wc.Opcode, wc.ByteLen = driver.WCRecv, 0
		if wc.Status == driver.WCSuccess {
			wc.Status = driver.WCGeneralErr
		}
	}
	if wc.Status == driver.WCSuccess && uint64(wc.ByteLen) > deviceAttr.MaxMsgSize {
		wc.Status, wc.ByteLen = driver.WCGeneralErr, 0
	}
}

// localRing is a CQ's private queue of the send completions its own
// process's QPs produce: no peer can write it, so nothing read from it
// needs checking, and each entry names its QP, so that polling it frees
// the send slot without a lookup. A bounded multi-producer queue like
// cqRing (QPs sharing a CQ post concurrently); the CQ's poller consumes.
//
// Its producers publish with a release store, as cqRing's do, and pending
// closes the notification handshake in the same way (cqRing.pending).
type localRing struct {
	tail  atomic.Uint64
	_     [7]uint64
	slots []localSlot
	mask  uint64
	head  uint64 // the consumer's position, under cq.mu
}

// localSlot is a send completion, its QP (nil while the CQ has one
// sending QP: cq.firstSender), and the send slot it frees. Send
// completions say nothing beyond WRID, Status, Opcode, ByteLen and QPNum:
// produce writes those and the rest stays zero.
type localSlot struct {
	seq    atomic.Uint64
	wc     driver.WorkCompletion
	q      *qp
	retire uint64 // the send slot the completion frees
}

// at returns the slot of position pos. (slots holds mask+1 of them, so
// that pos&mask indexes it: no bounds check is needed.)
func (r *localRing) at(pos uint64) *localSlot {
	return (*localSlot)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(r.slots)), uintptr(pos&r.mask)*unsafe.Sizeof(localSlot{})))
}

func newLocalRing(n int) *localRing {
	r := &localRing{slots: make([]localSlot, n), mask: uint64(n - 1)}
	for i := range r.slots {
		r.slots[i].seq.Store(uint64(i))
	}
	return r
}

// produce adds the completion of q's send slot retire, of the WR wrid,
// with st, op and n bytes; false if the ring is full. The QP is recorded
// only once the CQ is shared: until then, every completion is its first
// sender's.
func (r *localRing) produce(q *qp, retire, wrid uint64, st driver.WCStatus, op driver.WCOpcode, n uint32, shared bool) bool {
	if !shared {
		return r.produceOwn(retire, wrid, st, op, n)
	}
	for {
		pos := r.tail.Load()
		s := &r.slots[pos&r.mask]
		switch d := int64(s.seq.Load() - pos); {
		case d > 0:
			continue // another producer took it
		case d != 0:
			return false // full
		}
		if !r.tail.CompareAndSwap(pos, pos+1) {
			continue
		}
		s.q = q
		w := &s.wc
		w.WRID, w.Status, w.Opcode, w.ByteLen, w.QPNum = wrid, st, op, n, q.num
		s.retire = retire
		atomicrel.StoreUint64(&s.seq, pos+1)
		return true
	}
}

// pending reports whether completions have been reserved that the
// consumer has not taken, published or not yet; with failedOnly, whether
// one of them failed, waiting for those not yet published. The
// consumer's lock is held.
func (r *localRing) pending(failedOnly bool) bool {
	tail := r.tail.Load()
	if !failedOnly {
		return tail != r.head
	}
	for pos := r.head; pos != tail; pos++ {
		s := &r.slots[pos&r.mask]
		// Its producer, in this process, publishes it soon.
		if awaitPublished(&s.seq, pos+1, 0) && s.wc.Status != driver.WCSuccess {
			return true
		}
	}
	return false
}

// take takes the oldest completion into wc, if one is published, and
// returns the QP (nil: the CQ's first sender) and send slot it retires;
// ok is false if there is none. It inlines.
func (r *localRing) take(wc *driver.WorkCompletion) (q *qp, retire uint64, ok bool) {
	pos := r.head
	s := &r.slots[pos&r.mask]
	if s.seq.Load() != pos+1 {
		return nil, 0, false
	}
	*wc = s.wc
	q, retire = s.q, s.retire
	if q != nil {
		s.q = nil
	}
	atomicrel.StoreUint64(&s.seq, pos+r.mask+1)
	r.head = pos + 1
	return q, retire, true
}

// Notification arming values of ringHeader.armed.
const (
	unarmed = iota
	armedAny
	armedSolicited
)

// notify wakes the owner's waiter if the CQ is armed for this completion.
// It makes a system call only when a waiter asked for one.
func (r *cqRing) notify(solicited, failed bool) {
	if a := r.h.armed.Load(); a != unarmed {
		r.notifyArmed(a, solicited, failed) // out of line: notify inlines
	}
}

// notifyArmed is notify for a CQ armed as a.
//
//go:noinline
func (r *cqRing) notifyArmed(a uint32, solicited, failed bool) {
	if a == armedAny || (a == armedSolicited && (solicited || failed)) {
		r.fire(a)
	}
}

// fire disarms the CQ, if it is still armed as a, and wakes its waiters:
// threads asleep on the futex word (CQ.Wait's own sleep) and the
// notification goroutine, through its socket. Each waiter says it
// waits before it looks at the word, and fire looks for waiters after
// it bumps the word, so a waiter either sees the bump and does not wait
// or is seen and woken. (A peer that clears these words delays the
// owner's waiters by their bound: the sleep's own limit, notifyRecheck.)
func (r *cqRing) fire(a uint32) {
	if r.h.armed.CompareAndSwap(a, unarmed) {
		r.h.wake.Add(1)
		if r.h.sleepers.Load() != 0 {
			futexWake(&r.h.wake)
		}
		if r.h.eventWaiter.Load() != 0 {
			r.notifier.send()
		}
	}
}

// ---- receive rings (QP receive queues and SRQs) ----

// A receive entry: wrid (8), SGE count (4), sequence (4), then SGEs of
// address (8), length (4) and lkey (4). The producer publishes the entry
// at position pos by storing pos+1 (mod 2^32) in its sequence, so that a
// consumer reads the entry's cache line alone, not the producer's tail as
// well (the tail is kept for the owner's own accounting).
const (
	recvEntryHeader = 16
	sgeSize         = 16
)

func recvEntrySize(maxSGE int) int { return recvEntryHeader + sgeSize*max(maxSGE, 1) }

// recvEntry is a receive read out of a ring: its position, and its SGEs.
// (The entry's first word, where a WRID would be, is left zero: the WRID
// stays in the owner's recvLog.)
type recvEntry struct {
	pos uint64
	n   int
	sge [maxSGE]driver.SGE
}

// recvRing is a view of a receive queue: the owner produces; consumers —
// the peers whose Sends land in it, and the owner when it flushes — claim
// published entries with a CAS on head.
type recvRing struct {
	h         *ringHeader
	mem       []byte
	mask      uint64
	entrySize int
	maxSGE    int
	// seenHead is the consumers' head as the producer last read it,
	// under the producer's lock: reading the shared head for every post
	// would pull its cache line away from the consumer that moves it.
	seenHead uint64
	// polled is, for a QP's own queue, one past the position of the
	// last receive whose completion Poll took: consumers claim receives
	// in order, so the head is at least there. A queue kept full (each
	// receive posted again as its message is polled) knows its room from
	// it, not from the shared head, whose line every Send writes.
	polled atomic.Uint64
	// The owner's view only: its own record of the receives posted, and
	// its own tail (the shared one is for the peers' accounting).
	log  *recvLog
	tail uint64
}

// initRecvRing lays out a fresh receive queue of n entries of sges SGEs
// in mem, for its owner, whose record of it holds logN positions.
func initRecvRing(mem []byte, n, sges, logN int) *recvRing {
	h := header(mem)
	h.magic, h.entries, h.entrySize = ringMagic, uint32(n), uint32(recvEntrySize(sges))
	r := viewRecvRing(mem, n, sges)
	r.log = newRecvLog(logN)
	return r
}

// recvLog is the owner's private record of the receives posted to a
// queue, by position: what a receive completion names is checked
// against it, and its WRID and length come from it, never from memory a
// peer can write. A record is live from its PostRecv until Poll takes
// its completion (which may be long after a Send consumed the receive
// and freed its place in the ring); state holds the position plus one
// while live, 0 when free. A receive is posted only where the record of
// the position as many places back as the log holds is free. Several
// Polls may take completions of one SRQ at once (QPs on it may use
// different CQs): a record is claimed with a CAS of its state.
//
// A record holds the receive's buffers too, if it has at most recSGEs of
// them: a Send that travels inline in its completion is placed there by
// the Poll that takes it, and only into the buffers recorded here.
type recvLog struct {
	recs []recvRec
	mask uint64
}

// recSGEs is the number of buffers a receive may have for a Send to be
// placed into it inline; a receive with more gets its Sends copied into
// its buffers by the sender.
const recSGEs = 2

// recvRec is one record, a cache line. Its fields other than state are
// written by the poster before its release store of state, and read by
// the taker before its release store of state back to 0.
type recvRec struct {
	state  atomic.Uint64
	wrid   atomic.Uint64
	length atomic.Uint64
	nsge   uint32 // buffers in sge; recSGEs+1 if the receive has more
	_      uint32
	sge    [recSGEs]driver.SGE
}

// recTaking is a record's state while an SRQ's Poll reads it (claim).
const recTaking = ^uint64(0)

func newRecvLog(n int) *recvLog {
	return &recvLog{recs: make([]recvRec, n), mask: uint64(n - 1)}
}

// claim returns the live record of the position pos mod 2^32 (what a
// completion slot holds), for its caller to read and then free
// (release); nil if no receive is posted there that is not yet taken.
// (The record of a position is the one of every position 2^32 apart, the
// log being smaller: the record alone says which receive it is.) Unless
// shared, its caller is the queue's only taker: the Poll of a QP's own
// receive queue. An SRQ's QPs may complete into different CQs, polled at
// once: shared claims the record with a CAS.
func (l *recvLog) claim(pos uint64, shared bool) *recvRec {
	r := &l.recs[pos&l.mask]
	st := r.state.Load()
	if st == 0 || st == recTaking || uint32(st-1) != uint32(pos) {
		return nil
	}
	if shared && !r.state.CompareAndSwap(st, recTaking) {
		return nil
	}
	return r
}

// release frees a record claim returned: its position may take a
// receive again.
func (r *recvRec) release() { atomicrel.StoreUint64(&r.state, 0) }

// viewRecvRing views a receive ring of n entries of sges SGEs each, or
// returns nil if those cannot describe a ring in mem (n, sges and mem may
// come from a peer).
func viewRecvRing(mem []byte, n, sges int) *recvRing {
	if n <= 0 || n&(n-1) != 0 || sges < 0 || sges > maxSGE || len(mem) < ringSize(n, recvEntrySize(sges)) {
		return nil
	}
	return &recvRing{h: header(mem), mem: mem, mask: uint64(n - 1), entrySize: recvEntrySize(sges), maxSGE: sges}
}

func (r *recvRing) entry(pos uint64) []byte {
	off := headerSize + int(pos&r.mask)*r.entrySize
	return r.mem[off : off+r.entrySize]
}

// seq is the sequence word of entry e.
func seq(e []byte) *atomic.Uint32 { return (*atomic.Uint32)(unsafe.Pointer(&e[12])) }

// count is the number of posted receives not yet consumed, as far as the
// shared indices can be believed.
func (r *recvRing) count() uint64 {
	n := r.h.tail.Load() - r.h.head.Load()
	if n > r.mask+1 {
		return 0
	}
	return n
}

// produce posts a receive if fewer than limit (at most the ring's size)
// are posted and not consumed, and the record of its position is free
// (its last receive's completion taken), and records it in the log; the
// caller (the owner) serialises producers.
func (r *recvRing) produce(wr *driver.RecvWR, limit uint64) bool {
	t := r.tail
	rec := &r.log.recs[t&r.log.mask]
	if rec.state.Load() != 0 {
		return false
	}
	// The head only moves forward, so an old reading says there are at
	// least as many outstanding as there are: read it again only when
	// that looks like too many (or like nonsense: after a reset, or if
	// a peer wrote the head).
	if t-r.seenHead >= limit {
		if p := r.polled.Load(); p-r.seenHead <= t-r.seenHead {
			r.seenHead = p
		}
	}
	if t-r.seenHead >= limit {
		r.seenHead = r.h.head.Load()
		if t-r.seenHead >= limit || t-r.seenHead > r.mask { // full, or a corrupt head
			return false
		}
	}
	e := r.entry(t)
	binary.LittleEndian.PutUint64(e[0:], 0)
	binary.LittleEndian.PutUint32(e[8:], uint32(len(wr.SGList)))
	var length uint64
	for i, g := range wr.SGList {
		s := e[recvEntryHeader+i*sgeSize:]
		binary.LittleEndian.PutUint64(s[0:], g.Addr)
		binary.LittleEndian.PutUint32(s[8:], g.Length)
		binary.LittleEndian.PutUint32(s[12:], g.LKey)
		length += uint64(g.Length)
		if i < recSGEs {
			rec.sge[i] = g
		}
	}
	rec.nsge = uint32(min(len(wr.SGList), recSGEs+1))
	atomicrel.StoreUint64(&rec.wrid, wr.WRID)
	atomicrel.StoreUint64(&rec.length, length)
	atomicrel.StoreUint64(&rec.state, t+1)
	r.tail = t + 1
	// Release stores: the entry is published by its sequence word, and
	// nothing waits for either store to be seen.
	atomicrel.StoreUint32(seq(e), uint32(t+1))
	atomicrel.StoreUint64(&r.h.tail, t+1)
	return true
}

// headCorrupt reports whether the consumers' head, which peers write,
// cannot be right: ahead of the owner's tail, or more than a ring's
// worth behind it. Honest consumers claim only published entries, so
// the head never passes the tail. The caller (the owner) serialises
// producers.
func (r *recvRing) headCorrupt() bool {
	return r.tail-r.h.head.Load() > r.mask+1
}

// consume claims the oldest receive into out. It reports ok false when
// the queue is empty (the entry at head is not published), and errGarbage
// when the entry cannot be right or the head keeps moving under it.
func (r *recvRing) consume(out *recvEntry) (bool, error) {
	for range maxProduceTries {
		h := r.h.head.Load()
		e := r.entry(h)
		if seq(e).Load() != uint32(h+1) {
			return false, nil
		}
		out.pos = h
		n := binary.LittleEndian.Uint32(e[8:])
		if n > uint32(r.maxSGE) {
			return false, errGarbage
		}
		out.n = int(n)
		for i := range out.n {
			s := e[recvEntryHeader+i*sgeSize:]
			out.sge[i] = driver.SGE{Addr: binary.LittleEndian.Uint64(s[0:]), Length: binary.LittleEndian.Uint32(s[8:]), LKey: binary.LittleEndian.Uint32(s[12:])}
		}
		if r.h.head.CompareAndSwap(h, h+1) {
			return true, nil
		}
	}
	return false, errGarbage
}

// ---- key table ----

// keySlot describes one registered region to peers. ver is a sequence
// lock: odd while the owner changes the slot.
type keySlot struct {
	ver    atomic.Uint32
	key    atomic.Uint32
	access atomic.Uint32
	kind   atomic.Uint32
	segID  atomic.Uint32
	pd     atomic.Uint32
	segOff atomic.Uint64
	addr   atomic.Uint64
	length atomic.Uint64
	_      [2]uint64
}

const keySlotSize = int(unsafe.Sizeof(keySlot{}))

// Region kinds.
const (
	kindNone    = 0
	kindSegment = 1 // inside a memfd segment the peer can map
	kindProcess = 2 // ordinary process memory: process_vm_readv/writev
)

// keyInfo is a consistent copy of a key slot.
type keyInfo struct {
	ver    uint32
	key    uint32
	access driver.AccessFlags
	kind   uint32
	segID  uint32
	pd     uint32
	segOff uint64
	addr   uint64
	length uint64
}

// keyTable views a key table: slots of the keys by their index
// (keytab.Index), each at a position turned by the table's rotation. A
// QP's grant table turns by its QP number (grantRotation), so that the
// slot of one region, which has the same index in every grant table,
// lies at a different offset of each: a requester that goes round a
// thousand connections would otherwise find every one of their slots on
// the same few cache sets (the tables start on page boundaries), and
// miss the cache on each.
type keyTable struct {
	slots []keySlot
	rot   uint32
	// epoch: the grant epoch word of the connection the table answers
	// (epoch.go), moved on after every write of the table; nil if none.
	// Set by its owner under grantMu.
	epoch *atomic.Uint64
}

// viewKeyTable views the n slots in mem (n a power of two), turned by
// rot; nil if mem is too short.
func viewKeyTable(mem []byte, n int, rot uint32) *keyTable {
	if len(mem) < n*keySlotSize {
		return nil
	}
	return &keyTable{slots: unsafe.Slice((*keySlot)(unsafe.Pointer(&mem[0])), n), rot: rot}
}

// grantRotation is the rotation of the grant table of the QP numbered
// qpn: its number's bits spread over the slots, by the multiplicative
// hash, so that consecutive QPs' tables turn far apart.
func grantRotation(qpn uint32) uint32 { return qpn * 0x9e3779b1 >> (32 - keytab.IndexBits) }

// slot is the slot of index idx.
func (t *keyTable) slot(idx uint32) *keySlot {
	return &t.slots[(idx+t.rot)&uint32(len(t.slots)-1)]
}

// publish writes slot idx (owner only, serialised by the owner).
func (t *keyTable) publish(idx uint32, k keyInfo) {
	s := t.slot(idx)
	s.ver.Add(1)
	s.key.Store(k.key)
	s.access.Store(uint32(k.access))
	s.kind.Store(k.kind)
	s.segID.Store(k.segID)
	s.pd.Store(k.pd)
	s.segOff.Store(k.segOff)
	s.addr.Store(k.addr)
	s.length.Store(k.length)
	s.ver.Add(1)
	if t.epoch != nil {
		t.epoch.Add(1)
	}
}

// revoke invalidates slot idx.
func (t *keyTable) revoke(idx uint32) { t.publish(idx, keyInfo{}) }

// touch moves the table's epoch on, its slots unchanged: a requester
// that kept the epoch (its fastPath) finds it changed, and checks the
// owner's QP again. The owner touches its grant table whenever its QP's
// header changes (qp.publish). Owner only, serialised by the owner.
func (t *keyTable) touch() {
	if t.epoch != nil {
		t.epoch.Add(1)
	}
}

// lookup reads the slot of key consistently; false if the key is not
// registered there (or the slot keeps changing under the reader).
func (t *keyTable) lookup(key uint32) (keyInfo, bool) {
	idx := keytab.Index(key)
	if int(idx) >= len(t.slots) {
		return keyInfo{}, false
	}
	s := t.slot(idx)
	for range 64 {
		v := s.ver.Load()
		if v&1 != 0 {
			continue
		}
		k := keyInfo{ver: v, key: s.key.Load(), access: driver.AccessFlags(s.access.Load()), kind: s.kind.Load(),
			segID: s.segID.Load(), pd: s.pd.Load(), segOff: s.segOff.Load(), addr: s.addr.Load(), length: s.length.Load()}
		if s.ver.Load() != v {
			continue
		}
		if k.key != key || k.kind == kindNone {
			return keyInfo{}, false
		}
		return k, true
	}
	return keyInfo{}, false
}

// current reports whether k, read by lookup, is still what its slot says:
// the slot's sequence lock has not moved since.
func (t *keyTable) current(k *keyInfo) bool {
	return t.slot(keytab.Index(k.key)).ver.Load() == k.ver
}

// span checks that [addr, addr+n) lies in the region and returns its
// offset from the region's start.
func (k *keyInfo) span(addr, n uint64) (uint64, bool) {
	if addr < k.addr {
		return 0, false
	}
	off := addr - k.addr
	if off > k.length || n > k.length-off {
		return 0, false
	}
	return off, true
}
