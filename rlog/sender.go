package rlog

import (
	"context"
	"fmt"

	"github.com/goverbs/goverbs/verbs"
)

// sender is the sending end of a replicate connection (the primary, to
// one replica) or of a fetch connection (a member, to the member being
// promoted). It waits for the receiver's HELLO, tells it where the two
// logs agree (START), and pushes batches of frames: in ModeWrite an RDMA
// Write into buffer b of the receiver's ring, then a DATA Send naming b —
// RC ordering delivers the Send only after the Write's data is visible —
// and in ModeSend one Send carrying both.
//
// Credits: at most Buffers batches are outstanding; the receiver's
// STATUS frees them. The receiver sends a STATUS only when a batch was
// consumed or an fsync advanced its durable record, so after any STATUS
// this sender has processed, at most Buffers batches and Buffers+1
// fsyncs can prompt new ones: 2·Buffers+1 STATUS, plus HELLO and ERROR,
// is the most that can be waiting, and 2·Buffers+4 receives are posted.
type sender struct {
	m      *Member
	p      *primary // nil for a fetch source
	idx    int      // the replica's member index (primary)
	k      *link
	mode   Mode
	remote ringInfo
	nrecv  int
	recvMR *verbs.MR // control receive slots
	hdrMR  *verbs.MR // DATA headers (one per buffer), START and ERROR
	stage  *verbs.MR // batches read from the log: one buffer per ring buffer
	maxSQ  int

	started  bool
	truncate uint64 // where the logs agree (START)
	nextSeq  uint64
	maxSent  uint64
	sent     uint64 // batches sent
	released uint64 // batches the receiver freed
	gen      uint32
	durable  uint64
	sqUsed   int
	inflight []batch // batches whose DATA send has not completed, oldest first
	cursor   cacheCursor

	kick   chan struct{} // new records (primary)
	wc     []verbs.WorkCompletion
	rwr    [1]verbs.RecvWR
	swr    [2]verbs.SendWR
	sge    [2]verbs.SGE
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

// batch is a batch in flight: which cache buffer it pins, if any.
type batch struct {
	chunk int // cache buffer, or -1
	gen   uint64
	wrs   int // send queue entries it holds
}

const (
	startSlot = 0 // header slots: START, ERROR, then one DATA header per buffer
	errSlot   = 1
	dataSlot0 = 2

	wrData  = 1 << 32 // WRID kinds of the sender's sends
	wrOther = 2 << 32
)

// newSender prepares a sending end to the receiver whose ring is remote:
// its control receives are posted before it connects.
func newSender(m *Member, p *primary, idx int, mode Mode, remote ringInfo) (*sender, error) {
	s := &sender{m: m, p: p, idx: idx, mode: mode, remote: remote, nrecv: 2*remote.buffers + 4,
		maxSQ: 2*remote.buffers + 4, kick: make(chan struct{}, 1), done: make(chan struct{}),
		wc: make([]verbs.WorkCompletion, 16)}
	parent := m.ctx
	if p != nil {
		parent = p.ctx
	}
	k, err := newLink(m, s.nrecv+s.maxSQ+4, verbs.QPCap{MaxSendWR: uint32(s.maxSQ), MaxRecvWR: uint32(s.nrecv), MaxSendSGE: 2, MaxRecvSGE: 1})
	if err != nil {
		return nil, err
	}
	s.k = k
	s.ctx, s.cancel = context.WithCancel(parent)
	fail := func(err error) (*sender, error) {
		s.close()
		return nil, err
	}
	if s.recvMR, err = k.alloc(s.nrecv*ctrlSize, verbs.AccessLocalWrite); err != nil {
		return fail(err)
	}
	if s.hdrMR, err = k.alloc((dataSlot0+remote.buffers)*ctrlSize, verbs.AccessLocalWrite); err != nil {
		return fail(err)
	}
	for i := range s.nrecv {
		if err := s.postRecv(i); err != nil {
			return fail(err)
		}
	}
	return s, nil
}

func (s *sender) postRecv(i int) error {
	s.rwr[0] = verbs.RecvWR{WRID: uint64(i), SGList: []verbs.SGE{s.recvMR.SGE(i*ctrlSize, ctrlSize)}}
	_, err := s.k.qp.PostRecv(s.rwr[:])
	return err
}

func (s *sender) hdr(i int) []byte { return s.hdrMR.Bytes()[i*ctrlSize : (i+1)*ctrlSize] }

// stageBuf returns the staging buffer of ring buffer i, registering the
// staging area on first use.
func (s *sender) stageBuf(i int) ([]byte, verbs.SGE, error) {
	if s.stage == nil {
		mr, err := s.k.alloc(s.remote.buffers*s.remote.bufSize, verbs.AccessLocalWrite)
		if err != nil {
			return nil, verbs.SGE{}, err
		}
		s.stage = mr
	}
	off := i * s.remote.bufSize
	return s.stage.Bytes()[off : off+s.remote.bufSize], s.stage.SGE(off, 0), nil
}

// postCtrl sends a control message from header slot i.
func (s *sender) postCtrl(i int, m msg) error {
	if s.sqUsed >= s.maxSQ {
		return fmt.Errorf("rlog: internal error: send queue full")
	}
	s.swr[0] = verbs.SendWR{WRID: wrOther | uint64(i), Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{s.hdrMR.SGE(i*ctrlSize, len(m))}}
	if _, err := s.k.qp.PostSend(s.swr[:1]); err != nil {
		return fmt.Errorf("%w: %w", errPeerGone, err)
	}
	s.sqUsed++
	return nil
}

// close releases the session's context and its link, once run has
// returned (or was never called).
func (s *sender) close() {
	s.cancel()
	s.k.close()
}

// stop ends the session and waits for run to return.
func (s *sender) stop() {
	s.cancel()
	s.k.disconnect()
	<-s.done
}

// wake tells the sender that there are new records.
func (s *sender) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// run serves the session until the connection ends.
func (s *sender) run() (err error) {
	defer close(s.done)
	defer s.unpinAll()
	defer func() {
		if err != nil && s.ctx.Err() == nil && !isPeerGone(err) && s.sqUsed < s.maxSQ {
			s.postCtrl(errSlot, putError(s.hdr(errSlot), errorCode(err), err.Error()))
		}
	}()
	for _, wc := range s.k.takeStash() {
		if err := s.handle(wc); err != nil {
			return err
		}
	}
	for {
		if err := s.pump(); err != nil {
			return err
		}
		n, err := waitCQ(s.ctx, s.k.cq, s.wc, s.kick, nil)
		if err != nil {
			return err
		}
		for _, wc := range s.wc[:n] {
			if err := s.handle(wc); err != nil {
				return err
			}
		}
	}
}

func (s *sender) handle(wc verbs.WorkCompletion) error {
	if wc.Status != verbs.WCSuccess {
		return wcError(wc)
	}
	if wc.Opcode != verbs.WCRecv {
		if wc.WRID&wrData != 0 {
			b := s.inflight[0]
			s.inflight = s.inflight[1:]
			s.sqUsed -= b.wrs
			s.unpin(b)
		} else {
			s.sqUsed--
		}
		return nil
	}
	i, b, err := receivedSlot(&wc, wc.WRID, s.nrecv, ctrlSize, s.recvMR.Bytes())
	var m msg
	if err == nil {
		m, err = parseMsg(b)
	}
	if err == nil {
		err = s.apply(m)
	}
	if err != nil {
		return err
	}
	if err := s.postRecv(i); err != nil {
		return fmt.Errorf("%w: %w", errPeerGone, err)
	}
	return nil
}

// feedFirst, feedLast and feedHistory describe the log the sender pushes
// from: the primary's (up to what it has written) or the member's.
func (s *sender) feedLast() uint64 {
	if s.p != nil {
		return s.p.written()
	}
	l, _ := s.m.log.Last()
	return l
}

func (s *sender) apply(m msg) error {
	switch m.typ() {
	case msgHello:
		if s.started {
			return errMsg("a second HELLO")
		}
		return s.hello(m)
	case msgStatus:
		if !s.started {
			return errMsg("STATUS before START")
		}
		return s.status(m)
	case msgError:
		return fmt.Errorf("the receiver ended the session: %w", codeError(m.errCode(), m.errText()))
	}
	return errMsg("unexpected message type %d from a receiver", m.typ())
}

// testHookHelloReads runs in hello between its reads of what the
// primary has written and of the log's history (tests: a write lands
// there).
var testHookHelloReads = func() {}

// hello finds where the receiver's log agrees with ours, and sends START.
func (s *sender) hello(m msg) error {
	hist, err := m.helloHistory()
	if err != nil {
		return err
	}
	// A primary offers the records it has written: last is read before
	// the history, so that the history knows the epoch of every record
	// up to last. (Read after it, last could count the first record of
	// the primary's epoch, written in between, that the history lacks:
	// commonPrefix would stretch the previous epoch over it, and the
	// receiver keep a record of its own of that number and epoch.) A
	// member that is not primary offers its log: history, last and first
	// read together.
	var last uint64
	if s.p != nil {
		last = s.p.written()
	}
	testHookHelloReads()
	s.m.log.mu.Lock()
	mine, first := append([]epochStart(nil), s.m.log.hist...), s.m.log.first
	if s.p == nil {
		last = s.m.log.last
	}
	s.m.log.mu.Unlock()
	keep := commonPrefix(mine, last, hist, m.helloLast())
	if keep+1 < first {
		return fmt.Errorf("%w: the receiver's log agrees with ours up to record %d, but ours starts at %d (RetainSegments); seed it from a copy of a member's data directory",
			ErrTooFarBehind, keep, first)
	}
	if keep < m.helloLast() {
		s.m.cfg.Logf("rlog: %s: the receiver's log (to record %d) agrees with ours up to %d: it cuts back to there", s.m.cfg.Listen, m.helloLast(), keep)
	}
	s.truncate, s.nextSeq, s.maxSent, s.started = keep, keep+1, keep, true
	if s.p != nil {
		s.p.sent(s.idx, keep)
	}
	return s.postCtrl(startSlot, putStart(s.hdr(startSlot), keep, s.gen, last))
}

// status takes in a STATUS: freed buffers, the durable record, a NACK.
func (s *sender) status(m msg) error {
	rel, dur := m.statusReleased(), m.statusDurable()
	if rel < s.released || rel > s.sent {
		return errMsg("STATUS frees %d batches; %d were freed before and %d sent", rel, s.released, s.sent)
	}
	if dur < s.durable || dur > s.maxSent {
		return errMsg("STATUS says record %d is durable; before it said %d, and %d were sent", dur, s.durable, s.maxSent)
	}
	s.released, s.durable = rel, dur
	if s.p != nil {
		s.p.replicaDurable(s.idx, dur)
	}
	if m.statusNack() {
		switch g := m.statusNackGen(); {
		case g > s.gen:
			return errMsg("NACK of generation %d, but the current one is %d", g, s.gen)
		case g == s.gen:
			expect := m.statusExpect()
			if expect <= s.truncate || expect > s.nextSeq {
				return errMsg("NACK asks for record %d, outside %d to %d", expect, s.truncate+1, s.nextSeq)
			}
			s.m.cfg.Logf("rlog: %s: a receiver refused a batch; sending again from record %d", s.m.cfg.Listen, expect)
			s.nextSeq = expect
			s.gen++
			s.cursor = cacheCursor{}
			if s.p != nil {
				s.p.nacked(s.idx)
			}
		}
	}
	return nil
}

// pump sends batches while there are records, free buffers and room in
// the send queue.
func (s *sender) pump() error {
	if !s.started {
		return nil
	}
	per := 1
	if s.mode == ModeWrite {
		per = 2
	}
	for s.sent-s.released < uint64(s.remote.buffers) && s.sqUsed+per <= s.maxSQ-1 && s.nextSeq <= s.feedLast() {
		if err := s.push(per); err != nil {
			return err
		}
	}
	return nil
}

// push sends one batch starting at nextSeq.
func (s *sender) push(per int) error {
	slot := int(s.sent % uint64(s.remote.buffers))
	b := batch{chunk: -1, wrs: per}
	var src verbs.SGE
	var n, count int
	if s.p != nil {
		src, n, count, b.chunk, b.gen = s.p.cache.batch(&s.cursor, s.nextSeq, s.remote.bufSize, s.m.cfg.MaxBatch)
	}
	if n == 0 {
		buf, sge, err := s.stageBuf(slot)
		if err != nil {
			return err
		}
		if n, count, err = s.m.log.read(s.nextSeq, buf); err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("rlog: internal error: record %d is neither cached nor in the log", s.nextSeq)
		}
		n, count = capBatch(buf[:n], count, s.m.cfg.MaxBatch)
		src = sge
		src.Length = uint32(n)
		if s.p != nil {
			s.p.fromLog(s.idx)
		}
	}
	if h := s.m.cfg.hooks; h != nil && h.corrupt != nil && h.corrupt(s.nextSeq) {
		buf, sge, err := s.stageBuf(slot)
		if err != nil {
			return err
		}
		if b.chunk >= 0 {
			copy(buf, s.p.cache.bytes(src))
			s.unpin(b)
			b.chunk = -1
		}
		buf[frameHeader] ^= 0xff // the first frame's payload, or its padding
		buf[3] ^= 0x01           // and its checksum, in case it has neither
		sge.Length = uint32(n)
		src = sge
	}
	var commit uint64
	if s.p != nil {
		commit = s.p.committed()
	}
	first := s.nextSeq
	last := first + uint64(count) - 1
	hslot := dataSlot0 + slot
	inline := s.mode == ModeSend
	putData(s.hdr(hslot), s.gen, slot, n, count, first, last, commit, inline)
	hdr := s.hdrMR.SGE(hslot*ctrlSize, dataLen)
	wrs := s.swr[:0]
	if s.mode == ModeWrite {
		s.sge[0] = src
		wrs = append(wrs, verbs.SendWR{WRID: wrOther | 1<<16, Opcode: verbs.OpRDMAWrite, SGList: s.sge[:1],
			RemoteAddr: s.remote.addr + uint64(slot*s.remote.bufSize), RKey: s.remote.rkey})
		s.sge[1] = hdr
		wrs = append(wrs, verbs.SendWR{WRID: wrData | uint64(slot), Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: s.sge[1:2]})
	} else {
		s.sge[0], s.sge[1] = hdr, src
		wrs = append(wrs, verbs.SendWR{WRID: wrData | uint64(slot), Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: s.sge[:2]})
	}
	posted, err := s.k.qp.PostSend(wrs)
	if err != nil {
		s.sqUsed += posted
		s.unpin(b)
		return fmt.Errorf("%w: %w", errPeerGone, err)
	}
	s.inflight = append(s.inflight, b)
	s.sqUsed += per
	s.sent++
	s.nextSeq = last + 1
	s.maxSent = max(s.maxSent, last)
	if s.p != nil {
		s.p.sent(s.idx, last)
	}
	return nil
}

// capBatch cuts a batch of count frames in b to at most max records (if
// max > 0) and returns its bytes and records.
func capBatch(b []byte, count, max int) (int, int) {
	if max <= 0 || count <= max {
		return len(b), count
	}
	off := 0
	for range max {
		off += frame(b[off:]).size()
	}
	return off, max
}

func (s *sender) unpin(b batch) {
	if b.chunk >= 0 && s.p != nil {
		s.p.cache.unpin(b.chunk, b.gen)
	}
}

func (s *sender) unpinAll() {
	for _, b := range s.inflight {
		s.unpin(b)
	}
	s.inflight = nil
}
