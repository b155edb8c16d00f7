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

// Client appends records to a log through its primary, over send/recv.
// Its methods are safe for concurrent use: appends from several
// goroutines are packed into shared requests (up to the primary's message
// size), and up to the primary's ClientDepth requests are in flight.
type Client struct {
	addrs []string

	mu     sync.Mutex // guards cur and closed; held while dialling
	cur    *clientConn
	closed bool

	// Reconnects counts the times the client dialled again after its
	// connection broke.
	Reconnects atomic.Int64
}

// Dial connects to the primary: it tries each address (the members of
// the log) in turn until one is the primary, for as long as ctx allows
// (members that answer but are not primary may be electing one). When
// nothing listens at any of the addresses, Dial fails at once with an
// error wrapping cm.ErrRefused, as cm.Dial does: start the members, or
// check the addresses. Reconnecting after a connection breaks (Append)
// keeps trying while its ctx allows, since members restart.
//
// A client holds no secret and proves nothing: anyone who can reach the
// primary may append (see "Members, clients and trust" in the package
// documentation).
func Dial(ctx context.Context, addrs ...string) (*Client, error) {
	if len(addrs) == 0 {
		return nil, errors.New("rlog: Dial needs at least one address")
	}
	c := &Client{addrs: slices.Clone(addrs)}
	if _, err := c.dial(ctx, true); err != nil {
		return nil, err
	}
	return c, nil
}

// Close disconnects. Appends in flight end with ErrOutcomeUnknown, later
// ones with ErrClosed.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	cc := c.cur
	c.cur = nil
	c.mu.Unlock()
	if cc != nil {
		cc.close()
	}
	return nil
}

// errNotSent: the connection broke before the request was sent; the
// append may be retried on a new connection.
var errNotSent = errors.New("rlog: not sent")

// Append appends rec and returns its sequence number once a quorum of
// members holds it durably. If the connection breaks before that, Append
// returns an error wrapping ErrOutcomeUnknown: the record may or may not
// be in the log. An append not yet sent when the connection broke is sent
// again on a new connection. If ctx ends first, the outcome is unknown
// unless the record was still waiting to be sent (then it never will be).
func (c *Client) Append(ctx context.Context, rec []byte) (uint64, error) {
	for {
		cc, err := c.connection(ctx)
		if err != nil {
			return 0, err
		}
		if len(rec) > cc.maxRecord {
			return 0, fmt.Errorf("%w: %d bytes; the log takes at most %d", ErrTooLarge, len(rec), cc.maxRecord)
		}
		cl := &call{rec: rec, done: make(chan struct{})}
		if !cc.enqueue(cl) {
			continue
		}
		select {
		case <-cl.done:
			if cl.err == errNotSent {
				continue
			}
			return cl.seq, cl.err
		case <-ctx.Done():
			if cc.withdraw(cl) {
				return 0, ctx.Err()
			}
			return 0, fmt.Errorf("%w: %w", ErrOutcomeUnknown, ctx.Err())
		}
	}
}

// connection returns the current connection, dialling if there is none
// or it broke.
func (c *Client) connection(ctx context.Context) (*clientConn, error) { return c.dial(ctx, false) }

