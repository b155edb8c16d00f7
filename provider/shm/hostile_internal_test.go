package shm

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/internal/grant"
	"github.com/goverbs/goverbs/internal/keytab"
	"github.com/goverbs/goverbs/verbs"
	"github.com/goverbs/goverbs/verbs/verbstest"
)

// A hostile peer writes garbage into every shared word it can write —
// its own segments, which the victim maps (its QP block: receive ring and
// state, access and attributes; its SRQ; its receive CQ, into which the
// victim writes; its key table), and the victim's segments it maps
// writable (the victim's QP block and receive CQ) — while the victim keeps
// posting Sends, Writes (with and without immediate), Reads and atomics
// and polling. Every value the victim reads from shared memory is checked
// before use: the victim never panics (a panic ends the test binary),
// every call returns in bounded time, and the canaries around the
// victim's regions and a private region of the victim are untouched.
//
// Attacker and victim share this process, so the attacker leaves the key
// table's region kind alone when it would name process memory: with both
// ends in one process, process_vm_writev to the peer is a write into this
// process, which a real attacker in another process can only aim at
// itself (the peer's PID comes from the kernel, SO_PEERCRED — see
// TestHandshakeForgedPID).

// callBound bounds each data-path call of the victim: a requester waits
// at most 2 s for a segment the peer never sends.
const callBound = 3 * time.Second

// attacker scribbles on shared memory.
type attacker struct {
	rng      *rand.Rand
	mode     int      // what it aims at: one of the scribble* constants
	recvs    [][]byte // receive rings (QP blocks, SRQs): header at 0
	cqs      [][]byte // CQ rings: header at 0
	keyMem   []byte   // its key table
	keys     []uint32 // valid keys of its regions
	segIDs   []uint32 // its segment ids
	pdID     uint32
	regAddr  uint64
	writes   *atomic.Int64
	segments [][]byte // everything above
}

// What an attacker aims at, round by round.
const (
	scribbleKeys    = iota // key table: plausible slots with wrong places and sizes
	scribbleRecv           // receive rings: indices and entries
	scribbleCQ             // CQ rings: indices, slots, arming
	scribbleHeaders        // the QP block's state, access, attributes, PD
	scribbleAll            // anything, anywhere
	scribbleModes
)

func u32(b []byte, off int, v uint32) {
	if off >= 0 && off+4 <= len(b) {
		binary.LittleEndian.PutUint32(b[off:], v)
	}
}

func u64(b []byte, off int, v uint64) {
	if off >= 0 && off+8 <= len(b) {
		binary.LittleEndian.PutUint64(b[off:], v)
	}
}

// near returns a value near cur: a small step either way, a step of about
// a ring's size, or anything.
func (a *attacker) near(cur uint64) uint64 {
	switch a.rng.IntN(6) {
	case 0:
		return a.rng.Uint64()
	case 1:
		return 0
	case 2:
		return cur + uint64(a.rng.IntN(4096))
	case 3:
		return cur - uint64(a.rng.IntN(8))
	default:
		return cur + uint64(a.rng.IntN(8))
	}
}

func (a *attacker) key() uint32 {
	if len(a.keys) > 0 && a.rng.IntN(4) != 0 {
		return a.keys[a.rng.IntN(len(a.keys))]
	}
	return a.rng.Uint32()
}

func (a *attacker) pick(rings [][]byte) []byte { return rings[a.rng.IntN(len(rings))] }

