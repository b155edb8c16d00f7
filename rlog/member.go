package rlog

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// Member is one member of a log: its data directory, its listener, and
// the role it plays — replica, or primary.
type Member struct {
	cfg     Config
	self    int
	cluster uint64
	log     *diskLog
	vctx    *verbs.Context
	pd      *verbs.PD
	l       *cm.Listener
	ctx     context.Context
	cancel  context.CancelFunc

	// authSlots bounds the member connections proving themselves at
	// once, and roleMu puts the proved ones' effects (promises, role
	// changes) in order.
	authSlots chan struct{}
	roleMu    sync.Mutex

	mu      sync.Mutex // guards what follows
	st      memberState
	recv    *receiver // the replicate session, if one is up
	prim    *primary  // the primary role, when this member is the primary
	sources map[*sender]struct{}
	closed  bool

	wg sync.WaitGroup // the accept loop and the sessions
}

// Start opens the member's data directory (checking its log and
// truncating a torn tail), listens at cfg.Listen, and serves as a
// replica; with cfg.Primary it first promotes itself (see the package
// documentation) and serves as the primary. ctx bounds the promotion.
func Start(ctx context.Context, cfg Config) (*Member, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	m := &Member{cfg: cfg, cluster: clusterID(cfg.Members), sources: map[*sender]struct{}{},
		authSlots: make(chan struct{}, maxPendingAuth)}
	for i, a := range cfg.Members {
		if a == cfg.Listen {
			m.self = i
		}
	}
	var err error
	if m.log, err = openLog(cfg.Dir, logOptions{segmentBytes: cfg.SegmentBytes, retain: cfg.RetainSegments, noSync: cfg.NoSync, hooks: cfg.hooks}); err != nil {
		return nil, err
	}
	if m.log.torn > 0 {
		cfg.Logf("rlog: %s: truncated a torn tail of %d bytes", cfg.Dir, m.log.torn)
	}
	fail := func(err error) (*Member, error) {
		if m.l != nil {
			m.l.Close()
		}
		if m.vctx != nil {
			m.vctx.Close()
		}
		m.log.close()
		return nil, err
	}
	if m.st, err = loadState(cfg.Dir, cfg.NoSync); err != nil {
		return fail(err)
	}
	dev, err := cm.Device(cfg.Listen)
	if err != nil {
		return fail(err)
	}
	if m.vctx, err = verbs.Open(dev); err != nil {
		return fail(err)
	}
	if m.pd, err = m.vctx.AllocPD(); err != nil {
		return fail(err)
	}
	if m.l, err = cm.Listen(cfg.Listen); err != nil {
		return fail(err)
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.wg.Add(2)
	go m.acceptLoop()
	go m.watchEvents()
	if cfg.Primary {
		if err := m.Promote(ctx); err != nil {
			m.Close()
			return nil, err
		}
	}
	return m, nil
}

// Addr is the address the member listens at.
func (m *Member) Addr() string { return m.cfg.Listen }

// ID is the member's identity, kept in its data directory.
func (m *Member) ID() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.st.id
}

// Status describes a member.
type Status struct {
	ID uint64
	// Primary says the member serves as the primary, in Epoch.
	Primary bool
	// Epoch is the epoch the member has promised (and, as primary, its
	// own).
	Epoch uint64
	// First, Last and Durable are sequence numbers of the member's log:
	// the first record kept, the last written, and the last on stable
	// storage; LastEpoch is the epoch of the last record.
	First, Last, Durable, LastEpoch uint64
	// Commit is, on the primary, the last record a quorum holds durably.
	Commit uint64
	// Replicas are, on the primary, the other members as it sees them.
	Replicas []ReplicaStatus
	// Err is set when the log failed (a write or sync error).
	Err error
}

// ReplicaStatus is the primary's view of a replica.
type ReplicaStatus struct {
	Addr      string
	Connected bool
	// Durable is the last record the replica reported durable.
	Durable uint64
	// Sent is the last record pushed to it.
	Sent uint64
	// Nacks counts the batches it refused (and that were sent again).
	Nacks int64
	// FromLog counts the batches read from the primary's segment files
	// because they were no longer in its memory (catching up).
	FromLog int64
	// Err is why its last connection ended, if it did.
	Err string
}

