package kv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goverbs/goverbs/cm"
	"github.com/goverbs/goverbs/verbs"
)

// Errors of the store; test them with errors.Is.
var (
	ErrNotFound      = errors.New("kv: key not found")
	ErrKeyTooLarge   = fmt.Errorf("kv: key longer than %d bytes", MaxKey)
	ErrValueTooLarge = errors.New("kv: value larger than the server's MaxValue")
	ErrTableFull     = errors.New("kv: the key's bucket or the value heap is full: give the server more Buckets, SlotsPerBucket or HeapBytes")
	// ErrServerGone: the server did not answer, or the connection
	// broke. For a PUT or DELETE the outcome is unknown: a request that
	// had reached the server may still be applied. The client dials
	// again on its next operation.
	ErrServerGone = errors.New("kv: the server is unreachable")
	// ErrClosed: the client was closed.
	ErrClosed     = errors.New("kv: the client is closed")
	ErrBadRequest = errors.New("kv: the server refused a malformed request")
	// ErrDenied: the server's Authorizer refused a PUT or DELETE; the
	// table is unchanged.
	ErrDenied = errors.New("kv: the server refused this PUT or DELETE, or the client's credential: the client is not authorised (dial with the server's credential: DialConfig.Credential, or goverbs kv --token-file)")
	// ErrServerUnproven: the server accepted the client's proof of its
	// credential but did not prove that it holds the credential too:
	// it is not the server the client meant to reach, whatever its
	// address says.
	ErrServerUnproven = errors.New("kv: the server did not prove that it holds the client's credential: it is not the server the credential is for")
	// ErrReplayed: the server refused a request whose id was not above
	// the connection's last one. A client never sends one; a request
	// replayed by another party is refused so.
	ErrReplayed = errors.New("kv: the server refused a replayed request")
)

// maxTornReads bounds the one-sided attempts of a GET before it falls back
// to an RPC.
const maxTornReads = 8

// opTimeout bounds one operation's wait for the network.
const opTimeout = 5 * time.Second

// Client is a connection to a Server. Its methods are safe for concurrent
// use; they run one at a time.
type Client struct {
	addr string
	cfg  DialConfig
	// hello and acceptance are the connection's request and the
	// server's acceptance, which the connection's proof covers.
	hello      hello
	acceptance info

	mu     sync.Mutex
	closed bool
	ctx    *verbs.Context
	pd     *verbs.PD
	cq     *verbs.CQ
	qp     *verbs.QP
	conn   *cm.Conn
	info   indexInfo
	bucket *verbs.MR // a bucket read lands here
	rec    *verbs.MR // a record read lands here
	sendB  *verbs.MR
	recvB  *verbs.MR
	nextID uint64
	wr     [1]verbs.SendWR
	rwr    [1]verbs.RecvWR
	sge    [1]verbs.SGE // the send WR's list
	rsge   [1]verbs.SGE // the receive WR's list
	wc     [4]verbs.WorkCompletion
	// locs remembers where each key's record was last found (by hash,
	// direct-mapped), so that a GET reads it with one Read.
	locs []recordLoc

	// indexKey and heapKeys are the keys the server granted this
	// connection (heapKeys by heap region number): windows of its own,
	// on a server with memory windows; windowed says they are.
	indexKey uint32
	heapKeys []uint32
	windowed bool

	// TornReads counts one-sided reads that failed their checks and were
	// retried; FallbackGets the GETs that ended as RPCs; CachedGets the
	// GETs served by one Read of the record where it was last found;
	// Reconnects the times the client dialled the server again.
	TornReads, FallbackGets, CachedGets, Reconnects atomic.Int64

	// tornRead, if set, is called after each torn read a GET counts
	// (tests set it before using the client).
	tornRead func()
}

// recordLoc is where a key's record was last found, and its version.
type recordLoc struct {
	hash    uint64
	version uint64
	addr    uint64
	rkey    uint32
	length  uint32 // 0: the entry is empty
}

