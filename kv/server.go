package kv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/internal/hmacauth"
	"github.com/goverbs/goverbs/mempool"
	"github.com/goverbs/goverbs/verbs"
)

// Config configures a Server. Zero fields take the defaults.
type Config struct {
	// Buckets is the number of index buckets (default 65536), and
	// SlotsPerBucket the slots in each (default 4, at most 64): the table
	// holds at most Buckets × SlotsPerBucket keys, and a PUT whose bucket
	// is full fails with ErrTableFull.
	Buckets        int
	SlotsPerBucket int
	// MaxValue is the largest value (default 64 KiB, at most
	// MaxValueLimit).
	MaxValue int
	// HeapBytes is the size of the value heap (default 64 MiB), split
	// among power-of-two size classes up to the largest record.
	HeapBytes int
	// Grace is how long a replaced record stays untouched before its
	// space is reused (default 100 ms).
	Grace time.Duration
	// RecvDepth is the receives posted per client connection (default
	// 16, at most 64: the server's CQs hold the completions of 64
	// clients' receives and replies at that depth).
	RecvDepth int
	// Spin is how long the serving loop keeps polling for the next
	// request after serving one, before it sleeps on the CQ (default
	// 1 ms; negative: it always sleeps). A PUT or DELETE that finds the
	// server awake skips the wake-up of a sleeping thread; the price is
	// a processor kept busy while requests come closer together than
	// Spin. On shm, CQ.Wait sleeps on the waiting goroutine's own
	// thread, so that wake-up costs little and a server that always
	// sleeps serves PUTs about as fast; measure with goverbs kv bench
	// before raising it. GETs never wake the server either way.
	Spin time.Duration
	// Authorizer decides which PUTs and DELETEs are applied (default:
	// all of them). TokenAuthorizer admits the clients that prove they
	// know a shared token; an Authorizer that is also a Keyring, the
	// clients that prove an identity of its own.
	Authorizer Authorizer
	// MaxClientsPerPeer bounds the clients one peer holds at once
	// (default 16, a quarter of the 64 a server takes), so that one peer
	// cannot take every client slot; a peer is a host on tcp://, a
	// process on shm:// (cm.Request.Peer). A client beyond it is refused
	// with ErrServerGone, whose message names the limit.
	MaxClientsPerPeer int
	// Listen configures the server's listener: how many failed remote
	// accesses a peer may make before its connections are refused for a
	// growing back-off, and, on shm://, which other users it trusts (the
	// zero value is cm's default for each).
	Listen cm.ListenConfig

	// slowWrites makes the server write slots and records a few bytes at
	// a time, yielding in between, so that tests can race GETs with
	// PUTs.
	slowWrites bool
	// slotTorn, with slowWrites, is called each time the server has
	// written the first word of an index slot and not the rest: until it
	// returns, the slot's version has moved on and its CRC has not, and
	// as the bytes that changed lie within 32 bits, which a CRC-32 always
	// detects, every read of the slot is torn. Tests block in it to read
	// a torn slot for certain.
	slotTorn func()
	// noWindows makes the server hand out its regions' own keys, as it
	// does on a device without memory windows.
	noWindows bool
}

func (c *Config) defaults() {
	if c.Buckets <= 0 {
		c.Buckets = 1 << 16
	}
	if c.SlotsPerBucket <= 0 {
		c.SlotsPerBucket = 4
	}
	c.SlotsPerBucket = min(c.SlotsPerBucket, 64)
	if c.MaxValue <= 0 {
		c.MaxValue = 64 << 10
	}
	if c.HeapBytes <= 0 {
		c.HeapBytes = 64 << 20
	}
	if c.Grace == 0 {
		c.Grace = 100 * time.Millisecond
	}
	if c.Spin == 0 {
		c.Spin = time.Millisecond
	}
	if c.RecvDepth <= 0 {
		c.RecvDepth = 16
	}
	c.RecvDepth = min(c.RecvDepth, maxRecvDepth)
	if c.Authorizer == nil {
		c.Authorizer = allowAll{}
	}
	if c.MaxClientsPerPeer <= 0 {
		c.MaxClientsPerPeer = maxClients / 4
	}
}

// The server takes at most maxClients clients at once, and posts at most
// maxRecvDepth receives for each, so that the completions of all of them
// fit its CQs (cqDepth): a client that keeps sending cannot overrun them.
const (
	maxClients   = 64
	maxRecvDepth = 64
	cqDepth      = maxClients * maxRecvDepth
)

