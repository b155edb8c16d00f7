package rlog

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// primary is the primary role of a member: it takes appends from
// clients, frames the records into its cache — registered memory the
// senders push from — writes them to its log, and acknowledges each
// append once a quorum holds its records durably.
//
// One goroutine (the appender) serves every client on a shared CQ; each
// replica has a goroutine that dials it and runs its sender. They share
// the cache, the replicas' durable records and the commit index under mu.
type primary struct {
	m          *Member
	epoch      uint64
	epochStart uint64 // the first record of this epoch
	ctx        context.Context
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	done       chan struct{}
	wake       chan struct{} // the appender has something to do

	mu       sync.Mutex // guards what follows, and the cache's chunk headers
	cache    *cache
	visible  uint64   // the last record written to the log: senders push up to it
	durable  []uint64 // by member index: the last record it holds durably
	commit   uint64
	senders  []*sender
	replicas []ReplicaStatus
	err      error // why the role ended
	stopping bool

	// The appender's own state.
	cq        *verbs.CQ
	cmu       sync.Mutex // guards clients and noClients (the accept loop adds clients)
	clients   map[uint32]*clientSession
	noClients bool
	nextSeq   uint64
	pending   []pendingAppend
	stalled   []stalledRequest
	wc        []verbs.WorkCompletion
	closedCh  chan struct{}
	wantRoom  atomic.Bool // requests wait for a cache chunk to be unpinned
	nextTag   uint64
}

// clientSession is one client's connection to the primary.
type clientSession struct {
	tag     uint64 // in the high bits of its WRIDs: a new client may get a QP number a gone one had
	k       *link
	recvMR  *verbs.MR // Depth request buffers
	replyMR *verbs.MR // Depth reply buffers
	free    []int     // free reply buffers
	waiting []waitingReply
	msgSize int
	dead    bool
	// lastID is the id of the last APPEND taken: a request must carry a
	// greater one, so that one replayed (over shm0 a client's process
	// writes the completion of its Send, and may write it again) is
	// refused rather than appended twice.
	lastID uint64
	rwr    [1]verbs.RecvWR
	swr    [1]verbs.SendWR
}

// waitingReply is a reply waiting for a free reply buffer.
type waitingReply struct {
	id, first uint64
	count     int
	code      uint8
	text      string
}

// pendingAppend is an append waiting for its records to be committed.
type pendingAppend struct {
	cs          *clientSession
	id          uint64
	first, last uint64
}

// stalledRequest is a request waiting for cache room.
type stalledRequest struct {
	cs   *clientSession
	slot int
	n    int
}

func newPrimary(m *Member, epoch uint64) (*primary, error) {
	cfg := &m.cfg
	last, _ := m.log.Last()
	p := &primary{m: m, epoch: epoch, epochStart: last + 1, done: make(chan struct{}), wake: make(chan struct{}, 1),
		visible: last, nextSeq: last + 1, durable: make([]uint64, len(cfg.Members)), senders: make([]*sender, len(cfg.Members)),
		replicas: make([]ReplicaStatus, len(cfg.Members)), clients: map[uint32]*clientSession{},
		wc: make([]verbs.WorkCompletion, 64), closedCh: make(chan struct{})}
	p.ctx, p.cancel = context.WithCancel(m.ctx)
	for i, a := range cfg.Members {
		p.replicas[i].Addr = a
	}
	var err error
	if p.cache, err = newCache(m.pd, cfg.CacheBuffers, cfg.BufferSize, &p.mu); err != nil {
		return nil, err
	}
	p.cache.onUnpin = func() {
		if p.wantRoom.Load() {
			p.kick()
		}
	}
	cqe := cfg.MaxClients*(2*cfg.ClientDepth) + 16
	if p.cq, err = m.vctx.CreateCQ(cqe); err != nil {
		p.cache.close()
		return nil, err
	}
	return p, nil
}

// start starts the appender and a sender per replica.
func (p *primary) start() {
	// Under p.mu, as stop's check of stopping: a role stopped before it
	// started (a fence answered between becomePrimary's publishing it
	// and start) starts nothing, and every goroutine started is one that
	// stop waits for.
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopping {
		return
	}
	p.wg.Add(1)
	go p.appendLoop()
	for i := range p.m.cfg.Members {
		if i == p.m.self {
			continue
		}
		p.wg.Add(1)
		go p.replicate(i)
	}
}