// scribble makes one hostile write.
func (a *attacker) scribble() {
	a.writes.Add(1)
	mode := a.mode
	if mode == scribbleAll {
		mode = a.rng.IntN(scribbleAll + 1)
	}
	switch mode {
	case scribbleKeys:
		a.scribbleKey()
	case scribbleRecv:
		r := a.pick(a.recvs)
		h := header(r)
		switch a.rng.IntN(6) {
		case 0:
			h.tail.Store(a.near(h.head.Load()))
		case 1:
			h.head.Store(a.near(h.tail.Load()))
		case 2:
			h.state.Store(uint32(a.rng.IntN(300))) // an SRQ's limit
		default: // an entry: a plausible SGE, or garbage
			if len(r) < headerSize+32 {
				return
			}
			off := headerSize + 16*a.rng.IntN((len(r)-headerSize)/16)
			switch a.rng.IntN(3) {
			case 0:
				u32(r, off, uint32(a.rng.IntN(maxSGE+3))) // an SGE count
			case 1:
				u64(r, off, a.regAddr+uint64(a.rng.IntN(1<<17))-1<<16)
				u32(r, off+8, a.rng.Uint32()>>a.rng.IntN(33))
				u32(r, off+12, a.key())
			default:
				u64(r, off, a.rng.Uint64())
			}
		}
	case scribbleCQ:
		r := a.pick(a.cqs)
		h := header(r)
		n := uint64((len(r) - headerSize) / cqSlotSize)
		switch a.rng.IntN(7) {
		case 0:
			h.tail.Store(a.near(h.tail.Load()))
		case 1:
			h.head.Store(a.near(h.head.Load()))
		case 2:
			h.armed.Store(uint32(a.rng.IntN(4)))
		case 3:
			h.wake.Add(1)
		case 4: // make the consumer's next slot look published
			pos := h.head.Load()
			u64(r, headerSize+cqSlotSize*int(pos%n), pos+1)
		case 5: // make the producers' next slot look taken
			pos := h.tail.Load()
			u64(r, headerSize+cqSlotSize*int(pos%n), a.near(pos))
		default: // a slot's fields, sequence included
			u64(r, headerSize+8*a.rng.IntN(int(n)*cqSlotSize/8), a.rng.Uint64())
		}
	case scribbleHeaders:
		h := header(a.pick(a.recvs))
		switch a.rng.IntN(5) {
		case 0:
			h.state.Store(uint32(a.rng.IntN(8)))
		case 1:
			h.access.Store(a.rng.Uint32())
		case 2:
			h.attrs.Store(a.rng.Uint32())
		case 3:
			h.pd.Store([]uint32{a.pdID, a.rng.Uint32()}[a.rng.IntN(2)])
		default:
			h.magic, h.entries, h.entrySize = a.rng.Uint32(), a.rng.Uint32(), a.rng.Uint32()
		}
	default: // anywhere in any shared segment
		seg := a.pick(a.segments)
		u64(seg, 8*a.rng.IntN(len(seg)/8), a.rng.Uint64())
	}
}

// scribbleKey rewrites a field of a key slot; mostly a valid key's slot,
// mostly with a plausible value, so that lookups succeed and the victim
// acts on a wrong segment, offset, address or length.
func (a *attacker) scribbleKey() {
	idx := a.rng.IntN(maxKeys)
	if a.rng.IntN(8) != 0 {
		idx = int(keytab.Index(a.key()))
	}
	s := (*keySlot)(unsafe.Pointer(&a.keyMem[idx*keySlotSize]))
	field := a.rng.IntN(12)
	if a.mode == scribbleKeys {
		// Leave what makes a lookup succeed alone (the sequence, key,
		// rights, kind and PD), so that the victim acts on the rest.
		field = 4 + a.rng.IntN(8)
		if field == 5 {
			field = 4
		}
	}
	switch field {
	case 0:
		s.ver.Add(uint32(a.rng.IntN(2)))
	case 1:
		s.key.Store(a.key())
	case 2:
		s.access.Store([]uint32{a.rng.Uint32(), uint32(driverRemoteAll)}[a.rng.IntN(2)])
	case 3: // segment or nothing: never process memory, see above
		s.kind.Store([]uint32{kindNone, kindSegment, kindSegment, 3 + a.rng.Uint32()>>1}[a.rng.IntN(4)])
	case 4:
		if len(a.segIDs) > 0 && a.rng.IntN(3) != 0 {
			s.segID.Store(a.segIDs[a.rng.IntN(len(a.segIDs))])
		} else {
			s.segID.Store(a.rng.Uint32())
		}
	case 5:
		s.pd.Store([]uint32{a.pdID, a.rng.Uint32()}[a.rng.IntN(2)])
	case 6, 7:
		s.segOff.Store([]uint64{a.rng.Uint64(), uint64(a.rng.IntN(1 << 17)), uint64(1<<16) - uint64(a.rng.IntN(128)), ^uint64(0) - uint64(a.rng.IntN(128))}[a.rng.IntN(4)])
	case 8, 9:
		s.addr.Store(a.near(a.regAddr))
	default:
		s.length.Store([]uint64{a.rng.Uint64(), uint64(a.rng.IntN(1 << 17)), ^uint64(0), ^uint64(0) - a.regAddr + 1}[a.rng.IntN(4)])
	}
}