// maxHandshakes bounds the connection requests the server answers at
// once, and maxPeerHandshakes those of one peer: a client that is slow to
// finish its handshake (1 s at most, see cm.Request.Accept) delays only
// the requests beyond that number, and one peer's requests beyond its
// share wait for that peer's own handshakes, not for other peers'.
const (
	maxHandshakes     = 8
	maxPeerHandshakes = 2
)

// maxMsg is the largest RPC message for the configured limits.
func (c *Config) maxMsg() int { return requestHeader + MaxKey + c.MaxValue }

// Server serves one kv table: its index and value heap in registered
// memory that clients read directly, and the PUT/DELETE RPCs.
type Server struct {
	cfg    Config
	ctx    *verbs.Context
	pd     *verbs.PD
	index  *verbs.MR
	heap   *mempool.Pool
	msgs   *mempool.Pool // reply buffers (each client's receive buffers are its own region)
	sendCQ *verbs.CQ
	recvCQ *verbs.CQ
	l      *cm.Listener

	// heapMRs are the heap's regions, one per size class, by the
	// number a slot names its record's region with.
	heapMRs []*verbs.MR
	// windows says each client reads through windows of its own (the
	// device has memory windows); otherwise through the regions' keys.
	windows bool

	mu      sync.Mutex // guards what follows (the table is written under it)
	conns   map[uint32]*serverConn
	clients int                 // clients admitted: connected or in their handshake
	peers   map[string]*peerUse // what each named peer holds
	version uint64
	records map[int]mempool.Buf // heap record of each slot, by slot number
	limbo   []retired
	closed  bool

	// grantBuf, heapKeys and drain serve grant and the polls of the
	// send CQ, under mu.
	grantBuf [grantHeader + 4*maxHeapRegions]byte
	heapKeys [maxHeapRegions]uint32
	drain    []verbs.WorkCompletion

	scratch  [SlotSize]byte
	wg       sync.WaitGroup // the serving loop and the connection watchers
	acceptWG sync.WaitGroup
	stop     context.CancelFunc

	// Puts, Dels and Gets count the RPCs served (Gets: fallback GETs).
	Puts, Dels, Gets atomic.Int64
}

type retired struct {
	buf mempool.Buf
	at  time.Time
}

// peerUse is what one peer holds: clients admitted (connected or in
// their handshake), and the slots of its handshakes under way.
type peerUse struct {
	clients    int
	handshakes chan struct{}
}

type serverConn struct {
	qp   *verbs.QP
	conn *cm.Conn
	peer string // cm.Request.Peer
	// hello and info are the connection's request and acceptance, which
	// the client's proof of its identity covers (nil hello: a client
	// that can prove nothing).
	hello hello
	info  info
	// proven says the client proved it holds the secret of
	// hello.identity(); authTried that it made its one attempt.
	proven, authTried bool
	// lastID is the id of the last request served: a request must
	// carry a greater one, so that one replayed (over shm0 a client's
	// process writes the completion of its Send, and may write it
	// again) is refused.
	lastID uint64
	// posted has bit i set while receive i is posted: a completion of a
	// receive that is not is no completion of this connection's.
	posted uint64
	// recvMR holds this client's receive buffers and nothing else: the
	// region a Send of this client lands in reaches no other client's
	// requests.
	recvMR *verbs.MR
	// windows are this client's read-only type 2 windows, over the
	// index and then over each heap region, bound to its QP by its
	// grant request and deallocated when it goes (nil on a device
	// without memory windows). served counts its requests: a grant is
	// its first.
	windows []*verbs.MW
	served  uint64
	// failed says a receive of the connection was flushed: its QP has
	// failed, and the connection is closed.
	failed bool
	// ready says Accept has returned, the QP is in RTS and may reply;
	// requests that arrive before (the QP may receive in RTR) wait in
	// pending.
	ready   bool
	pending []verbs.WorkCompletion
	recvs   [][]byte      // receive buffers in recvMR, by receive WRID
	reply   []mempool.Buf // reply buffer of each receive
}

// Listen creates a server and starts serving clients at addr (for
// example shm://@kv or tcp://:7000).
func Listen(addr string, cfg Config) (*Server, error) {
	cfg.defaults()
	if cfg.MaxValue > MaxValueLimit {
		return nil, fmt.Errorf("kv: MaxValue %d is more than MaxValueLimit (%d bytes): store larger values in pieces", cfg.MaxValue, MaxValueLimit)
	}
	dev, err := cm.Device(addr)
	if err != nil {
		return nil, err
	}
	ctx, err := verbs.Open(dev)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, ctx: ctx, conns: map[uint32]*serverConn{}, peers: map[string]*peerUse{}, records: map[int]mempool.Buf{},
		drain: make([]verbs.WorkCompletion, 64)}
	if err := s.setup(addr); err != nil {
		ctx.Close()
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.Background())
	s.stop = cancel
	s.wg.Add(1)
	s.acceptWG.Add(1)
	go s.acceptLoop(rctx)
	go s.serveLoop(rctx)
	return s, nil
}