// Status returns the member's status.
func (m *Member) Status() Status {
	m.mu.Lock()
	s := Status{ID: m.st.id, Epoch: m.st.epoch}
	p := m.prim
	m.mu.Unlock()
	s.Last, s.LastEpoch = m.log.Last()
	s.First, s.Durable, s.Err = m.log.First(), m.log.Durable(), m.log.Err()
	if p != nil {
		s.Primary = true
		p.status(&s)
	}
	return s
}

// Close stops the member: it closes its connections and its log (without
// a final sync: what was written and not synced is in the page cache, as
// after a crash of the process).
func (m *Member) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	p, r := m.prim, m.recv
	m.prim, m.recv = nil, nil
	var srcs []*sender
	for s := range m.sources {
		srcs = append(srcs, s)
	}
	m.mu.Unlock()
	m.cancel()
	m.l.Close()
	if p != nil {
		p.stop(ErrClosed)
	}
	if r != nil {
		r.stop()
	}
	for _, s := range srcs {
		s.stop()
	}
	m.wg.Wait()
	m.vctx.Close()
	return m.log.close()
}

// watchEvents reports the device's asynchronous events (a QP that moved
// to the error state on its own, a CQ overrun) among the diagnostics.
func (m *Member) watchEvents() {
	defer m.wg.Done()
	for {
		select {
		case ev := <-m.vctx.Events():
			what := ""
			if qp, ok := ev.Element.(*verbs.QP); ok {
				what = fmt.Sprintf(" on QP %d", qp.Num())
			}
			m.cfg.Logf("rlog: %s: device event: %v%s", m.cfg.Listen, ev.Type, what)
		case <-m.ctx.Done():
			return
		}
	}
}

// acceptLoop serves connection requests, one at a time. A client's is
// answered here; a member's is accepted with this member's proof only,
// and what it asks for is done once it has proved itself (see auth.go),
// in the order the proofs arrive.
func (m *Member) acceptLoop() {
	defer m.wg.Done()
	for {
		req, err := m.l.Accept(m.ctx)
		if err != nil {
			if m.ctx.Err() != nil {
				return
			}
			continue
		}
		cmsg := connMsg(req.PrivateData())
		if !cmsg.valid() {
			refuse(req, kindClient, codeProtocol)
			continue
		}
		var code uint8
		if cmsg.kind() == kindClient {
			code = m.acceptClient(req, newConnMsg(kindClient))
		} else {
			code = m.admitMember(req, cmsg)
		}
		if code != codeOK {
			refuse(req, cmsg.kind(), code)
		}
	}
}

// refuse rejects a connection request with a status and nothing else.
func refuse(req *cm.Request, kind, code uint8) {
	reply := newConnMsg(kind)
	reply.setStatus(code)
	req.Reject(reply)
}

// saneRing reports whether a ring of buffers buffers of size bytes is
// within the limits a member accepts.
func saneRing(buffers, size int) bool {
	return buffers >= 1 && buffers <= maxBuffers && size >= 4096 && size <= maxBufferSize && size%frameAlign == 0
}

// admitMember accepts a member's connection request with this member's
// proof, and serves it once the dialer has proved itself. Nothing about
// this member's state, and no memory, is given before that.
func (m *Member) admitMember(req *cm.Request, cmsg connMsg) uint8 {
	kind := cmsg.kind()
	if cmsg.cluster() != m.cluster {
		return codeCluster
	}
	if i := cmsg.index(); i >= len(m.cfg.Members) || i == m.self {
		return codeProtocol
	}
	if kind != kindFence && (!saneRing(cmsg.buffers(), cmsg.bufSize()) || cmsg.mode() > ModeSend) {
		return codeProtocol
	}
	select {
	case m.authSlots <- struct{}{}:
	default:
		return codeTooManyConns
	}
	var once sync.Once
	release := func() { once.Do(func() { <-m.authSlots }) }
	var (
		k   *link
		r   *receiver
		s   *sender
		err error
	)
	switch kind {
	case kindFence:
		k, err = newLink(m, 0, verbs.QPCap{})
	case kindReplicate:
		if r, err = newReceiver(m, cmsg.mode(), cmsg.buffers(), cmsg.bufSize(), cmsg.epoch(), 0); err == nil {
			k = r.k
		}
	case kindFetch:
		if s, err = newSender(m, nil, -1, cmsg.mode(), ringInfo{buffers: cmsg.buffers(), bufSize: cmsg.bufSize()}); err == nil {
			k = s.k
		}
	}
	if err != nil {
		release()
		m.cfg.Logf("rlog: %s: a member's connection: %v", m.cfg.Listen, err)
		return codeUnavailable
	}
	closeAll := func() {
		switch {
		case r != nil:
			r.close()
		case s != nil:
			s.close()
		default:
			k.close()
		}
	}
	p, err := m.acceptMember(req, cmsg, k)
	if err != nil {
		closeAll()
		release()
		return codeOK // the requester is gone; nothing to answer
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		auth, err := p.verify(m.ctx, m.authTimeout(), m.cfg.Secret, m.self)
		release()
		if err != nil {
			closeAll()
			if m.ctx.Err() == nil {
				m.cfg.Logf("rlog: %s: refused a connection (kind %d) from a peer claiming to be member %d: %v", m.cfg.Listen, kind, cmsg.index(), err)
			}
			return
		}
		switch kind {
		case kindFence:
			m.serveFence(p)
			k.close()
		case kindReplicate:
			m.serveReplicate(p, r)
		case kindFetch:
			m.serveFetch(p, s, auth)
		}
	}()
	return codeOK
}