const driverRemoteAll = verbs.AccessLocalWrite | verbs.RemoteAccess

// victimWR returns a random work request of the victim's.
func victimWR(rng *rand.Rand, i int, src, dst verbstest.Region, target verbstest.Region) verbs.SendWR {
	off := 8 * rng.IntN(8)
	remote := target
	if rng.IntN(8) == 0 {
		remote.RKey = rng.Uint32()
	}
	if rng.IntN(8) == 0 {
		remote.Addr += uint64(rng.IntN(1<<20)) - 1<<19
	}
	wrid := uint64(i)
	switch rng.IntN(7) {
	case 0:
		return send(wrid, src.SGE(off, 32))
	case 1:
		wr := send(wrid, src.SGE(off, 32))
		wr.Opcode, wr.Imm = verbs.OpSendWithImm, 7
		return wr
	case 2:
		return rdma(wrid, verbs.OpRDMAWrite, src.SGE(off, 64), remote, off)
	case 3:
		wr := rdma(wrid, verbs.OpRDMAWriteWithImm, src.SGE(off, 64), remote, off)
		wr.Imm = 9
		return wr
	case 4:
		return rdma(wrid, verbs.OpRDMARead, dst.SGE(off, 64), remote, off)
	case 5:
		return atomicWR(wrid, verbs.OpAtomicFetchAndAdd, dst.SGE(off, 8), remote, off, 1, 0)
	default:
		return atomicWR(wrid, verbs.OpAtomicCmpAndSwp, dst.SGE(off, 8), remote, off, 0, 1)
	}
}

// timed runs f and fails the test if it takes longer than callBound.
func timed(t testing.TB, what string, f func()) {
	t.Helper()
	start := time.Now()
	f()
	if d := time.Since(start); d > callBound {
		t.Fatalf("%s took %v: a hostile peer made the victim wait", what, d)
	}
}

func TestHostilePeerScribbles(t *testing.T) {
	rounds := 40
	if testing.Short() {
		rounds = 10
	}
	for r := range rounds {
		t.Run(fmt.Sprintf("round%d", r), func(t *testing.T) {
			scribbleRound(t, uint64(r), r%scribbleModes, verbstest.PairOptions{SRQ: r/scribbleModes%2 == 1})
		})
	}
}

// connectLife connects a new QP of the victim to a new QP of the attacker
// on the pair's existing devices and CQs (and the attacker's SRQ). It
// reports ok false, connecting nothing, once the attacker's garbage has
// failed the attacker's own SRQ, which takes no new QP.
func connectLife(t *testing.T, p *verbstest.Pair) (victim, att *verbs.QP, ok bool) {
	t.Helper()
	b := p.B.(*verbstest.Local)
	c := verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16, MaxSendSGE: 4, MaxRecvSGE: 4, MaxInlineData: 64}
	var err error
	if att, err = b.PD.CreateQP(verbs.QPInitAttr{SendCQ: b.SendCQ, RecvCQ: b.RecvCQ, SRQ: b.SRQ, Cap: c}); err != nil {
		if b.SRQ != nil && errors.Is(err, errSRQFailed) {
			return nil, nil, false
		}
		t.Fatal(err)
	}
	if victim, err = p.A.PD.CreateQP(verbs.QPInitAttr{SendCQ: p.A.SendCQ, RecvCQ: p.A.RecvCQ, Cap: c}); err != nil {
		t.Fatal(err)
	}
	addr := uniqueAddr("life")
	l, err := cm.Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	accepted := make(chan error, 1)
	go func() {
		req, err := l.Accept(ctx)
		if err == nil {
			var cn *cm.Conn
			if cn, err = req.Accept(att, nil); err == nil {
				b.Conns = append(b.Conns, cn)
			}
		}
		accepted <- err
	}()
	cn, err := cm.Dial(ctx, addr, victim, nil)
	if aerr := <-accepted; err != nil || aerr != nil {
		t.Fatalf("connect: %v, %v", err, aerr)
	}
	p.A.Conns = append(p.A.Conns, cn)
	return victim, att, true
}