// regionAccess is the access of the index and heap regions. With
// windows, no client is given a region's own key: each reads through
// windows bound to its connection alone, and a bind needs only
// AccessMWBind on the region (a window's remote rights are its own), so
// the regions carry no remote right and their keys reach nothing.
func regionAccess(windows bool) verbs.AccessFlags {
	if windows {
		return verbs.AccessLocalWrite | verbs.AccessMWBind
	}
	return verbs.AccessLocalWrite | verbs.AccessRemoteRead
}

func (s *Server) setup(addr string) error {
	var err error
	if s.pd, err = s.ctx.AllocPD(); err != nil {
		return err
	}
	s.windows = s.ctx.QueryDevice().Has(verbs.CapMemoryWindows) && !s.cfg.noWindows
	access := regionAccess(s.windows)
	size := s.cfg.Buckets * s.cfg.SlotsPerBucket * SlotSize
	if s.index, err = s.pd.AllocMR(size, access); err != nil {
		return fmt.Errorf("kv: register the index (%d bytes): %w", size, err)
	}
	for i := 0; i < len(s.index.Bytes()); i += SlotSize {
		slot(s.index.Bytes()[i : i+SlotSize]).setEmpty(0)
	}
	classes := heapClasses(s.cfg)
	if s.heap, err = mempool.New(s.pd, mempool.Config{Classes: classes, Access: access}); err != nil {
		return fmt.Errorf("kv: register the value heap: %w", err)
	}
	// The pool takes the smallest class with a free buffer: while all
	// are free, a Get of each class's size finds that class's region.
	for _, c := range classes {
		b, err := s.heap.Get(c.Size)
		if err != nil {
			return fmt.Errorf("kv: find the value heap's regions: %w", err)
		}
		s.heapMRs = append(s.heapMRs, b.MR())
		s.heap.Put(b)
	}
	msgCount := s.cfg.RecvDepth * maxClients
	if s.msgs, err = mempool.New(s.pd, mempool.Config{Classes: []mempool.Class{{Size: s.cfg.maxMsg(), Count: msgCount}}, Access: verbs.AccessLocalWrite}); err != nil {
		return fmt.Errorf("kv: register reply buffers: %w", err)
	}
	if s.sendCQ, err = s.ctx.CreateCQ(cqDepth); err != nil {
		return err
	}
	if s.recvCQ, err = s.ctx.CreateCQ(cqDepth); err != nil {
		return err
	}
	s.l, err = cm.ListenWith(addr, s.cfg.Listen)
	return err
}

// heapClasses splits the heap among power-of-two classes from 64 bytes to
// the largest record, giving each class the same number of bytes.
func heapClasses(cfg Config) []mempool.Class {
	var sizes []int
	for sz := 64; ; sz *= 2 {
		sizes = append(sizes, sz)
		if sz >= recordLen(MaxKey, cfg.MaxValue) {
			break
		}
	}
	per := cfg.HeapBytes / len(sizes)
	var cs []mempool.Class // at most maxHeapRegions, for MaxValueLimit
	for _, sz := range sizes {
		cs = append(cs, mempool.Class{Size: sz, Count: max(per/sz, 4)})
	}
	return cs
}

// Addr is the address clients dial.
func (s *Server) Addr() string { return s.l.Addr() }

// Windows reports whether each client reads through memory windows of
// its own connection, revoked when it goes; if not (a device without
// memory windows), every client reads with the regions' own keys, good
// until the server closes.
func (s *Server) Windows() bool { return s.windows }

func (s *Server) info() indexInfo {
	return indexInfo{slotsPerBucket: s.cfg.SlotsPerBucket, buckets: s.cfg.Buckets, maxMsg: s.cfg.maxMsg(),
		addr: s.index.Addr()}
}

// acceptLoop accepts clients: each gets a QP on the shared CQs, its
// receives posted in a region of its own, and the index description in
// the acceptance. A request beyond the server's or its peer's limits on
// clients is refused at once; the others are answered by a goroutine
// each, up to maxHandshakes at once and maxPeerHandshakes of one peer,
// so that the loop itself never waits for a peer.
func (s *Server) acceptLoop(ctx context.Context) {
	defer s.acceptWG.Done()
	slots := make(chan struct{}, maxHandshakes)
	for {
		req, err := s.l.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		peer := req.Peer()
		peerSlots, err := s.admit(peer)
		if err != nil {
			reject(req, err)
			continue
		}
		s.acceptWG.Add(1)
		go func() {
			defer s.acceptWG.Done()
			err := errServerClosing
			if acquire(ctx, peerSlots) {
				if acquire(ctx, slots) {
					err = s.accept(req, peer)
					release(slots)
				}
				release(peerSlots)
			}
			if err != nil {
				// Not a client after all; its peer's slots are free
				// before it stops counting.
				s.leave(peer)
				reject(req, err)
			}
		}()
	}
}