// stop ends the role: clients are disconnected (their appends not yet
// acknowledged fail with ErrOutcomeUnknown), senders stop.
func (p *primary) stop(why error) {
	p.mu.Lock()
	if p.stopping {
		p.mu.Unlock()
		<-p.closedCh
		return
	}
	p.stopping = true
	if p.err == nil {
		p.err = why
	}
	p.mu.Unlock()
	p.cmu.Lock()
	p.noClients = true
	p.cmu.Unlock()
	p.cancel()
	p.wg.Wait()
	p.cmu.Lock()
	for qpn, cs := range p.clients {
		cs.k.close()
		delete(p.clients, qpn)
	}
	p.cmu.Unlock()
	p.cq.Destroy()
	p.cache.close()
	// Only now does the member stop being this role's: until its
	// goroutines have ended, no newer primary's session may cut back the
	// log that the appender counts as durable, nor may a promotion begin
	// (both wait for a role that m.prim still names to stop).
	m := p.m
	m.mu.Lock()
	ended := m.prim == p
	if ended {
		m.prim = nil
	}
	m.mu.Unlock()
	if ended {
		// Said once the member's Status no longer reports the role: a
		// watcher of the log lines that saw the stop begin (fail) sees
		// it end.
		m.cfg.Logf("rlog: %s: no longer primary (epoch %d)", m.cfg.Listen, p.epoch)
	}
	select {
	case <-p.done:
	default:
		close(p.done)
	}
	close(p.closedCh)
}

// fail ends the role on its own (a storage error, a fence seen by a
// sender): the member stays up as a replica.
func (p *primary) fail(err error) {
	p.m.cfg.Logf("rlog: %s: the primary of epoch %d stops: %v", p.m.cfg.Listen, p.epoch, err)
	p.mu.Lock()
	if p.err == nil {
		p.err = err
	}
	p.mu.Unlock()
	select {
	case <-p.done:
	default:
		close(p.done)
	}
	// The supervisor stops the role: stop waits for the goroutines, one
	// of which is calling fail.
}

// supervise stops the role when it fails on its own; it runs in the
// member's wait group, so Close waits for it.
func (p *primary) supervise() {
	select {
	case <-p.done:
		p.stop(p.endErr())
	case <-p.ctx.Done():
	}
}

// failed reports whether the role has ended, or is ending, on its own
// or by stop.
func (p *primary) failed() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *primary) endErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

func (p *primary) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// written is the last record the primary wrote to its log.
func (p *primary) written() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.visible
}

func (p *primary) committed() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.commit
}

// replicaDurable records what replica i holds durably.
func (p *primary) replicaDurable(i int, seq uint64) {
	p.mu.Lock()
	if seq > p.durable[i] {
		p.durable[i] = seq
	}
	p.replicas[i].Durable = seq
	p.mu.Unlock()
	p.kick()
}

func (p *primary) sent(i int, seq uint64) {
	p.mu.Lock()
	p.replicas[i].Sent = seq
	p.mu.Unlock()
}

func (p *primary) fromLog(i int) {
	p.mu.Lock()
	p.replicas[i].FromLog++
	p.mu.Unlock()
}

func (p *primary) nacked(i int) {
	p.mu.Lock()
	p.replicas[i].Nacks++
	p.mu.Unlock()
}

func (p *primary) status(s *Status) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s.Commit = p.commit
	for i, r := range p.replicas {
		if i != p.m.self {
			r.Connected = p.senders[i] != nil
			s.Replicas = append(s.Replicas, r)
		}
	}
}

// advanceCommit recomputes the commit index: the Quorum-th largest of the
// members' durable records — but only a record of this epoch can be
// committed by counting (Raft's rule), which commits all before it.
func (p *primary) advanceCommit() uint64 {
	self := p.m.log.Durable()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.durable[p.m.self] = self
	d := slices.Clone(p.durable)
	slices.Sort(d)
	c := d[len(d)-p.m.cfg.Quorum]
	if c > p.commit && c >= p.epochStart {
		p.commit = c
	}
	return p.commit
}