// scribbleRound: A is the victim, B the attacker. In each of a number of
// lives — a fresh pair of connected QPs, until the garbage moves the
// victim's to the error state — the attacker scribbles between the
// victim's operations (reproducibly, from the seed) and, from another
// goroutine, during them.
func scribbleRound(t *testing.T, seed uint64, mode int, opts verbstest.PairOptions) {
	p := localHarness().NewPair(t, opts)
	b := p.B.(*verbstest.Local)
	bctx := driverQP(b.QPs[0]).ctx

	// The victim's regions, with canaries, and a private one.
	src := newRegion(t, p.A, 4096, verbs.AccessLocalWrite)
	dst := newRegion(t, p.A, 4096, verbs.AccessLocalWrite)
	rbuf := newRegion(t, p.A, 4096, verbs.AccessLocalWrite)
	exposed := newRegion(t, p.A, 4096, verbs.AccessLocalWrite|verbs.RemoteAccess)
	private := newRegion(t, p.A, 4096, verbs.AccessLocalWrite)
	fill(t, p.A, src, 0, pattern(1, 4096))
	fill(t, p.A, private, 0, pattern(2, 4096))
	fill(t, p.A, exposed, 0, pattern(3, 4096))
	// The attacker's region the victim targets, and a buffer for the
	// receives it posts for the victim's Sends, as a well-behaved peer
	// would.
	target := newRegion(t, p.B, 1<<16, driverRemoteAll)
	brecv := newRegion(t, p.B, 4096, verbs.AccessLocalWrite)

	var writes atomic.Int64
	rng := rand.New(rand.NewPCG(seed, 3))
	inlineRNG := rand.New(rand.NewPCG(seed, 1))
	wc := make([]verbs.WorkCompletion, 32)
	posted, completions, ok, lives := 0, 0, 0, 0
	for life := range 16 {
		vq, aq, alive := connectLife(t, p)
		if !alive {
			break // the garbage failed the attacker's SRQ: no more lives
		}
		lives++
		bq := driverQP(aq)
		for i := range 8 {
			wr := recv(uint64(i), brecv.SGE((life%4)*1024+i*64, 64))
			if opts.SRQ {
				b.SRQ.PostRecv([]verbs.RecvWR{wr})
			} else {
				aq.PostRecv([]verbs.RecvWR{wr})
			}
		}
		base := attacker{mode: mode, pdID: bq.pd.id, regAddr: target.Addr, writes: &writes}
		base.recvs = [][]byte{bq.block.mem}
		if bq.srq != nil {
			base.recvs = append(base.recvs, bq.srq.seg.mem)
		}
		base.cqs = [][]byte{bq.recvCQ.seg.mem}
		bq.mu.Lock()
		bc := bq.conn
		bq.mu.Unlock()
		base.recvs = append(base.recvs, bc.peerBlock.mem) // the victim's
		base.cqs = append(base.cqs, bc.cqSeg.mem)         // the victim's
		base.keyMem = bq.grantSeg.mem                     // the table the victim reads
		base.segments = append(append(append([][]byte{}, base.recvs...), base.cqs...), base.keyMem)
		bctx.mu.RLock()
		bctx.mrs.Range(func(key uint32, _ grant.Entry[*mr]) bool {
			base.keys = append(base.keys, key)
			return true
		})
		bctx.mu.RUnlock()
		bctx.segMu.Lock()
		for id := range bctx.segs {
			base.segIDs = append(base.segIDs, id)
		}
		bctx.segMu.Unlock()
		inline, concurrent := base, base
		inline.rng = inlineRNG
		concurrent.rng = rand.New(rand.NewPCG(seed, uint64(100+life)))

		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				concurrent.scribble()
				runtime.Gosched()
			}
		})
		for i := 0; i < 30 && vq.State() != verbs.QPSErr; i++ {
			for range rng.IntN(3) {
				inline.scribble()
			}
			wr := victimWR(rng, i, src, dst, target)
			timed(t, "PostSend", func() {
				if n, _ := vq.PostSend([]verbs.SendWR{wr}); n == 1 {
					posted++
				}
			})
			if rng.IntN(4) == 0 {
				timed(t, "PostRecv", func() { vq.PostRecv([]verbs.RecvWR{recv(uint64(1000+i), rbuf.SGE(64*rng.IntN(64), 64))}) })
			}
			timed(t, "Poll", func() {
				for _, cq := range []*verbs.CQ{p.A.SendCQ, p.A.RecvCQ} {
					n := cq.Poll(wc)
					completions += n
					for _, w := range wc[:n] {
						if w.Status == verbs.WCSuccess {
							ok++
						}
					}
				}
			})
		}
		close(stop)
		wg.Wait()
		if p.A.SendCQ.Err() != nil || p.A.RecvCQ.Err() != nil {
			break // the garbage overran a CQ of the victim's: no more lives
		}
	}
	// Whatever state the garbage left, the victim's memory outside its
	// regions is untouched, and so is what no peer may write.
	expectCanaries(t, p.A, src, dst, rbuf, exposed, private)
	if !bytes.Equal(contents(t, p.A, private, 0, 4096), pattern(2, 4096)) {
		t.Fatal("the victim's private region changed")
	}
	if !bytes.Equal(contents(t, p.A, src, 0, 4096), pattern(1, 4096)) {
		t.Fatal("the victim's source region changed")
	}
	if !bytes.Equal(contents(t, p.A, exposed, 0, 4096), pattern(3, 4096)) {
		t.Fatal("the victim's exposed region changed: the attacker was not asked to write it")
	}
	t.Logf("seed %d, mode %d, SRQ %v: %d hostile writes; in %d lives the victim posted %d WRs, polled %d completions (%d successful)",
		seed, mode, opts.SRQ, writes.Load(), lives, posted, completions, ok)
	// Teardown must not hang either.
	closeBounded(t, p)
}