// promise checks that a request of epoch e from member id may be served
// under the member's promise, and records a new promise if e is newer.
// A primary of an older epoch than e steps down. m.mu is held.
func (m *Member) promiseLocked(e, id uint64) uint8 {
	if e < m.st.epoch || (e == m.st.epoch && id != m.st.holder) {
		return codeFenced
	}
	if m.closed {
		return codeShutdown
	}
	if e > m.st.epoch || id != m.st.holder {
		st := m.st
		st.epoch, st.holder = e, id
		if err := saveState(m.cfg.Dir, st, m.cfg.NoSync); err != nil {
			m.cfg.Logf("rlog: %s: %v", m.cfg.Listen, err)
			return codeStorage
		}
		m.st = st
	}
	return codeOK
}

// stepDown ends the primary role and the replicate session ahead of a
// newer epoch; m.mu is held and is released while they stop.
func (m *Member) stopRolesLocked(why error) {
	p, r := m.prim, m.recv
	m.prim, m.recv = nil, nil
	m.mu.Unlock()
	if p != nil {
		m.cfg.Logf("rlog: %s: stepping down as primary of epoch %d: %v", m.cfg.Listen, p.epoch, why)
		p.stop(why)
	}
	if r != nil {
		r.stop()
	}
	m.mu.Lock()
}

// serveFence answers a promoter that proved itself: if its epoch is
// newer than any this member promised, the member promises it — ending
// its replicate session and, if it was primary, its primary role — and
// tells the promoter how long its log is.
func (m *Member) serveFence(p *pendingMember) {
	cmsg := p.req
	reply := newConnMsg(kindFence)
	m.roleMu.Lock()
	m.mu.Lock()
	e, id := cmsg.epoch(), cmsg.member()
	if e < m.st.epoch || (e == m.st.epoch && id != m.st.holder) {
		reply.setStatus(codeFenced)
	} else if m.prim != nil && m.prim.epoch == e {
		reply.setStatus(codeFenced) // our own epoch: not for another member
	} else {
		m.stopRolesLocked(ErrFenced)
		reply.setStatus(m.promiseLocked(e, id))
	}
	reply.setEpoch(m.st.epoch)
	m.mu.Unlock()
	m.roleMu.Unlock()
	last, lastEpoch := m.log.Last()
	reply.setA(last)
	reply.setB(lastEpoch)
	p.answer(m.ctx, m.cfg.Secret, m.self, reply)
}

// refuseProved answers a member that proved itself with code and this
// member's epoch.
func (m *Member) refuseProved(p *pendingMember, code uint8) {
	reply := newConnMsg(p.req.kind())
	m.mu.Lock()
	reply.setEpoch(m.st.epoch)
	m.mu.Unlock()
	reply.setStatus(code)
	p.answer(m.ctx, m.cfg.Secret, m.self, reply)
}