// replicate keeps a sender running to replica i: it dials, runs the
// session, and dials again after a back-off when the session ends.
func (p *primary) replicate(i int) {
	defer p.wg.Done()
	backoff := 10 * time.Millisecond
	for p.ctx.Err() == nil {
		began := time.Now()
		err := p.session(i)
		if p.ctx.Err() != nil {
			return
		}
		p.mu.Lock()
		p.replicas[i].Err = err.Error()
		p.mu.Unlock()
		if errors.Is(err, ErrFenced) {
			p.fail(fmt.Errorf("%s: %w", p.m.cfg.Members[i], err))
			return
		}
		if time.Since(began) > time.Second {
			backoff = 10 * time.Millisecond
		}
		select {
		case <-p.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// session connects to replica i and runs a sender until it ends.
func (p *primary) session(i int) error {
	cfg := &p.m.cfg
	addr := cfg.Members[i]
	s, err := newSender(p.m, p, i, cfg.Mode, ringInfo{buffers: cfg.Buffers, bufSize: cfg.BufferSize})
	if err != nil {
		return err
	}
	defer s.close()
	req := newConnMsg(kindReplicate)
	req.setEpoch(p.epoch)
	req.setBuffers(cfg.Buffers)
	req.setBufSize(cfg.BufferSize)
	req.setMode(cfg.Mode)
	r, err := p.m.dialMember(p.ctx, s.k, i, req, nil)
	if err != nil {
		return err
	}
	if r.status() != codeOK {
		return answerError(r)
	}
	ring := r.ring()
	if ring.buffers != cfg.Buffers || ring.bufSize != cfg.BufferSize {
		return fmt.Errorf("%w: %s accepted with a ring of %d buffers of %d bytes, not %d of %d", ErrProtocol, addr, ring.buffers, ring.bufSize, cfg.Buffers, cfg.BufferSize)
	}
	s.remote = ring
	p.mu.Lock()
	if p.stopping {
		p.mu.Unlock()
		return ErrClosed
	}
	p.senders[i] = s
	p.replicas[i].Err = ""
	p.mu.Unlock()
	cfg.Logf("rlog: %s: replica %s connected", cfg.Listen, addr)
	err = s.run()
	if err == nil {
		err = errPeerGone
	}
	p.mu.Lock()
	p.senders[i] = nil
	p.replicas[i].Err = err.Error()
	p.mu.Unlock()
	cfg.Logf("rlog: %s: replica %s: %v", cfg.Listen, addr, err)
	return err
}

// wakeSenders tells every sender there are new records.
func (p *primary) wakeSenders() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.senders {
		if s != nil {
			s.wake()
		}
	}
}

// acceptClient accepts a client: its QP on the shared CQ with Depth
// receives posted, and the limits in the reply.
func (p *primary) acceptClient(req *cm.Request, reply connMsg) uint8 {
	cfg := &p.m.cfg
	// cmu is held while the client's resources are made, so that stop
	// (which sets noClients under it first) never misses one.
	p.cmu.Lock()
	defer p.cmu.Unlock()
	if p.noClients {
		return codeNotPrimary
	}
	if len(p.clients) >= cfg.MaxClients {
		return codeTooManyConns
	}
	p.nextTag++
	tag := p.nextTag & (1<<24 - 1)
	cs := &clientSession{tag: tag, msgSize: cfg.clientMsgSize(), k: &link{m: p.m}}
	ep, err := cm.NewEndpointAccess(p.m.pd, verbs.QPInitAttr{SendCQ: p.cq, RecvCQ: p.cq,
		Cap: verbs.QPCap{MaxSendWR: uint32(cfg.ClientDepth), MaxRecvWR: uint32(cfg.ClientDepth), MaxSendSGE: 1, MaxRecvSGE: 1}}, verbs.AccessLocalWrite)
	if err != nil {
		return codeUnavailable
	}
	qp := ep.QP()
	cs.k.qp = qp
	fail := func() uint8 {
		cs.k.close()
		return codeUnavailable
	}
	if cs.recvMR, err = cs.k.alloc(cfg.ClientDepth*cs.msgSize, verbs.AccessLocalWrite); err != nil {
		return fail()
	}
	if cs.replyMR, err = cs.k.alloc(cfg.ClientDepth*replySize, verbs.AccessLocalWrite); err != nil {
		return fail()
	}
	for i := range cfg.ClientDepth {
		cs.free = append(cs.free, i)
		if err := cs.postRecv(i); err != nil {
			return fail()
		}
	}
	reply.setA(uint64(cs.msgSize))
	reply.setB(uint64(cfg.MaxRecord))
	reply.setBuffers(cfg.ClientDepth)
	conn, err := req.Accept(qp, &cm.Param{PrivateData: reply})
	if err != nil {
		cs.k.close()
		return codeOK
	}
	cs.k.conn = conn
	p.clients[qp.Num()] = cs
	return codeOK
}

func (cs *clientSession) postRecv(i int) error {
	cs.rwr[0] = verbs.RecvWR{WRID: cs.tag<<tagShift | uint64(i), SGList: []verbs.SGE{cs.recvMR.SGE(i*cs.msgSize, cs.msgSize)}}
	_, err := cs.k.qp.PostRecv(cs.rwr[:])
	return err
}

// reply sends a reply. If every reply buffer is still in flight — the
// client may send its next request, on the credit a reply returned,
// before that reply's send completion is polled here — the reply waits
// for one.
func (cs *clientSession) reply(id, first uint64, count int, code uint8, text string) {
	if cs.dead {
		return
	}
	if len(cs.free) == 0 {
		cs.waiting = append(cs.waiting, waitingReply{id: id, first: first, count: count, code: code, text: text})
		return
	}
	i := cs.free[len(cs.free)-1]
	cs.free = cs.free[:len(cs.free)-1]
	m := putReply(cs.replyMR.Bytes()[i*replySize:(i+1)*replySize], id, first, count, code, text)
	cs.swr[0] = verbs.SendWR{WRID: cs.tag<<tagShift | replyWR | uint64(i), Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
		SGList: []verbs.SGE{cs.replyMR.SGE(i*replySize, len(m))}}
	if _, err := cs.k.qp.PostSend(cs.swr[:]); err != nil {
		cs.drop()
	}
}

func (cs *clientSession) drop() {
	cs.dead = true
	cs.k.disconnect()
}

const (
	replyWR  = 1 << 32
	tagShift = 40
)

// appendLoop is the appender: it takes requests, frames and writes their
// records, and answers appends as the commit index passes them.
func (p *primary) appendLoop() {
	defer p.wg.Done()
	durable, unsubscribe := p.m.log.subscribe()
	defer unsubscribe()
	for {
		n, err := waitCQ(p.ctx, p.cq, p.wc, durable, p.wake)
		if err != nil {
			if p.ctx.Err() == nil {
				p.fail(err)
			}
			p.failPending()
			return
		}
		err = p.retryStalled()
		for _, wc := range p.wc[:n] {
			if err == nil {
				err = p.handle(wc)
			}
		}
		if err == nil {
			err = p.flush()
		}
		if err == nil {
			err = p.m.log.Err()
		}
		if err != nil {
			p.fail(err)
			p.failPending()
			return
		}
		p.answer()
	}
}

// failPending answers every append still waiting with the outcome
// unknown: its records may yet be committed by the next primary.
func (p *primary) failPending() {
	why := "the primary stopped before the records were committed"
	if err := p.endErr(); err != nil {
		why += ": " + err.Error()
	}
	for _, a := range p.pending {
		a.cs.reply(a.id, a.first, int(a.last-a.first+1), codeUnknown, why)
	}
	p.pending = nil
	// Requests still waiting for cache room were not taken at all.
	for _, r := range p.stalled {
		r.cs.reply(msg(r.cs.recvMR.Bytes()[r.slot*r.cs.msgSize:]).appendID(), 0, 0, codeUnavailable, "not appended: the primary stopped")
	}
	p.stalled = nil
}

// answer acknowledges the appends the commit index has passed.
func (p *primary) answer() {
	c := p.advanceCommit()
	i := 0
	for ; i < len(p.pending) && p.pending[i].last <= c; i++ {
		a := p.pending[i]
		a.cs.reply(a.id, a.first, int(a.last-a.first+1), codeOK, "")
	}
	p.pending = p.pending[i:]
}

func (p *primary) client(qpn uint32) *clientSession {
	p.cmu.Lock()
	defer p.cmu.Unlock()
	return p.clients[qpn]
}

// handle processes one client completion.
func (p *primary) handle(wc verbs.WorkCompletion) error {
	cs := p.client(wc.QPNum)
	if cs == nil || wc.WRID>>tagShift != cs.tag {
		return nil // a completion of a client that left
	}
	if wc.Status != verbs.WCSuccess {
		p.forget(wc.QPNum, cs)
		return nil
	}
	if wc.Opcode != verbs.WCRecv {
		if wc.WRID&replyWR != 0 {
			cs.free = append(cs.free, int(wc.WRID&0xffff))
			if len(cs.waiting) > 0 {
				r := cs.waiting[0]
				cs.waiting = cs.waiting[1:]
				cs.reply(r.id, r.first, r.count, r.code, r.text)
			}
		}
		return nil
	}
	slot, b, err := receivedSlot(&wc, wc.WRID&0xffff, p.m.cfg.ClientDepth, cs.msgSize, cs.recvMR.Bytes())
	if err != nil {
		// A completion no receive of ours could have made: the client
		// (over shm0, its process writes them) is dropped.
		p.m.cfg.Logf("rlog: %s: a client's receive completion: %v; dropping the client", p.m.cfg.Listen, err)
		p.forget(wc.QPNum, cs)
		return nil
	}
	if len(p.stalled) == 0 {
		if ok, err := p.request(cs, slot, len(b)); ok || err != nil {
			return err
		}
	}
	p.stalled = append(p.stalled, stalledRequest{cs: cs, slot: slot, n: len(b)})
	return nil
}

// forget drops a client whose connection ended.
func (p *primary) forget(qpn uint32, cs *clientSession) {
	cs.dead = true
	p.cmu.Lock()
	if p.clients[qpn] == cs {
		delete(p.clients, qpn)
	}
	p.cmu.Unlock()
	cs.k.close()
}

// retryStalled takes up requests that waited for cache room, in order.
func (p *primary) retryStalled() error {
	for len(p.stalled) > 0 {
		r := p.stalled[0]
		if !r.cs.dead {
			if ok, err := p.request(r.cs, r.slot, r.n); !ok || err != nil {
				return err
			}
		}
		p.stalled = p.stalled[1:]
	}
	p.wantRoom.Store(false)
	return nil
}

// request serves one request; it returns false if the cache has no room
// for it yet (nothing of it is taken then). An error is the log's: the
// primary cannot go on.
func (p *primary) request(cs *clientSession, slot, n int) (bool, error) {
	cfg := &p.m.cfg
	b := cs.recvMR.Bytes()[slot*cs.msgSize : slot*cs.msgSize+n]
	m, err := parseMsg(b)
	if err != nil || m.typ() != msgAppend {
		var id uint64
		if len(b) >= 16 {
			id = msg(b).u64(8)
		}
		text := "not an APPEND"
		if err != nil {
			text = err.Error()
		}
		// The receive goes back before the reply: the reply returns the
		// client a credit, and its next request must find a receive.
		cs.postRecv(slot)
		cs.reply(id, 0, 0, codeBadRequest, text)
		return true, nil
	}
	if code := m.appendRecords(cfg.MaxRecord, nil); code != codeOK {
		text := "malformed APPEND"
		if code == codeTooLarge {
			text = fmt.Sprintf("a record exceeds MaxRecord (%d bytes)", cfg.MaxRecord)
		}
		id := m.appendID()
		cs.postRecv(slot)
		cs.reply(id, 0, 0, code, text)
		return true, nil
	}
	if id := m.appendID(); id <= cs.lastID {
		// No client sends one: it is dropped, as for a completion no
		// receive of ours could have made.
		p.m.cfg.Logf("rlog: %s: a client replayed APPEND %d (its last was %d); dropping the client", p.m.cfg.Listen, id, cs.lastID)
		cs.drop()
		return true, nil
	}
	// Room for every record first: a request is taken whole or not yet.
	if !p.cache.fits(m, cfg.MaxRecord) {
		p.wantRoom.Store(true)
		return false, nil
	}
	first := p.nextSeq
	err = nil
	m.appendRecords(cfg.MaxRecord, func(rec []byte) {
		if err == nil {
			err = p.cache.add(p.nextSeq, p.epoch, rec, p.flush)
			p.nextSeq++
		}
	})
	if err != nil {
		return false, err
	}
	cs.lastID = m.appendID()
	p.pending = append(p.pending, pendingAppend{cs: cs, id: m.appendID(), first: first, last: p.nextSeq - 1})
	cs.postRecv(slot)
	return true, nil
}

// flush writes the records framed since the last flush to the log, makes
// them visible to the senders, and asks for an fsync.
func (p *primary) flush() error {
	b, last := p.cache.pendingBytes()
	if len(b) == 0 {
		return nil
	}
	if err := p.m.log.append(b); err != nil {
		return err
	}
	p.cache.publish()
	p.mu.Lock()
	p.visible = last
	p.mu.Unlock()
	p.m.log.requestSync()
	p.wakeSenders()
	return nil
}