// dial returns the current connection, dialling if there is none or it
// broke; with refusedFails, a round in which every address refused the
// connection ends it.
func (c *Client) dial(ctx context.Context, refusedFails bool) (*clientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if c.cur != nil {
		if c.cur.alive() {
			return c.cur, nil
		}
		c.cur.close()
		c.cur = nil
		c.Reconnects.Add(1)
	}
	backoff := 10 * time.Millisecond
	for {
		var errs []error
		refused := 0
		for _, a := range c.addrs {
			cc, err := dialClient(ctx, a)
			if err == nil {
				c.cur = cc
				return cc, nil
			}
			if errors.Is(err, cm.ErrRefused) {
				refused++
			}
			errs = append(errs, fmt.Errorf("%s: %w", a, err))
			if ctx.Err() != nil {
				break
			}
		}
		err := fmt.Errorf("%w: no primary reachable: %w", ErrUnavailable, errors.Join(errs...))
		if refusedFails && refused == len(c.addrs) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// call is one append.
type call struct {
	rec  []byte
	seq  uint64
	err  error
	done chan struct{}
}

// clientConn is one connection to the primary.
type clientConn struct {
	vctx      *verbs.Context
	pd        *verbs.PD
	cq        *verbs.CQ
	qp        *verbs.QP
	conn      *cm.Conn
	sendMR    *verbs.MR
	recvMR    *verbs.MR
	depth     int
	msgSize   int
	maxRecord int

	mu       sync.Mutex
	queue    []*call
	out      map[uint64][]*call
	freeSend []int
	credits  int
	nextID   uint64
	err      error

	kick   chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	rwr    [1]verbs.RecvWR
	swr    [1]verbs.SendWR
}

// clientRecvs is how many reply receives a client posts; it uses at most
// that many of the primary's ClientDepth.
const clientRecvs = 64

func dialClient(ctx context.Context, addr string) (*clientConn, error) {
	dev, err := cm.Device(addr)
	if err != nil {
		return nil, err
	}
	vctx, err := verbs.Open(dev)
	if err != nil {
		return nil, err
	}
	cc := &clientConn{vctx: vctx, out: map[uint64][]*call{}, kick: make(chan struct{}, 1), done: make(chan struct{})}
	if err := cc.setup(ctx, addr); err != nil {
		vctx.Close()
		return nil, err
	}
	cc.ctx, cc.cancel = context.WithCancel(context.Background())
	go cc.loop()
	return cc, nil
}

func (cc *clientConn) setup(ctx context.Context, addr string) error {
	var err error
	if cc.pd, err = cc.vctx.AllocPD(); err != nil {
		return err
	}
	if cc.cq, err = cc.vctx.CreateCQ(2*clientRecvs + 8); err != nil {
		return err
	}
	ep, err := cm.NewEndpointAccess(cc.pd, verbs.QPInitAttr{SendCQ: cc.cq, RecvCQ: cc.cq,
		Cap: verbs.QPCap{MaxSendWR: clientRecvs, MaxRecvWR: clientRecvs, MaxSendSGE: 1, MaxRecvSGE: 1}}, verbs.AccessLocalWrite)
	if err != nil {
		return err
	}
	cc.qp = ep.QP()
	if cc.recvMR, err = cc.pd.AllocMR(clientRecvs*replySize, verbs.AccessLocalWrite); err != nil {
		return err
	}
	for i := range clientRecvs {
		if err := cc.postRecv(i); err != nil {
			return err
		}
	}
	req := newConnMsg(kindClient)
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	cc.conn, err = cm.Dial(dctx, addr, cc.qp, &cm.Param{PrivateData: req})
	if err != nil {
		return rejectError(err)
	}
	r := connMsg(cc.conn.PrivateData())
	cc.msgSize, cc.maxRecord, cc.depth = int(r.a()), int(r.b()), min(r.buffers(), clientRecvs)
	if !r.valid() || r.kind() != kindClient || cc.depth < 1 || cc.msgSize < appendLen+4 || cc.msgSize > 2*MaxRecordLimit ||
		cc.maxRecord > cc.msgSize-appendLen-4 {
		cc.conn.Close()
		return fmt.Errorf("%w: %s accepted with limits that make no sense", ErrProtocol, addr)
	}
	if cc.sendMR, err = cc.pd.AllocMR(cc.depth*cc.msgSize, verbs.AccessLocalWrite); err != nil {
		cc.conn.Close()
		return err
	}
	cc.credits = cc.depth
	for i := range cc.depth {
		cc.freeSend = append(cc.freeSend, i)
	}
	return nil
}

func (cc *clientConn) postRecv(i int) error {
	cc.rwr[0] = verbs.RecvWR{WRID: uint64(i), SGList: []verbs.SGE{cc.recvMR.SGE(i*replySize, replySize)}}
	_, err := cc.qp.PostRecv(cc.rwr[:])
	return err
}

func (cc *clientConn) alive() bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.err == nil
}

// enqueue queues an append; false if the connection is broken.
func (cc *clientConn) enqueue(cl *call) bool {
	cc.mu.Lock()
	if cc.err != nil {
		cc.mu.Unlock()
		return false
	}
	cc.queue = append(cc.queue, cl)
	cc.mu.Unlock()
	select {
	case cc.kick <- struct{}{}:
	default:
	}
	return true
}

// withdraw takes back an append that is still queued.
func (cc *clientConn) withdraw(cl *call) bool {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	if i := slices.Index(cc.queue, cl); i >= 0 {
		cc.queue = slices.Delete(cc.queue, i, i+1)
		return true
	}
	return false
}

func (cc *clientConn) close() {
	cc.cancel()
	cc.conn.Close()
	<-cc.done
	cc.vctx.Close()
}

// loop sends queued appends and takes in replies.
func (cc *clientConn) loop() {
	defer close(cc.done)
	wc := make([]verbs.WorkCompletion, 32)
	for {
		if err := cc.sendQueued(); err != nil {
			cc.broken(err)
			return
		}
		n, err := waitCQ(cc.ctx, cc.cq, wc, cc.kick, nil)
		if err != nil {
			cc.broken(fmt.Errorf("%w: %w", ErrClosed, err))
			return
		}
		for _, w := range wc[:n] {
			if err := cc.handle(w); err != nil {
				cc.broken(err)
				return
			}
		}
	}
}

// sendQueued packs queued appends into requests while there are credits.
func (cc *clientConn) sendQueued() error {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	for len(cc.queue) > 0 && cc.credits > 0 && len(cc.freeSend) > 0 {
		slot := cc.freeSend[len(cc.freeSend)-1]
		cc.freeSend = cc.freeSend[:len(cc.freeSend)-1]
		buf := cc.sendMR.Bytes()[slot*cc.msgSize : (slot+1)*cc.msgSize]
		cc.nextID++
		id := cc.nextID
		m := startAppend(buf, id)
		k := 0
		for ; k < len(cc.queue); k++ {
			var ok bool
			if m, ok = addAppend(buf, m, cc.queue[k].rec); !ok {
				break
			}
		}
		if k == 0 {
			return fmt.Errorf("rlog: internal error: a record of %d bytes does not fit a request of %d", len(cc.queue[0].rec), cc.msgSize)
		}
		cc.out[id] = slices.Clone(cc.queue[:k])
		cc.queue = cc.queue[k:]
		cc.credits--
		cc.swr[0] = verbs.SendWR{WRID: 1<<32 | uint64(slot), Opcode: verbs.OpSend, Flags: verbs.SendSignaled,
			SGList: []verbs.SGE{cc.sendMR.SGE(slot*cc.msgSize, len(m))}}
		if _, err := cc.qp.PostSend(cc.swr[:]); err != nil {
			return fmt.Errorf("%w: %w", errPeerGone, err)
		}
	}
	return nil
}

func (cc *clientConn) handle(w verbs.WorkCompletion) error {
	if w.Status != verbs.WCSuccess {
		return wcError(w)
	}
	if w.Opcode != verbs.WCRecv {
		cc.mu.Lock()
		cc.freeSend = append(cc.freeSend, int(w.WRID&0xffffffff))
		cc.mu.Unlock()
		return nil
	}
	i, b, err := receivedSlot(&w, w.WRID, clientRecvs, replySize, cc.recvMR.Bytes())
	var m msg
	if err == nil {
		m, err = parseMsg(b)
	}
	if err == nil && m.typ() != msgReply {
		err = errMsg("message type %d from the primary", m.typ())
	}
	if err != nil {
		return err
	}
	cc.mu.Lock()
	calls, ok := cc.out[m.replyID()]
	if !ok {
		cc.mu.Unlock()
		return errMsg("reply to request %d, which is not outstanding", m.replyID())
	}
	if m.replyStatus() == codeOK && (m.replyCount() != len(calls) || m.replyFirst() == 0) {
		cc.mu.Unlock()
		return errMsg("reply gives %d records from %d to a request of %d", m.replyCount(), m.replyFirst(), len(calls))
	}
	delete(cc.out, m.replyID())
	cc.credits++
	cc.mu.Unlock()
	for k, cl := range calls {
		if m.replyStatus() == codeOK {
			cl.seq = m.replyFirst() + uint64(k)
		} else {
			cl.err = codeError(m.replyStatus(), m.replyText())
		}
		close(cl.done)
	}
	if err := cc.postRecv(i); err != nil {
		return fmt.Errorf("%w: %w", errPeerGone, err)
	}
	return nil
}

// broken ends the connection: appends sent and not answered have an
// unknown outcome; those not sent may be retried.
func (cc *clientConn) broken(err error) {
	cc.conn.Close()
	cc.mu.Lock()
	cc.err = err
	out, queue := cc.out, cc.queue
	cc.out, cc.queue = map[uint64][]*call{}, nil
	cc.mu.Unlock()
	for _, calls := range out {
		for _, cl := range calls {
			cl.err = fmt.Errorf("%w: %w", ErrOutcomeUnknown, err)
			close(cl.done)
		}
	}
	for _, cl := range queue {
		cl.err = errNotSent
		close(cl.done)
	}
}