// locEntries is the size of a client's record location cache.
const locEntries = 1 << 15

// DialConfig configures a Client. The zero value proves no identity: the
// client reads, and changes the table only on a server whose Authorizer
// asks for no proof.
type DialConfig struct {
	// Identity names the client to the server's Keyring and Authorizer
	// (at most MaxIdentity bytes; empty for a server that takes
	// TokenAuthorizer). It crosses the network in the clear.
	Identity []byte
	// Credential is the secret the client proves it holds for Identity
	// when it connects, by a challenge and response that keeps the
	// secret off the network: for a server that takes
	// TokenAuthorizer(token), TokenCredential(token). At least
	// MinCredential bytes. A server that refuses it fails Dial with
	// ErrDenied; one that does not prove it holds it too, with
	// ErrServerUnproven.
	Credential []byte
}

// Dial connects to the server at addr (shm://@kv, tcp://host:port, ...)
// proving no identity.
func Dial(ctx context.Context, addr string) (*Client, error) {
	return DialConfig{}.Dial(ctx, addr)
}

// Dial connects to the server at addr with cfg.
func (cfg DialConfig) Dial(ctx context.Context, addr string) (*Client, error) {
	switch {
	case len(cfg.Identity) > MaxIdentity:
		return nil, fmt.Errorf("kv: an identity of %d bytes is longer than MaxIdentity (%d)", len(cfg.Identity), MaxIdentity)
	case cfg.Credential != nil && len(cfg.Credential) < MinCredential:
		return nil, fmt.Errorf("kv: a credential of %d bytes is shorter than MinCredential (%d): use TokenCredential to make one of a token", len(cfg.Credential), MinCredential)
	case len(cfg.Identity) > 0 && cfg.Credential == nil:
		return nil, errors.New("kv: an identity without a credential proves nothing: give DialConfig.Credential")
	}
	c := &Client{addr: addr, cfg: cfg, locs: make([]recordLoc, locEntries)}
	if err := c.connect(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// connect opens the device and connects; c.mu is held or c is new.
func (c *Client) connect(ctx context.Context) error {
	dev, err := cm.Device(c.addr)
	if err != nil {
		return err
	}
	if c.ctx, err = verbs.Open(dev); err != nil {
		return err
	}
	if err := c.setup(ctx); err != nil {
		c.ctx.Close()
		c.ctx = nil
		return err
	}
	return nil
}

func (c *Client) setup(ctx context.Context) error {
	var err error
	if c.pd, err = c.ctx.AllocPD(); err != nil {
		return err
	}
	if c.cq, err = c.ctx.CreateCQ(16); err != nil {
		return err
	}
	if c.qp, err = c.pd.CreateQP(verbs.QPInitAttr{SendCQ: c.cq, RecvCQ: c.cq,
		Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 2, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return err
	}
	c.hello = encodeHello(c.qp.Num(), c.cfg.Identity)
	if c.conn, err = cm.Dial(ctx, c.addr, c.qp, &cm.Param{PrivateData: c.hello}); err != nil {
		var rej *cm.RejectError
		if errors.As(err, &rej) && len(rej.PrivateData) > 0 {
			// The server says why (a limit it holds the client to).
			return fmt.Errorf("%w: the server refused the connection: %q", ErrServerGone, rej.PrivateData)
		}
		return fmt.Errorf("%w: %w", ErrServerGone, err)
	}
	if c.info, c.acceptance, err = decodeInfo(c.conn.PrivateData()); err != nil {
		return err
	}
	clear(c.locs) // a new server: new addresses and keys
	local := verbs.AccessLocalWrite
	if c.bucket, err = c.pd.AllocMR(c.info.slotsPerBucket*SlotSize, local); err != nil {
		return err
	}
	if c.rec, err = c.pd.AllocMR(c.info.maxMsg+recordHeader, local); err != nil {
		return err
	}
	if c.sendB, err = c.pd.AllocMR(c.info.maxMsg, local); err != nil {
		return err
	}
	if c.recvB, err = c.pd.AllocMR(c.info.maxMsg, local); err != nil {
		return err
	}
	if err := c.takeGrant(); err != nil {
		return err
	}
	return c.prove()
}

// takeGrant asks the server for the keys this connection reads with.
func (c *Client) takeGrant() error {
	r, err := c.rpc(opGrant, nil, nil)
	if err != nil {
		return err
	}
	g := grant(r.val())
	if !g.valid() {
		c.conn.Close()
		return errGrant
	}
	c.windowed, c.indexKey = g.windows(), g.indexKey()
	c.heapKeys = c.heapKeys[:0]
	for i := range g.heapRegions() {
		c.heapKeys = append(c.heapKeys, g.heapKey(i))
	}
	return nil
}

// prove proves the client's credential to the server, if it has one,
// right after the grant, and checks the server's proof in the reply.
func (c *Client) prove() error {
	if c.cfg.Credential == nil {
		return nil
	}
	r, err := c.rpc(opAuth, nil, proof(c.cfg.Credential, labelClient, c.hello, c.acceptance))
	if err != nil {
		return err
	}
	if !proofOK(r.val(), c.cfg.Credential, labelServer, c.hello, c.acceptance) {
		c.conn.Close()
		return ErrServerUnproven
	}
	return nil
}

// teardown releases the connection and the device; c.mu is held.
func (c *Client) teardown() {
	if c.conn != nil {
		c.conn.Close()
		c.conn = nil
	}
	if c.ctx != nil {
		c.ctx.Close()
		c.ctx = nil
	}
}

// Close disconnects; the client's operations fail with ErrClosed after
// it.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	c.teardown()
	return nil
}

// alive reports whether the connection still stands; if not, it dials
// again (the server may have restarted), unless the client was closed.
// c.mu is held.
func (c *Client) alive() error {
	if c.closed {
		return ErrClosed
	}
	if c.conn != nil {
		select {
		case <-c.conn.Done():
		default:
			return nil
		}
	}
	c.teardown()
	c.Reconnects.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := c.connect(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrServerGone, err)
	}
	return nil
}

// await waits for the completion of wrid on the client's CQ, busy polling
// first (the usual case is a few microseconds away) and then sleeping.
// Completions of other work requests (earlier Sends) are passed over.
func (c *Client) await(wrid uint64) (verbs.WorkCompletion, error) {
	var deadline time.Time
	for spins := 0; ; spins++ {
		var n int
		var err error
		if spins < 1<<14 {
			n = c.cq.Poll(c.wc[:])
		} else {
			if deadline.IsZero() {
				deadline = time.Now().Add(opTimeout)
			}
			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			n, err = c.cq.Wait(ctx, c.wc[:])
			cancel()
		}
		for _, wc := range c.wc[:n] {
			if wc.Status != verbs.WCSuccess {
				c.conn.Close() // the connection is broken: reconnect next time
				return wc, fmt.Errorf("%w: %s", ErrServerGone, wc.Status)
			}
			if wc.WRID == wrid {
				return wc, nil
			}
		}
		if err != nil {
			c.conn.Close()
			return verbs.WorkCompletion{}, fmt.Errorf("%w: %w", ErrServerGone, err)
		}
	}
}

// read performs one RDMA Read of n bytes at raddr/rkey into mr.
func (c *Client) read(mr *verbs.MR, n int, raddr uint64, rkey uint32) error {
	c.nextID++
	c.sge[0] = mr.SGE(0, n)
	c.wr[0] = verbs.SendWR{WRID: c.nextID, Opcode: verbs.OpRDMARead, Flags: verbs.SendSignaled,
		SGList: c.sge[:], RemoteAddr: raddr, RKey: rkey}
	if _, err := c.qp.PostSend(c.wr[:]); err != nil {
		c.conn.Close()
		return fmt.Errorf("%w: %w", ErrServerGone, err)
	}
	_, err := c.await(c.nextID)
	return err
}

// Get returns a copy of the value of key. It reads the server's index and
// value with one-sided RDMA Reads — one Read when the value is inline, or
// when its record is still where this client last found it — and never
// involves the server's CPU, unless reads keep coming back torn.
func (c *Client) Get(key []byte) ([]byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, err := c.get(key)
	if err != nil {
		return nil, err
	}
	return append([]byte(nil), v...), nil
}

// GetInto copies the value of key into dst and returns its length; if
// dst is too short it returns the length and io.ErrShortBuffer. It
// allocates nothing.
func (c *Client) GetInto(key, dst []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, err := c.get(key)
	if err != nil {
		return 0, err
	}
	if copy(dst, v) < len(v) {
		return len(v), io.ErrShortBuffer
	}
	return len(v), nil
}

// get returns the value of key, in the client's read buffers (valid until
// its next operation); c.mu is held.
func (c *Client) get(key []byte) ([]byte, error) {
	if len(key) > MaxKey {
		return nil, ErrKeyTooLarge
	}
	if err := c.alive(); err != nil {
		return nil, err
	}
	h := hashKey(key)
	loc := &c.locs[h%uint64(len(c.locs))]
	if loc.hash == h && loc.length != 0 {
		v, ok, err := c.readCached(key, loc)
		if ok {
			c.CachedGets.Add(1)
		}
		if ok || err != nil {
			return v, err
		}
		loc.length = 0
	}
	bsize := c.info.slotsPerBucket * SlotSize
	baddr := c.info.addr + (h%uint64(c.info.buckets))*uint64(bsize)
	for range maxTornReads {
		if err := c.read(c.bucket, bsize, baddr, c.indexKey); err != nil {
			return nil, err
		}
		v, torn, err := c.scan(key, h)
		if !torn {
			return v, err
		}
		c.TornReads.Add(1)
		if c.tornRead != nil {
			c.tornRead()
		}
	}
	c.FallbackGets.Add(1)
	r, err := c.rpc(opGet, key, nil)
	if err != nil {
		return nil, err
	}
	return r.val(), nil
}

// scan looks for key in the bucket just read. torn says the read (or a
// record read) was inconsistent and must be repeated.
func (c *Client) scan(key []byte, h uint64) (val []byte, torn bool, err error) {
	b := c.bucket.Bytes()
	for i := 0; i < len(b); i += SlotSize {
		s := slot(b[i : i+SlotSize])
		if !s.valid() {
			return nil, true, nil
		}
		if s.kind() == kindEmpty || s.hash() != h {
			continue
		}
		if s.kind() == kindInline {
			if k, v := s.inline(); bytes.Equal(k, key) {
				return v, false, nil
			}
			continue
		}
		n := s.recLen()
		if n < recordHeader || n > len(c.rec.Bytes()) || s.region() >= len(c.heapKeys) {
			return nil, true, nil
		}
		rkey := c.heapKeys[s.region()]
		if err := c.read(c.rec, n, s.addr(), rkey); err != nil {
			return nil, false, err
		}
		r := record(c.rec.Bytes()[:n])
		if !r.valid(s) {
			return nil, true, nil
		}
		if bytes.Equal(r.key(), key) {
			c.locs[h%uint64(len(c.locs))] = recordLoc{hash: h, version: s.version(), addr: s.addr(), rkey: rkey, length: uint32(n)}
			return r.val(), false, nil
		}
	}
	return nil, false, ErrNotFound
}

// readCached reads the record of key where it was last found: ok if it is
// still intact, the same record (its version), and current (see the
// package doc). The version pins what was read to one record: space
// reused for another record of the key fails it, so a record's current
// word and its bytes, read in one Read, belong together.
func (c *Client) readCached(key []byte, loc *recordLoc) (val []byte, ok bool, err error) {
	n := int(loc.length)
	if n > len(c.rec.Bytes()) {
		return nil, false, nil
	}
	if err := c.read(c.rec, n, loc.addr, loc.rkey); err != nil {
		return nil, false, err
	}
	r := record(c.rec.Bytes()[:n])
	if !r.intact() || r.version() != loc.version || r.superseded() || !bytes.Equal(r.key(), key) {
		return nil, false, nil
	}
	return r.val(), true, nil
}

// Put stores value under key (an RPC; the server writes out of place).
func (c *Client) Put(key, value []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, err := c.checkedRPC(opPut, key, value)
	if err == nil {
		c.remember(key, slot(r.val()))
	}
	return err
}

// remember takes note of where the server says it stored key's value: the
// index slot a PUT's reply carries. It is a hint, checked as every cached
// location is when a GET reads it. Anything but a valid heap slot of key's
// hash (an inline value, a deleted key, an older server's empty reply)
// forgets what was remembered for the key.
func (c *Client) remember(key []byte, s slot) {
	h := hashKey(key)
	loc := &c.locs[h%uint64(len(c.locs))]
	if len(s) != SlotSize || !s.valid() || s.kind() != kindHeap || s.hash() != h || s.region() >= len(c.heapKeys) {
		if loc.hash == h {
			loc.length = 0
		}
		return
	}
	*loc = recordLoc{hash: h, version: s.version(), addr: s.addr(), rkey: c.heapKeys[s.region()], length: uint32(s.recLen())}
}

// Delete removes key; ErrNotFound if it was absent.
func (c *Client) Delete(key []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, err := c.checkedRPC(opDel, key, nil)
	if err == nil {
		c.remember(key, nil) // no record to read directly any more
	}
	return err
}

// checkedRPC checks the key and the connection and makes the RPC; c.mu is
// held.
func (c *Client) checkedRPC(op uint8, key, val []byte) (reply, error) {
	if len(key) > MaxKey {
		return nil, ErrKeyTooLarge
	}
	if err := c.alive(); err != nil {
		return nil, err
	}
	return c.rpc(op, key, val)
}

// rpc sends a request and waits for its reply; c.mu is held.
func (c *Client) rpc(op uint8, key, val []byte) (reply, error) {
	if requestHeader+len(key)+len(val) > c.info.maxMsg {
		return nil, ErrValueTooLarge
	}
	c.nextID++
	id := c.nextID
	c.rsge[0] = c.recvB.SGE(0, c.info.maxMsg)
	c.rwr[0] = verbs.RecvWR{WRID: id, SGList: c.rsge[:]}
	if _, err := c.qp.PostRecv(c.rwr[:]); err != nil {
		c.conn.Close()
		return nil, fmt.Errorf("%w: %w", ErrServerGone, err)
	}
	n := putRequest(c.sendB.Bytes(), op, id, key, val)
	c.sge[0] = c.sendB.SGE(0, n)
	c.wr[0] = verbs.SendWR{WRID: id | 1<<63, Opcode: verbs.OpSend, Flags: verbs.SendSignaled, SGList: c.sge[:]}
	if _, err := c.qp.PostSend(c.wr[:]); err != nil {
		c.conn.Close()
		return nil, fmt.Errorf("%w: %w", ErrServerGone, err)
	}
	wc, err := c.await(id)
	if err != nil {
		return nil, err
	}
	b, err := verbs.Received(&wc, c.recvB.Bytes()[:c.info.maxMsg])
	r := reply(b)
	if err != nil || !r.valid() || r.id() != id {
		c.conn.Close()
		return nil, fmt.Errorf("%w: malformed reply", ErrServerGone)
	}
	switch r.status() {
	case statusOK:
		return r, nil
	case statusNotFound:
		return nil, ErrNotFound
	case statusFull:
		return nil, ErrTableFull
	case statusTooLarge:
		return nil, ErrValueTooLarge
	case statusDenied:
		return nil, ErrDenied
	case statusReplayed:
		return nil, ErrReplayed
	case statusNoGrant:
		c.conn.Close()
		return nil, fmt.Errorf("%w: it could not grant this connection its keys (bind its memory windows)", ErrServerGone)
	}
	return nil, ErrBadRequest
}