// acquire takes a slot of sem (nil: no limit), unless ctx ends first.
func acquire(ctx context.Context, sem chan struct{}) bool {
	if sem == nil {
		return true
	}
	select {
	case sem <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

func release(sem chan struct{}) {
	if sem != nil {
		<-sem
	}
}

// reject refuses req, saying why in the rejection's private data (56
// bytes at most), which the client's error shows.
func reject(req *cm.Request, why error) {
	msg := why.Error()
	req.Reject([]byte(msg[:min(len(msg), 56)]))
}

// Refusals of admit; each fits a rejection's private data.
var (
	errTooManyClients = errors.New("kv: server full (64 clients); retry later")
	errPeerClients    = errors.New("kv: too many clients of this peer; close one")
	errServerClosing  = errors.New("kv: the server is closing")
)

// admit counts a new client of peer, or says which limit refuses it, and
// returns the peer's handshake slots (nil for a peer the provider does
// not name: "", loop://, held to the server's limits alone).
func (s *Server) admit(peer string) (chan struct{}, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errServerClosing
	}
	if s.clients >= maxClients {
		return nil, errTooManyClients
	}
	var u *peerUse
	if peer != "" {
		if u = s.peers[peer]; u == nil {
			u = &peerUse{handshakes: make(chan struct{}, maxPeerHandshakes)}
			s.peers[peer] = u
		}
		if u.clients >= s.cfg.MaxClientsPerPeer {
			return nil, errPeerClients
		}
		u.clients++
	}
	s.clients++
	if u == nil {
		return nil, nil
	}
	return u.handshakes, nil
}

// leave forgets a client of peer that admit counted.
func (s *Server) leave(peer string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clients--
	if u := s.peers[peer]; u != nil {
		if u.clients--; u.clients == 0 {
			delete(s.peers, peer)
		}
	}
}

// accept answers the request of a client admitted for peer; the client
// is connected, and counted until drop, if it returns nil.
func (s *Server) accept(req *cm.Request, peer string) error {
	// The receives are posted before Accept connects the QP.
	// The send queue holds a reply per receive, or the grant's binds
	// (which complete before the grant's reply is posted).
	sendDepth := max(s.cfg.RecvDepth, 1+len(s.heapMRs))
	ep, err := cm.NewEndpointAccess(s.pd, verbs.QPInitAttr{SendCQ: s.sendCQ, RecvCQ: s.recvCQ,
		Cap: verbs.QPCap{MaxSendWR: uint32(sendDepth), MaxRecvWR: uint32(s.cfg.RecvDepth), MaxSendSGE: 1, MaxRecvSGE: 1}}, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	if err != nil {
		return err
	}
	qp := ep.QP()
	sc := &serverConn{qp: qp, peer: peer, hello: hello(req.PrivateData()).canonical()}
	var nonce [hmacauth.NonceLen]byte
	hmacauth.NewNonce(nonce[:])
	sc.info = s.info().encode(qp.Num(), nonce[:])
	fail := func(err error) error {
		s.revoke(sc)
		qp.Destroy()
		s.release(sc)
		return err
	}
	// Local write only: the client's Sends land in it, and nothing else
	// of the server's does.
	msg := s.cfg.maxMsg()
	if sc.recvMR, err = s.pd.AllocMR(s.cfg.RecvDepth*msg, verbs.AccessLocalWrite); err != nil {
		return fail(fmt.Errorf("kv: register a client's receive buffers: %w", err))
	}
	if s.windows {
		for range 1 + len(s.heapMRs) {
			mw, err := s.pd.AllocMW(verbs.MWType2)
			if err != nil {
				return fail(fmt.Errorf("kv: allocate a client's memory windows: %w", err))
			}
			sc.windows = append(sc.windows, mw)
		}
	}
	for i := range s.cfg.RecvDepth {
		pb, err := s.msgs.Get(msg)
		if err != nil {
			return fail(errTooManyClients)
		}
		sc.recvs, sc.reply = append(sc.recvs, sc.recvMR.Bytes()[i*msg:(i+1)*msg]), append(sc.reply, pb)
		if _, err := qp.PostRecv([]verbs.RecvWR{{WRID: uint64(i), SGList: []verbs.SGE{sc.recvMR.SGE(i*msg, msg)}}}); err != nil {
			return fail(err)
		}
		sc.posted |= 1 << i
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fail(errors.New("kv: the server is closing"))
	}
	s.conns[qp.Num()] = sc
	s.mu.Unlock()
	// Close destroys the QP of a handshake under way (sc not ready), so
	// that Accept ends at once.
	conn, err := req.Accept(qp, &cm.Param{PrivateData: sc.info})
	if err != nil {
		s.mu.Lock()
		delete(s.conns, qp.Num())
		s.mu.Unlock()
		return fail(err)
	}
	s.mu.Lock()
	sc.conn = conn
	sc.ready = true
	for _, wc := range sc.pending {
		s.serveLocked(sc, wc)
	}
	sc.pending = nil
	failed := sc.failed
	s.mu.Unlock()
	if failed {
		conn.Close() // the watcher below drops the client
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		<-conn.Done()
		s.drop(sc)
	}()
	return nil
}

// drop forgets a client whose connection ended.
func (s *Server) drop(sc *serverConn) {
	s.mu.Lock()
	if s.conns[sc.qp.Num()] != sc {
		s.mu.Unlock()
		return
	}
	delete(s.conns, sc.qp.Num())
	s.mu.Unlock()
	s.revoke(sc)
	sc.qp.Destroy()
	s.release(sc)
	s.leave(sc.peer)
}

// revoke deallocates a client's windows: access through their keys fails
// from then on. It comes before the client's QP is destroyed, since a
// type 2 window bound to a QP holds it (rxe waits for the window when the
// QP goes first).
func (s *Server) revoke(sc *serverConn) {
	for _, mw := range sc.windows {
		mw.Dealloc()
	}
	sc.windows = nil
}

// release gives back what a client held: its windows (revoke), its reply
// buffers and its receive region. Its QP is destroyed.
func (s *Server) release(sc *serverConn) {
	s.revoke(sc)
	for _, b := range sc.reply {
		s.msgs.Put(b)
	}
	if sc.recvMR != nil {
		sc.recvMR.Dereg()
	}
	sc.windows, sc.recvMR, sc.recvs, sc.reply = nil, nil, nil, nil
}

// serveLoop waits for requests and serves them one at a time, so that the
// table has a single writer.
func (s *Server) serveLoop(ctx context.Context) {
	defer s.wg.Done()
	wcs := make([]verbs.WorkCompletion, 32)
	for {
		n, err := s.nextRequests(ctx, wcs)
		if err != nil {
			return
		}
		for _, wc := range wcs[:n] {
			s.serve(wc)
		}
		// Under mu, so that a grant waiting for its binds' completions
		// (from the accept goroutine too) is the only one polling.
		s.mu.Lock()
		for s.sendCQ.Poll(s.drain) > 0 {
		}
		s.mu.Unlock()
	}
}

// nextRequests returns the next requests' completions: polling for up to
// cfg.Spin, then sleeping on the CQ.
func (s *Server) nextRequests(ctx context.Context, wcs []verbs.WorkCompletion) (int, error) {
	if s.cfg.Spin > 0 {
		deadline := time.Now().Add(s.cfg.Spin)
		for i := 1; ; i++ {
			if n := s.recvCQ.Poll(wcs); n > 0 {
				return n, nil
			}
			if i%32 == 0 && (time.Now().After(deadline) || ctx.Err() != nil) {
				break
			}
		}
	}
	return s.recvCQ.Wait(ctx, wcs)
}

// serve handles one received request and replies.
func (s *Server) serve(wc verbs.WorkCompletion) {
	if broken := s.serveOrBreak(wc); broken != nil {
		broken.Close() // its watcher drops the client
	}
}

// serveOrBreak serves a received request, or returns the connection of a
// client whose QP has failed.
func (s *Server) serveOrBreak(wc verbs.WorkCompletion) *cm.Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	// The client is the one whose QP the receive completed on, never
	// one that the request's bytes name.
	sc := s.conns[wc.QPNum]
	if sc == nil || wc.WRID >= uint64(len(sc.recvs)) || sc.posted&(1<<wc.WRID) == 0 {
		return nil // a flushed receive of a client that left, or a completion of no receive posted
	}
	sc.posted &^= 1 << wc.WRID
	if wc.Status != verbs.WCSuccess {
		// A receive flushed: the QP failed (the client made an access
		// it was refused, or broke the protocol), and a provider need
		// not end the connection for it. The client goes, and its
		// windows with it.
		if !sc.failed && sc.ready {
			sc.failed = true
			return sc.conn
		}
		sc.failed = true
		return nil
	}
	if !sc.ready {
		sc.pending = append(sc.pending, wc)
		return nil
	}
	s.serveLocked(sc, wc)
	return nil
}

// serveLocked serves a request of a ready connection; s.mu is held.
func (s *Server) serveLocked(sc *serverConn, wc verbs.WorkCompletion) {
	rb, pb := sc.recvs[wc.WRID], sc.reply[wc.WRID]
	b, err := verbs.Received(&wc, rb)
	req := request(b)
	var n int
	if err != nil || !req.valid() {
		n = putReply(pb.Bytes(), statusBad, 0, nil)
	} else {
		n = s.apply(sc, req, pb.Bytes())
	}
	// The client sends its next request only after this reply, so the
	// receive can be posted again before the reply is sent.
	msg := s.cfg.maxMsg()
	if _, err := sc.qp.PostRecv([]verbs.RecvWR{{WRID: wc.WRID, SGList: []verbs.SGE{sc.recvMR.SGE(int(wc.WRID)*msg, msg)}}}); err == nil {
		sc.posted |= 1 << wc.WRID
	}
	sc.qp.PostSend([]verbs.SendWR{{WRID: wc.WRID, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: []verbs.SGE{pb.SGE(n)}}})
}

// apply runs one request of sc against the table and lays out its reply
// in out.
func (s *Server) apply(sc *serverConn, req request, out []byte) int {
	key, val := req.key(), req.val()
	if req.id() <= sc.lastID {
		return putReply(out, statusReplayed, req.id(), nil)
	}
	sc.lastID = req.id()
	sc.served++
	if op := req.op(); op == opPut || op == opDel {
		if s.authorize(sc, Op(op), key) != nil {
			return putReply(out, statusDenied, req.id(), nil)
		}
	}
	switch req.op() {
	case opAuth:
		return s.prove(sc, req, out)
	case opGrant:
		return s.grant(sc, req, out)
	case opPut:
		s.Puts.Add(1)
		if len(val) > s.cfg.MaxValue {
			return putReply(out, statusTooLarge, req.id(), nil)
		}
		// A stored value's reply carries its new index slot, so that the
		// client's next GET of the key reads the record directly.
		st, n := s.put(key, val)
		var loc []byte
		if st == statusOK {
			loc = s.slotAt(n)
		}
		return putReply(out, st, req.id(), loc)
	case opDel:
		s.Dels.Add(1)
		return putReply(out, s.del(key), req.id(), nil)
	case opGet:
		s.Gets.Add(1)
		if v, ok := s.lookup(key); ok {
			return putReply(out, statusOK, req.id(), v)
		}
		return putReply(out, statusNotFound, req.id(), nil)
	}
	return putReply(out, statusBad, req.id(), nil)
}

// authorize asks the Authorizer about a PUT or DELETE of sc: with the
// identity it proved if the Authorizer is a Keyring (refusing it if it
// proved none), with none otherwise.
func (s *Server) authorize(sc *serverConn, op Op, key []byte) error {
	if _, ok := s.cfg.Authorizer.(Keyring); !ok {
		return s.cfg.Authorizer.Authorize(nil, op, key)
	}
	if !sc.proven {
		return errNoProof
	}
	return s.cfg.Authorizer.Authorize(sc.hello.identity(), op, key)
}

// prove checks the proof of identity a client sends as its first request
// and answers with the server's own, or refuses it: the Authorizer is not
// a Keyring, the identity is not in it, the proof is wrong, or the
// connection has tried before.
func (s *Server) prove(sc *serverConn, req request, out []byte) int {
	kr, ok := s.cfg.Authorizer.(Keyring)
	tried := sc.authTried
	sc.authTried = true
	if !ok || tried || sc.hello == nil {
		return putReply(out, statusDenied, req.id(), nil)
	}
	secret, ok := kr.Secret(sc.hello.identity())
	if !ok || !proofOK(req.val(), secret, labelClient, sc.hello, sc.info) {
		return putReply(out, statusDenied, req.id(), nil)
	}
	sc.proven = true
	return putReply(out, statusOK, req.id(), proof(secret, labelServer, sc.hello, sc.info))
}

// bindTimeout bounds the wait for a grant's binds, local operations at
// the head of an otherwise empty send queue.
const bindTimeout = time.Second

// bindWRID marks the work request ids of binds.
const bindWRID = 1 << 62

// grant answers a client's grant request, its first: with the keys of
// its windows, bound now to its QP over the index and each heap region,
// read-only; on a device without memory windows, with the regions' own
// keys. A second request, or one that is not the first, is refused, as
// is a grant whose binds fail (the client's QP fails with them).
func (s *Server) grant(sc *serverConn, req request, out []byte) int {
	if sc.served != 1 {
		return putReply(out, statusNoGrant, req.id(), nil)
	}
	heap := s.heapKeys[:len(s.heapMRs)]
	if !s.windows {
		for i, mr := range s.heapMRs {
			heap[i] = mr.RKey()
		}
		n := putGrant(s.grantBuf[:], false, s.index.RKey(), heap)
		return putReply(out, statusOK, req.id(), s.grantBuf[:n])
	}
	if err := s.bindWindows(sc); err != nil {
		return putReply(out, statusNoGrant, req.id(), nil)
	}
	for i := range heap {
		heap[i] = sc.windows[1+i].RKey()
	}
	n := putGrant(s.grantBuf[:], true, sc.windows[0].RKey(), heap)
	return putReply(out, statusOK, req.id(), s.grantBuf[:n])
}

// bindWindows binds sc's windows, read-only, over the whole index and
// each whole heap region, on sc's QP, and waits for the binds to
// complete (polling the send CQ, whose other completions, replies', are
// dropped as serveLoop drops them); s.mu is held.
func (s *Server) bindWindows(sc *serverConn) error {
	wrs := make([]verbs.SendWR, 0, len(sc.windows))
	for i, mw := range sc.windows {
		mr := s.index
		if i > 0 {
			mr = s.heapMRs[i-1]
		}
		wrs = append(wrs, mw.Bind(bindWRID|uint64(i), mr, mr.Addr(), uint64(len(mr.Bytes())), verbs.AccessRemoteRead, verbs.SendSignaled))
	}
	if _, err := sc.qp.PostSend(wrs); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), bindTimeout)
	defer cancel()
	for done := 0; done < len(wrs); {
		n, err := s.sendCQ.Wait(ctx, s.drain)
		if err != nil {
			return fmt.Errorf("kv: a client's window binds did not complete: %w", err)
		}
		for _, wc := range s.drain[:n] {
			if wc.QPNum != sc.qp.Num() || wc.WRID&bindWRID == 0 {
				continue
			}
			if wc.Status != verbs.WCSuccess {
				return fmt.Errorf("kv: bind a client's window: %s", wc.Status)
			}
			done++
		}
	}
	return nil
}