// serveReplicate serves a primary that proved itself: it replaces the
// current replicate session with one for the new primary.
func (m *Member) serveReplicate(p *pendingMember, r *receiver) {
	cmsg := p.req
	e, id := cmsg.epoch(), cmsg.member()
	m.roleMu.Lock()
	code := m.admitReplicate(e, id)
	if code == codeOK {
		if err := r.prepare(); err != nil {
			m.cfg.Logf("rlog: %s: replicate session: %v", m.cfg.Listen, err)
			code = codeUnavailable
		}
	}
	if code == codeOK && r.mode == ModeWrite {
		if err := r.k.allowRemoteWrite(); err != nil {
			m.cfg.Logf("rlog: %s: replicate session: %v", m.cfg.Listen, err)
			code = codeUnavailable
		}
	}
	if code != codeOK {
		m.roleMu.Unlock()
		m.refuseProved(p, code)
		r.close()
		return
	}
	reply := newConnMsg(kindReplicate)
	reply.setRing(r.ring)
	reply.setEpoch(e)
	if err := p.answer(m.ctx, m.cfg.Secret, m.self, reply); err != nil {
		m.roleMu.Unlock()
		r.close()
		return
	}
	m.mu.Lock()
	if m.closed || m.st.epoch != e || m.st.holder != id {
		m.mu.Unlock()
		m.roleMu.Unlock()
		r.close()
		return
	}
	m.recv = r
	m.mu.Unlock()
	m.roleMu.Unlock()
	err := r.run()
	m.mu.Lock()
	if m.recv == r {
		m.recv = nil
	}
	m.mu.Unlock()
	r.close()
	if err != nil && !errors.Is(err, context.Canceled) {
		m.cfg.Logf("rlog: %s: replicate session with the primary of epoch %d ended: %v", m.cfg.Listen, e, err)
	}
}

