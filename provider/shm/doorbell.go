package shm

import (
	"math/bits"
	"sync/atomic"
	"unsafe"
)

// Doorbells tell Poll which of a CQ's QPs have receive completions
// waiting, so that a CQ shared by many QPs looks only at those rather
// than at every QP's ring (each in a mapping of its own: a cache and TLB
// miss per QP).
//
// They live in the CQ's segment, after its header, which the peers of
// its QPs map writable: a bitmap of bellBits bells, and a summary word
// set whose bit j says that bitmap word j may have a bell set. The
// producer of a completion into a QP's ring (the peer, or the owner
// flushing) rings the QP's bell after publishing it: bit (QP number mod
// bellBits), which both sides know from the connection. Poll clears the
// bells it finds and then looks at their QPs' rings: a bell rung after
// the clear stays set for the next Poll, and a completion published
// before it is seen by the look that follows the clear.
//
// Bells are hints. A bell shared by two QPs (numbers bellBits apart)
// makes Poll look at both; a bell rung for nothing costs a look, and one
// of no QP of the CQ is dropped unlooked (a peer may ring them all: a
// look at the bells costs at most bellWords words then). A peer that
// does not ring, or clears others' bells (it can write the whole
// segment), delays completions, never loses them: every bellSweep empty
// looks Poll looks at every ring, and so does arming the CQ (recvPending).
const (
	bellBits     = 1 << 14
	bellWords    = bellBits / 64
	summaryWords = bellWords / 64
	bellsSize    = (summaryWords + bellWords) * 8
	// cqSegSize is the size of a CQ's segment: its header (arming and
	// futex word) and the doorbells.
	cqSegSize = headerSize + bellsSize
	// bellSweep is how many empty looks at the bells pass between looks
	// at every ring.
	bellSweep = 4096
	// bellMinQPs: a CQ of at most this many receiving QPs looks at their
	// rings directly, cheaper than the bells' clear and look-up.
	bellMinQPs = 8
)

// doorbells views the doorbells of a CQ's segment.
type doorbells struct {
	summary *[summaryWords]atomic.Uint64
	words   *[bellWords]atomic.Uint64
}

// viewDoorbells views the doorbells in a CQ's segment mem; the zero
// doorbells (which ring nothing) if mem is too short.
func viewDoorbells(mem []byte) doorbells {
	if len(mem) < cqSegSize {
		return doorbells{}
	}
	return doorbells{
		summary: (*[summaryWords]atomic.Uint64)(unsafe.Pointer(&mem[headerSize])),
		words:   (*[bellWords]atomic.Uint64)(unsafe.Pointer(&mem[headerSize+summaryWords*8])),
	}
}

// bellOf is the bell of the QP numbered qpn.
func bellOf(qpn uint32) uint32 { return qpn % bellBits }

// ring rings bell b, after the completion it announces is published. A
// bell or summary bit already set is left alone: a load, not a locked
// instruction, when Poll has not yet taken the last ring.
func (d doorbells) ring(b uint32) {
	if d.words == nil {
		return
	}
	w, m := b/64, uint64(1)<<(b%64)
	if d.words[w].Load()&m == 0 {
		d.words[w].Or(m)
	}
	s, sm := w/64, uint64(1)<<(w%64)
	if d.summary[s].Load()&sm == 0 {
		d.summary[s].Or(sm)
	}
}

// take clears the bells that are set and calls f with each of those
// valid has set; it reports whether it called f.
func (d doorbells) take(valid *[bellWords]uint64, f func(b uint32)) bool {
	found := false
	for s := range d.summary {
		sv := d.summary[s].Load()
		if sv == 0 {
			continue
		}
		d.summary[s].And(^sv)
		for sv != 0 {
			j := bits.TrailingZeros64(sv)
			sv &= sv - 1
			w := s*64 + j
			wv := d.words[w].Swap(0) & valid[w]
			for wv != 0 {
				found = true
				i := bits.TrailingZeros64(wv)
				wv &= wv - 1
				f(uint32(w*64 + i))
			}
		}
	}
	return found
}

// recvBells is the CQ's side of the doorbells: which of its QPs
// (positions in recvQPs) each bell stands for, and the queue of QPs whose
// bells rang, in the order Poll takes from them. Guarded by the CQ's mu.
type recvBells struct {
	first  map[uint32]int32 // bell -> the first QP with it; next, the others
	next   []int32
	valid  *[bellWords]uint64 // the bells of the CQ's QPs
	queue  []int32            // a ring of len(recvQPs) QPs; queued, which are in it
	queued []bool
	head   int
	n      int
	empty  int // empty looks since the last sweep
	takeFn func(b uint32)
}

// reset indexes the bells of qps and queues every QP, so that nothing
// waiting is missed after the QPs changed.
func (r *recvBells) reset(qps []*qp) {
	clear(r.first)
	if r.first == nil {
		r.first = map[uint32]int32{}
		r.valid = new([bellWords]uint64)
	}
	clear(r.valid[:])
	n := len(qps)
	r.next = resize(r.next, n)
	r.queue = resize(r.queue, n)
	r.queued = resize(r.queued, n)
	for k := n - 1; k >= 0; k-- {
		b := bellOf(qps[k].num)
		r.valid[b/64] |= 1 << (b % 64)
		r.next[k] = -1
		if f, ok := r.first[b]; ok {
			r.next[k] = f
		}
		r.first[b] = int32(k)
	}
	r.head, r.n, r.empty = 0, 0, 0
	r.sweep()
}

func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}

// sweep queues every QP.
func (r *recvBells) sweep() {
	for k := range r.queued {
		r.push(int32(k))
	}
}

// push queues QP k, unless it is queued already.
func (r *recvBells) push(k int32) {
	if r.queued[k] {
		return
	}
	r.queued[k] = true
	r.queue[(r.head+r.n)%len(r.queue)] = k
	r.n++
}

// pop takes the QP at the head of the queue; false if it is empty.
func (r *recvBells) pop() (int32, bool) {
	if r.n == 0 {
		return 0, false
	}
	k := r.queue[r.head]
	r.queued[k] = false
	if r.head++; r.head == len(r.queue) {
		r.head = 0
	}
	r.n--
	return k, true
}

// rang queues the QPs of bell b.
func (r *recvBells) rang(b uint32) {
	k, ok := r.first[b]
	for ok && k >= 0 {
		r.push(k)
		k = r.next[k]
	}
}

// refill queues the QPs whose bells rang, or, every bellSweep empty
// looks, every QP; false if it queued none.
func (r *recvBells) refill(d doorbells) bool {
	if r.takeFn == nil {
		r.takeFn = r.rang
	}
	if d.take(r.valid, r.takeFn) && r.n > 0 {
		return true
	}
	if r.empty++; r.empty < bellSweep {
		return false
	}
	r.empty = 0
	r.sweep()
	return r.n > 0
}