// heapRegion returns the number of the heap region b lies in.
func (s *Server) heapRegion(b mempool.Buf) int {
	for i, mr := range s.heapMRs {
		if b.MR() == mr {
			return i
		}
	}
	panic("kv: a heap buffer outside the heap's regions")
}

// slotAt returns slot number n of the index.
func (s *Server) slotAt(n int) slot { return s.index.Bytes()[n*SlotSize : (n+1)*SlotSize] }

// find returns the number of the slot holding key, or of the first empty
// slot of its bucket (found false), or -1 if neither exists.
func (s *Server) find(key []byte, h uint64) (n int, found bool) {
	empty := -1
	first := int(h%uint64(s.cfg.Buckets)) * s.cfg.SlotsPerBucket
	for n := first; n < first+s.cfg.SlotsPerBucket; n++ {
		x := s.slotAt(n)
		switch {
		case x.kind() == kindEmpty:
			if empty < 0 {
				empty = n
			}
		case x.hash() == h && bytes.Equal(s.keyOf(n), key):
			return n, true
		}
	}
	return empty, false
}

// keyOf returns the key slot n holds (server side, from local memory).
func (s *Server) keyOf(n int) []byte {
	x := s.slotAt(n)
	if x.kind() == kindInline {
		k, _ := x.inline()
		return k
	}
	if b, ok := s.records[n]; ok {
		return record(b.Bytes()).key()
	}
	return nil
}