// TestHostileRecvIndicesFlushBounded: a peer that keeps moving the tail
// of the victim's receive ring ahead of its head, as the victim's QP moves
// to the error state and flushes its receives, cannot keep the victim
// flushing forever: a flush takes at most as many entries as the ring
// holds.
func TestHostileRecvIndicesFlushBounded(t *testing.T) {
	p := localHarness().NewPair(t, verbstest.PairOptions{})
	bq := driverQP(p.B.(*verbstest.Local).QPs[0])
	bq.mu.Lock()
	h := header(bq.conn.peerBlock.mem[blockPad(bq.conn.remote.QPNum):]) // the victim's receive ring, as the attacker maps it
	bq.mu.Unlock()
	rbuf := newRegion(t, p.A, 4096, verbs.AccessLocalWrite)
	postRecv(t, p.A, 0, recv(1, rbuf.SGE(0, 64)))

	stop, running := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			h.tail.Store(h.head.Load() + 16)
			if i == 1000 {
				close(running)
			}
		}
	})
	defer func() {
		close(stop)
		wg.Wait()
	}()
	<-running
	done := make(chan error, 1)
	go func() { done <- p.A.QPs[0].Modify(&verbs.QPAttr{State: verbs.QPSErr}, verbs.QPAttrState) }()
	timer := time.NewTimer(callBound)
	defer timer.Stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-timer.C:
		t.Fatal("moving the QP to the error state does not return while the peer keeps feeding its receive ring")
	}
	timed(t, "PostRecv in the error state", func() { p.A.PostRecv(0, []verbs.RecvWR{recv(2, rbuf.SGE(64, 64))}) })
	// Each of the two flushes took at most a ring's worth of entries.
	ring := int(driverQP(p.A.QPs[0]).rq.mask + 1)
	wc := make([]verbs.WorkCompletion, 64)
	n := 0
	for k := p.A.RecvCQ.Poll(wc); k > 0; k = p.A.RecvCQ.Poll(wc) {
		n += k
	}
	if n > 2*ring || p.A.RecvCQ.Err() != nil {
		t.Fatalf("the flushes completed %d receives from a ring of %d (CQ error %v)", n, ring, p.A.RecvCQ.Err())
	}
	t.Logf("%d receives flushed from a ring of %d", n, ring)
}