// admitReplicate checks a primary's epoch, promises it, and ends the
// roles it fences.
func (m *Member) admitReplicate(e, id uint64) uint8 {
	if err := m.log.Err(); err != nil {
		return codeStorage
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.prim != nil && m.prim.epoch >= e {
		return codeFenced
	}
	if code := m.promiseLocked(e, id); code != codeOK {
		return code
	}
	m.stopRolesLocked(ErrFenced)
	return codeOK
}

// serveFetch streams a promoter that proved itself, and that this member
// has promised its epoch to, the records it lacks, into the ring its
// AUTH granted.
func (m *Member) serveFetch(p *pendingMember, s *sender, auth msg) {
	cmsg := p.req
	m.mu.Lock()
	ok := cmsg.epoch() == m.st.epoch && cmsg.member() == m.st.holder && !m.closed
	m.mu.Unlock()
	if !ok {
		m.refuseProved(p, codeFenced)
		s.close()
		return
	}
	s.remote.addr, s.remote.rkey = auth.authRing()
	reply := newConnMsg(kindFetch)
	reply.setEpoch(cmsg.epoch())
	if err := p.answer(m.ctx, m.cfg.Secret, m.self, reply); err != nil {
		s.close()
		return
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		s.close()
		return
	}
	m.sources[s] = struct{}{}
	m.mu.Unlock()
	err := s.run()
	m.mu.Lock()
	delete(m.sources, s)
	m.mu.Unlock()
	s.close()
	if err != nil && !errors.Is(err, errPeerGone) && !errors.Is(err, context.Canceled) {
		m.cfg.Logf("rlog: %s: fetch session: %v", m.cfg.Listen, err)
	}
}

// acceptClient hands a client's connection to the primary role.
func (m *Member) acceptClient(req *cm.Request, reply connMsg) uint8 {
	m.mu.Lock()
	p := m.prim
	m.mu.Unlock()
	if p == nil || p.failed() {
		// A role that failed takes no client while it stops (and its
		// stop holds the client lock while it closes the others).
		return codeNotPrimary
	}
	return p.acceptClient(req, reply)
}

// fenceAnswer is a member's answer to a fence.
type fenceAnswer struct {
	idx             int
	addr            string
	code            uint8
	epoch           uint64
	last, lastEpoch uint64
	err             error
}

// fence asks member i to promise epoch e to this member.
func (m *Member) fence(ctx context.Context, i int, e uint64) fenceAnswer {
	ans := fenceAnswer{idx: i, addr: m.cfg.Members[i]}
	k, err := newLink(m, 0, verbs.QPCap{})
	if err != nil {
		ans.err = err
		return ans
	}
	defer k.close()
	req := newConnMsg(kindFence)
	req.setEpoch(e)
	r, err := m.dialMember(ctx, k, i, req, nil)
	if err != nil {
		ans.err = err
		return ans
	}
	ans.code, ans.epoch, ans.last, ans.lastEpoch = r.status(), r.epoch(), r.a(), r.b()
	if ans.code == codeOK && (ans.epoch != e || (ans.last > 0 && ans.lastEpoch == 0) || ans.lastEpoch > e) {
		ans.err = fmt.Errorf("%w: %s answered a fence of epoch %d with epoch %d, last record %d of epoch %d", ErrProtocol, ans.addr, e, ans.epoch, ans.last, ans.lastEpoch)
	}
	return ans
}

// Promote makes the member the primary, explicitly: it picks an epoch
// newer than any it knows of, has a majority of the members (itself
// included) promise it, and — if one of them holds a log that is ahead of
// its own (by the epoch of the last record, then by length) — fetches the
// missing records from it. Only then does it serve as primary. A member
// that promised the new epoch refuses records from the old primary, which
// can therefore acknowledge nothing more. ctx bounds the whole promotion
// (and Config.PromoteTimeout does too).
func (m *Member) Promote(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.PromoteTimeout)
	defer cancel()
	seen := uint64(0)
	backoff := 20 * time.Millisecond
	var whole error // why the last attempt that ran its course failed
	for {
		e, err := m.promoteOnce(ctx, &seen)
		if err == nil {
			return m.becomePrimary(e)
		}
		if !errors.Is(err, ErrNoQuorum) && !errors.Is(err, ErrFenced) && !errors.Is(err, ErrUnavailable) {
			return err
		}
		if ctx.Err() == nil || whole == nil {
			whole = err
		}
		m.cfg.Logf("rlog: %s: promotion: %v; trying again", m.cfg.Listen, err)
		select {
		case <-ctx.Done():
			// An attempt that the deadline cut short says less than
			// the one before it.
			return fmt.Errorf("%w (promotion gave up: %w)", whole, ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// promoteOnce is one attempt at a promotion; it returns the new epoch.
func (m *Member) promoteOnce(ctx context.Context, seen *uint64) (uint64, error) {
	m.mu.Lock()
	for p := m.prim; p != nil && p.failed(); p = m.prim {
		// A role that failed on its own is stopping: wait for it.
		m.mu.Unlock()
		p.stop(p.endErr())
		m.mu.Lock()
	}
	if m.prim != nil {
		m.mu.Unlock()
		return 0, errors.New("rlog: already the primary")
	}
	_, lastEpoch := m.log.Last()
	e := max(m.st.epoch, lastEpoch, *seen) + 1
	m.stopRolesLocked(ErrFenced)
	if code := m.promiseLocked(e, m.st.id); code != codeOK {
		m.mu.Unlock()
		return 0, codeError(code, "promising the new epoch to itself")
	}
	m.mu.Unlock()
	answers := make([]fenceAnswer, len(m.cfg.Members))
	var wg sync.WaitGroup
	for i := range m.cfg.Members {
		if i == m.self {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers[i] = m.fence(ctx, i, e)
		}()
	}
	wg.Wait()
	last, lastEpoch := m.log.Last()
	best := fenceAnswer{idx: m.self, addr: m.cfg.Listen, last: last, lastEpoch: lastEpoch}
	promised := 1
	var why []error
	for i, a := range answers {
		if i == m.self {
			continue
		}
		switch {
		case a.err != nil:
			why = append(why, fmt.Errorf("%s: %w", a.addr, a.err))
		case a.code == codeFenced:
			*seen = max(*seen, a.epoch)
			why = append(why, fmt.Errorf("%s has promised epoch %d: %w", a.addr, a.epoch, ErrFenced))
		case a.code != codeOK:
			why = append(why, fmt.Errorf("%s: %w", a.addr, codeError(a.code, "")))
		default:
			promised++
			if a.lastEpoch > best.lastEpoch || (a.lastEpoch == best.lastEpoch && a.last > best.last) {
				best = a
			}
		}
	}
	need := len(m.cfg.Members)/2 + 1
	if promised < need {
		return 0, fmt.Errorf("%w: %d of %d members promised epoch %d, %d needed: %w", ErrNoQuorum, promised, len(m.cfg.Members), e, need, errors.Join(why...))
	}
	if best.addr != m.cfg.Listen {
		m.cfg.Logf("rlog: %s: promotion to epoch %d: %s is ahead (last record %d of epoch %d; ours %d of epoch %d): fetching",
			m.cfg.Listen, e, best.addr, best.last, best.lastEpoch, last, lastEpoch)
		if err := m.fetch(ctx, best, e); err != nil {
			return 0, fmt.Errorf("rlog: promotion: fetching from %s: %w", best.addr, err)
		}
		if l, le := m.log.Last(); l != best.last || le != best.lastEpoch {
			return 0, fmt.Errorf("%w: after fetching from %s the log ends at %d (epoch %d), not %d (epoch %d)", ErrUnavailable, best.addr, l, le, best.last, best.lastEpoch)
		}
	}
	return e, nil
}

// fetch pulls records from the member that answered a, until this
// member's log equals a's as it was when it answered.
func (m *Member) fetch(ctx context.Context, a fenceAnswer, e uint64) error {
	r, err := newReceiver(m, m.cfg.Mode, m.cfg.Buffers, m.cfg.BufferSize, e, a.last)
	if err != nil {
		return err
	}
	defer r.close()
	if err := r.prepare(); err != nil {
		return err
	}
	req := newConnMsg(kindFetch)
	req.setEpoch(e)
	req.setBuffers(r.ring.buffers)
	req.setBufSize(r.ring.bufSize)
	req.setMode(m.cfg.Mode)
	var grant *ringInfo
	if r.mode == ModeWrite {
		grant = &r.ring
	}
	reply, err := m.dialMember(ctx, r.k, a.idx, req, grant)
	if err != nil {
		return err
	}
	if reply.status() != codeOK {
		return answerError(reply)
	}
	stop := context.AfterFunc(ctx, r.stopNoWait)
	defer stop()
	return r.run()
}

// rejectError turns a refused connection into the error its status
// code names.
func rejectError(err error) error {
	var rej *cm.RejectError
	if errors.As(err, &rej) {
		if r := connMsg(rej.PrivateData); r.valid() && r.status() != codeOK {
			return codeError(r.status(), "")
		}
		return fmt.Errorf("%w: the peer rejected the connection with %d bytes that are not an answer", ErrProtocol, len(rej.PrivateData))
	}
	return fmt.Errorf("%w: %w", ErrUnavailable, err)
}

// answerError turns a member's answer of another status than codeOK into
// the error its status code names.
func answerError(r connMsg) error {
	return codeError(r.status(), fmt.Sprintf("the member's epoch is %d", r.epoch()))
}

// becomePrimary starts the primary role in epoch e.
func (m *Member) becomePrimary(e uint64) error {
	p, err := newPrimary(m, e)
	if err != nil {
		return err
	}
	m.mu.Lock()
	if m.closed || m.st.epoch != e || m.st.holder != m.st.id {
		m.mu.Unlock()
		p.stop(ErrFenced)
		return fmt.Errorf("%w: another promotion overtook this one", ErrFenced)
	}
	m.prim = p
	m.wg.Add(1)
	m.mu.Unlock()
	go func() {
		defer m.wg.Done()
		p.supervise()
	}()
	last, _ := m.log.Last()
	m.cfg.Logf("rlog: %s: primary of epoch %d, log ends at record %d", m.cfg.Listen, e, last)
	p.start()
	return nil
}

// receivedSlot returns the receive a completion names and the message
// it brought: slot names one of n receives posted in buf, size bytes
// each, and the completion's byte count cuts it. Neither is taken on
// trust: over shm0 the peer writes the completions of its Sends into
// this side's CQ.
func receivedSlot(wc *verbs.WorkCompletion, slot uint64, n, size int, buf []byte) (int, []byte, error) {
	if slot >= uint64(n) {
		return 0, nil, errMsg("a receive completion names receive %d, of %d posted", slot, n)
	}
	i := int(slot)
	b, err := verbs.Received(wc, buf[i*size:(i+1)*size])
	if err != nil {
		return 0, nil, &ProtocolError{Reason: err.Error()}
	}
	return i, b, nil
}

// link is a connection's verbs resources: a CQ, a QP on it, the regions
// registered for it, and the cm connection once there is one.
type link struct {
	m    *Member
	cq   *verbs.CQ
	qp   *verbs.QP
	conn *cm.Conn
	mrs  []*verbs.MR
	once sync.Once
	// hs is the membership handshake's buffer (one receive, posted
	// first, and one send), and stash the session's completions the
	// handshake polled.
	hs    *verbs.MR
	stash []verbs.WorkCompletion
}

// newLink creates a CQ and a QP in Init, ready for receives to be posted
// before it connects, with the membership handshake's receive posted
// first (one more receive, send and two more completions than asked).
// The QP refuses every remote operation: a link's peer may write into
// the member's memory only once allowRemoteWrite says so, after the
// peer has proved that it is a member.
func newLink(m *Member, cqe int, qcap verbs.QPCap) (*link, error) {
	k := &link{m: m}
	var err error
	if k.cq, err = m.vctx.CreateCQ(cqe + 2); err != nil {
		return nil, err
	}
	qcap.MaxSendWR++
	qcap.MaxRecvWR++
	qcap.MaxSendSGE, qcap.MaxRecvSGE = max(qcap.MaxSendSGE, 1), max(qcap.MaxRecvSGE, 1)
	ep, err := cm.NewEndpointAccess(m.pd, verbs.QPInitAttr{SendCQ: k.cq, RecvCQ: k.cq, Cap: qcap}, verbs.AccessLocalWrite)
	if err != nil {
		k.cq.Destroy()
		return nil, err
	}
	k.qp = ep.QP()
	if k.hs, err = k.alloc(2*hsSlot, verbs.AccessLocalWrite); err != nil {
		k.close()
		return nil, err
	}
	if _, err = k.qp.PostRecv([]verbs.RecvWR{{WRID: hsWRID, SGList: []verbs.SGE{k.hs.SGE(0, hsSlot)}}}); err != nil {
		k.close()
		return nil, err
	}
	return k, nil
}

// allowRemoteWrite lets the link's connected peer RDMA-Write the
// member's memory regions that allow it (the ring of a ModeWrite
// receiver); call it only once the peer has proved that it is a member.
func (k *link) allowRemoteWrite() error {
	a := verbs.QPAttr{AccessFlags: verbs.AccessLocalWrite | verbs.AccessRemoteWrite}
	if err := k.qp.Modify(&a, verbs.QPAttrAccessFlags); err != nil {
		return fmt.Errorf("rlog: grant the peer remote write: %w", err)
	}
	return nil
}

// alloc registers size bytes for the link.
func (k *link) alloc(size int, access verbs.AccessFlags) (*verbs.MR, error) {
	mr, err := k.m.pd.AllocMR(size, access)
	if err != nil {
		return nil, fmt.Errorf("rlog: register %d bytes: %w", size, err)
	}
	k.mrs = append(k.mrs, mr)
	return mr, nil
}

// disconnect breaks the connection, flushing the QP's work requests.
func (k *link) disconnect() {
	if k.conn != nil {
		k.conn.Close()
	}
}

// close disconnects and releases the link's resources.
func (k *link) close() {
	k.once.Do(func() {
		k.disconnect()
		if k.qp != nil {
			k.qp.Destroy()
		}
		if k.cq != nil {
			k.cq.Destroy()
		}
		for _, mr := range k.mrs {
			mr.Dereg()
		}
	})
}

// spinPolls is how many times a loop polls its CQ before it sleeps.
const spinPolls = 64

// waitCQ returns the completions on cq, polling a little and then
// sleeping until one arrives, a token arrives on a or b, or ctx ends.
func waitCQ(ctx context.Context, cq *verbs.CQ, wc []verbs.WorkCompletion, a, b <-chan struct{}) (int, error) {
	for range spinPolls {
		if n := cq.Poll(wc); n > 0 {
			return n, nil
		}
	}
	if err := cq.Err(); err != nil {
		return 0, err
	}
	if err := cq.ReqNotify(false); err != nil {
		return 0, err
	}
	if n := cq.Poll(wc); n > 0 {
		return n, nil
	}
	select {
	case <-cq.Notify():
	case <-a:
	case <-b:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return cq.Poll(wc), nil
}

// errPeerGone: the connection broke (a flushed or failed work request).
var errPeerGone = errors.New("rlog: the connection broke")

// wcError describes a failed completion.
func wcError(wc verbs.WorkCompletion) error {
	if wc.Status == verbs.WCWRFlushErr {
		return errPeerGone
	}
	return fmt.Errorf("%w: %s completed with %s", errPeerGone, wc.Opcode, wc.Status)
}