func (s *Server) lookup(key []byte) ([]byte, bool) {
	n, found := s.find(key, hashKey(key))
	if !found {
		return nil, false
	}
	if x := s.slotAt(n); x.kind() == kindInline {
		_, v := x.inline()
		return v, true
	}
	return record(s.records[n].Bytes()).val(), true
}

// put stores key and value out of place: a new record (or the slot's
// inline bytes, which their CRC protects), then the slot, whose number it
// returns.
func (s *Server) put(key, val []byte) (uint8, int) {
	h := hashKey(key)
	n, found := s.find(key, h)
	if n < 0 {
		return statusFull, 0
	}
	s.reclaim()
	s.version++
	next := slot(s.scratch[:])
	var rec mempool.Buf
	if len(key)+len(val) <= InlineCap {
		next.setInline(s.version, h, key, val)
	} else {
		var ok bool
		if rec, ok = s.alloc(recordLen(len(key), len(val))); !ok {
			return statusFull, 0
		}
		s.write(rec.Bytes()[:recordLen(len(key), len(val))], func(b []byte) { record(b).set(s.version, key, val) }, nil)
		next.setHeap(s.version, h, len(key), len(val), rec.Addr(), recordLen(len(key), len(val)), s.heapRegion(rec))
	}
	if found {
		s.retire(n)
	}
	s.writeSlot(s.slotAt(n), next)
	if rec.Valid() {
		s.records[n] = rec
		markSuperseded(rec, false) // current, now that the slot points at it
	}
	return statusOK, n
}

func (s *Server) del(key []byte) uint8 {
	n, found := s.find(key, hashKey(key))
	if !found {
		return statusNotFound
	}
	s.reclaim()
	s.version++
	next := slot(s.scratch[:])
	next.setEmpty(s.version)
	s.retire(n)
	s.writeSlot(s.slotAt(n), next)
	return statusOK
}

// retire marks the record slot n points to superseded, for the clients
// that read it directly (before the slot moves away from it), and moves
// it into limbo.
func (s *Server) retire(n int) {
	if b, ok := s.records[n]; ok {
		markSuperseded(b, true)
		delete(s.records, n)
		s.limbo = append(s.limbo, retired{buf: b, at: time.Now()})
	}
}

// markSuperseded sets whether the record in b is its key's current one,
// with one atomic operation that a concurrent reader sees whole. Marking
// it superseded is a swap, an acquire and release barrier, so that the
// slot's switch that follows cannot be seen before it on any processor
// (a release store would let later stores pass it where stores are not
// kept in order, as on arm64).
func markSuperseded(b mempool.Buf, superseded bool) {
	w := (*uint32)(unsafe.Pointer(&b.Bytes()[recordSuperseded]))
	if superseded {
		atomic.SwapUint32(w, 1)
		return
	}
	atomic.StoreUint32(w, 0)
}

// reclaim returns to the heap the records retired longer than the grace
// period ago.
func (s *Server) reclaim() {
	now := time.Now()
	i := 0
	for ; i < len(s.limbo) && now.Sub(s.limbo[i].at) >= s.cfg.Grace; i++ {
		s.heap.Put(s.limbo[i].buf)
		s.limbo[i] = retired{}
	}
	// A queue: dropping the head by reslicing costs nothing, and append
	// moves the live entries when it grows the array (shifting them down
	// here instead cost a copy of the whole limbo per PUT).
	s.limbo = s.limbo[i:]
}

// alloc takes heap space for a record of n bytes. When the heap is
// exhausted it reuses retired records before their grace period ends,
// oldest first: a reader still holding one fails its version check and
// reads again.
func (s *Server) alloc(n int) (mempool.Buf, bool) {
	for {
		b, err := s.heap.Get(n)
		if err == nil {
			return b, true
		}
		if errors.Is(err, mempool.ErrTooLarge) || len(s.limbo) == 0 {
			return mempool.Buf{}, false
		}
		s.heap.Put(s.limbo[0].buf)
		s.limbo[0] = retired{}
		s.limbo = s.limbo[1:]
	}
}

// writeSlot copies a prepared slot into the index.
func (s *Server) writeSlot(dst, src slot) {
	s.write(dst, func(b []byte) { copy(b, src) }, s.cfg.slotTorn)
}

// write fills dst with fill: directly, or — with slowWrites — through a
// private copy written out a few bytes at a time, calling torn (if not
// nil) once the first 4 bytes are written.
func (s *Server) write(dst []byte, fill func([]byte), torn func()) {
	if !s.cfg.slowWrites {
		fill(dst)
		return
	}
	tmp := make([]byte, len(dst))
	copy(tmp, dst)
	fill(tmp)
	for i := 0; i < len(tmp); i += 4 {
		copy(dst[i:min(i+4, len(tmp))], tmp[i:])
		if i == 0 && torn != nil {
			torn()
		}
		runtime.Gosched()
	}
}

// Close stops serving, disconnects every client and releases the device.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	var handshakes []*verbs.QP
	for _, sc := range s.conns {
		if !sc.ready {
			handshakes = append(handshakes, sc.qp)
		}
	}
	s.mu.Unlock()
	s.stop()
	s.l.Close()
	// Handshakes under way end now, rather than when their peers finish
	// them (or setup times out).
	for _, qp := range handshakes {
		qp.Destroy()
	}
	s.acceptWG.Wait()
	s.mu.Lock()
	var conns []*cm.Conn
	for _, sc := range s.conns {
		conns = append(conns, sc.conn)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
	s.wg.Wait()
	return s.ctx.Close()
}
