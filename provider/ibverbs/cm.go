package ibverbs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/goverbs/goverbs/verbs/driver"
)

// Connection setup through librdmacm, for addresses rdma://host:port.
//
// Every rdma_cm_id has an event channel of its own, watched by the Go
// runtime's poller; a connection request's new id is moved to a channel of
// its own as it arrives. The provider's QPs are created by the provider,
// not by rdma_create_qp, so the QP's moves to Init, RTR and RTS are made
// here with the attributes rdma_init_qp_attr gives; on iWARP the kernel
// moves the QP to RTS itself when the connection is established.

// maxPrivateData is what an rdma_cm connection request carries on
// InfiniBand and RoCE (the smallest of request, reply and reject).
const maxPrivateData = 56

// ibCMRejConsumerDefined is the InfiniBand CM reject reason of a
// reject by the listening application (IB_CM_REJ_CONSUMER_DEFINED).
const ibCMRejConsumerDefined = 28

// ibCMRejStaleConn is the InfiniBand CM reject reason of a request from
// a QP whose earlier connection the peer's CM still holds, until its
// time-wait ends (IB_CM_REJ_STALE_CONN).
const ibCMRejStaleConn = 10

// staleRetry bounds the wait between two tries of a connection the
// peer's CM rejects as stale.
const staleRetry = time.Second

// resolveTimeout bounds address and route resolution.
const resolveTimeout = 5 * time.Second

// establishTimeout bounds the wait for the requester's confirmation after
// an Accept.
const establishTimeout = 10 * time.Second

// disconnectTimeout bounds Close's wait for the end of the disconnect
// it started (the peer's reply, or the peer's own disconnect request):
// an rdma_cm id destroyed while its disconnect request is outstanding
// and the peer's crosses it can block the kernel's ib_cm for ever (seen
// on Linux 6.1 with rxe). A peer that does not answer within it (its
// link is down, its host gone) has its id destroyed anyway.
const disconnectTimeout = 5 * time.Second

func (*provider) Schemes() []string   { return []string{"rdma"} }
func (*provider) MaxPrivateData() int { return maxPrivateData }

// cmEvent is a struct rdma_cm_event, copied out before it is acked.
type cmEvent struct {
	typ    int32
	status int32
	id     uintptr
	param  driver.ConnParam
}

// cmID is an rdma_cm_id with its own event channel.
type cmID struct {
	ch      uintptr // struct rdma_event_channel *
	id      uintptr // struct rdma_cm_id *
	watcher *fdWatcher
	events  chan cmEvent
	// requests receives the new ids of connection requests (listeners).
	requests chan *cmID
	reqParam driver.ConnParam

	closeOnce sync.Once
}

// newChannel creates an event channel and its watcher, which hands the
// channel's events to the id.
func newCMID(events int) (*cmID, error) {
	ch, err := callPtr(lib.createEventChannel)
	if err != nil {
		return nil, errnoErr("rdma_create_event_channel", err)
	}
	c := &cmID{ch: ch, events: make(chan cmEvent, events)}
	fd := int(*(*int32)(cptr(ch + offEventChannelFD)))
	if c.watcher, err = watchFD(fd, c.read); err != nil {
		call(lib.destroyEventChannel, ch)
		return nil, fmt.Errorf("ibverbs: watch an rdma_cm event channel: %w", err)
	}
	return c, nil
}

func createCMID() (*cmID, error) {
	c, err := newCMID(16)
	if err != nil {
		return nil, err
	}
	if err := callRC(lib.createID, c.ch, uintptr(unsafe.Pointer(&c.id)), 0, rdmaPSTCP); err != nil {
		c.watcher.stop()
		call(lib.destroyEventChannel, c.ch)
		return nil, errnoErr("rdma_create_id", err)
	}
	return c, nil
}

// read takes one event from the channel; it reports false when there is
// none. A connection request's id is moved to a channel of its own and
// queued on requests; every other event goes to events.
func (c *cmID) read() bool {
	var evp uintptr
	if r := int32(call(lib.getCMEvent, c.ch, uintptr(unsafe.Pointer(&evp)))); r != 0 {
		return false
	}
	ev := cmEvent{
		typ:    *(*int32)(cptr(evp + offCMEventEvent)),
		status: *(*int32)(cptr(evp + offCMEventStatus)),
		id:     *(*uintptr)(cptr(evp + offCMEventID)),
	}
	cp := (*rdmaConnParam)(cptr(evp + offCMEventConn))
	if cp.privateData != 0 && cp.privateDataLen > 0 {
		ev.param.PrivateData = append([]byte(nil), unsafe.Slice((*byte)(cptr(cp.privateData)), cp.privateDataLen)...)
	}
	ev.param.ResponderResources = cp.responderResources
	ev.param.InitiatorDepth = cp.initiatorDepth
	ev.param.RetryCount = cp.retryCount
	ev.param.RNRRetryCount = cp.rnrRetryCount
	ev.param.QPNum = cp.qpNum
	call(lib.ackCMEvent, evp)
	if ev.typ == rdmaCMEventConnectRequest && c.requests != nil {
		child, err := newCMID(16)
		if err == nil {
			child.id = ev.id
			child.reqParam = ev.param
			if err = callRC(lib.migrateID, ev.id, child.ch); err != nil {
				child.watcher.stop()
				call(lib.destroyEventChannel, child.ch)
			}
		}
		if err != nil {
			call(lib.reject, ev.id, 0, 0)
			call(lib.destroyID, ev.id)
			return true
		}
		select {
		case c.requests <- child:
		default: // backlog full
			call(lib.reject, child.id, 0, 0)
			child.close()
		}
		return true
	}
	select {
	case c.events <- ev:
	default:
	}
	return true
}

// close destroys the id and its channel.
func (c *cmID) close() {
	c.closeOnce.Do(func() {
		if c.id != 0 {
			call(lib.destroyID, c.id)
		}
		c.watcher.stop()
		call(lib.destroyEventChannel, c.ch)
	})
}

// wait returns the next event, or ctx's error.
func (c *cmID) wait(ctx context.Context) (cmEvent, error) {
	select {
	case ev := <-c.events:
		return ev, nil
	case <-ctx.Done():
		return cmEvent{}, ctx.Err()
	}
}

// deviceName is the name of the device the id is bound to, or "".
func (c *cmID) deviceName() string {
	vctx := *(*uintptr)(cptr(c.id + offCMIDVerbs))
	if vctx == 0 {
		return ""
	}
	return goString(call(lib.getDeviceName, *(*uintptr)(cptr(vctx + offContextDevice))))
}

// sockaddr builds a struct sockaddr_in or sockaddr_in6.
func sockaddr(a *net.TCPAddr) []byte {
	b := make([]byte, 128)
	if ip4 := a.IP.To4(); ip4 != nil || a.IP == nil {
		binary.NativeEndian.PutUint16(b[0:], syscall.AF_INET)
		binary.BigEndian.PutUint16(b[2:], uint16(a.Port))
		copy(b[4:8], ip4)
		return b
	}
	binary.NativeEndian.PutUint16(b[0:], syscall.AF_INET6)
	binary.BigEndian.PutUint16(b[2:], uint16(a.Port))
	copy(b[8:24], a.IP.To16())
	return b
}

func resolveTCP(addr string) (*net.TCPAddr, error) {
	a, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("ibverbs: address %q: %w (write it as rdma://host:port)", addr, err)
	}
	return a, nil
}

// resolve resolves addr's address and route on c.
func (c *cmID) resolve(ctx context.Context, addr string) error {
	a, err := resolveTCP(addr)
	if err != nil {
		return err
	}
	sa := sockaddr(a)
	steps := []struct {
		fn   func() error
		want int32
		what string
	}{
		{func() error {
			return callRC(lib.resolveAddr, c.id, 0, uintptr(unsafe.Pointer(&sa[0])), uintptr(resolveTimeout.Milliseconds()))
		}, rdmaCMEventAddrResolved, "rdma_resolve_addr"},
		{func() error { return callRC(lib.resolveRoute, c.id, uintptr(resolveTimeout.Milliseconds())) },
			rdmaCMEventRouteResolved, "rdma_resolve_route"},
	}
	for _, s := range steps {
		if err := s.fn(); err != nil {
			return errnoErr(s.what+" "+addr, err)
		}
		ev, err := c.wait(ctx)
		if err != nil {
			return err
		}
		if ev.typ != s.want {
			return fmt.Errorf("ibverbs: %s %s: %w: event %d, status %d (no RDMA device routes to this address?)",
				s.what, addr, driver.ErrRefused, ev.typ, ev.status)
		}
	}
	return nil
}

// DeviceFor returns the device the kernel routes addr to: the device
// whose QPs can connect to it.
func (*provider) DeviceFor(addr string) (string, error) {
	if err := loadCM(); err != nil {
		return "", err
	}
	c, err := createCMID()
	if err != nil {
		return "", err
	}
	defer c.close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*resolveTimeout)
	defer cancel()
	a, err := resolveTCP(addr)
	if err != nil {
		return "", err
	}
	sa := sockaddr(a)
	if err := callRC(lib.resolveAddr, c.id, 0, uintptr(unsafe.Pointer(&sa[0])), uintptr(resolveTimeout.Milliseconds())); err != nil {
		return "", errnoErr("rdma_resolve_addr "+addr, err)
	}
	ev, err := c.wait(ctx)
	if err != nil {
		return "", err
	}
	if ev.typ != rdmaCMEventAddrResolved {
		return "", fmt.Errorf("ibverbs: no RDMA device routes to %s (rdma_cm event %d, status %d)", addr, ev.typ, ev.status)
	}
	return c.deviceName(), nil
}

// toConnParam is the struct rdma_conn_param for p and q; pd is kept
// alive by the caller until the call that uses it returns.
func toConnParam(p driver.ConnParam, q *qp) rdmaConnParam {
	a := q.ctx.attr
	cp := rdmaConnParam{
		privateDataLen:     uint8(len(p.PrivateData)),
		responderResources: uint8(min(int(p.ResponderResources), a.MaxQPRdAtom)),
		initiatorDepth:     uint8(min(int(p.InitiatorDepth), a.MaxQPInitRdAtom)),
		flowControl:        1,
		retryCount:         min(p.RetryCount, 7),
		rnrRetryCount:      min(p.RNRRetryCount, 7),
		qpNum:              q.num,
	}
	if len(p.PrivateData) > 0 {
		cp.privateData = uintptr(unsafe.Pointer(&p.PrivateData[0]))
	}
	if q.srq != nil {
		cp.srq = 1
	}
	return cp
}

// moveQP moves q to state with the attributes rdma_init_qp_attr gives
// for c; edit, if not nil, adjusts them first.
func (c *cmID) moveQP(q *qp, state driver.QPState, edit func(*ibvQPAttr)) error {
	a := ibvQPAttr{qpState: uint32(state)}
	var mask int32
	if err := callRC(lib.initQPAt, c.id, uintptr(unsafe.Pointer(&a)), uintptr(unsafe.Pointer(&mask))); err != nil {
		return errnoErr(fmt.Sprintf("rdma_init_qp_attr %v", state), err)
	}
	if edit != nil {
		edit(&a)
	}
	return q.modifyRaw(&a, mask)
}

// toInit moves q to Init (from Reset, or Init again: receives posted in
// Init are kept).
func (c *cmID) toInit(q *qp) error {
	return c.moveQP(q, driver.QPSInit, func(a *ibvQPAttr) {
		if granted, ok := q.userGrant(); ok {
			// The user moved the QP to Init with rights of its
			// own: the connection keeps exactly those.
			a.qpAccessFlags = uint32(granted)
			return
		}
		if q.ctx.iwarp && a.qpAccessFlags == 0 {
			// Before rdma_connect the kernel has no iWARP connection
			// to take the rights from and grants none; give the
			// active side what it gives the passive one. The regions'
			// own rights still decide what a peer reaches.
			a.qpAccessFlags = uint32(driver.AccessLocalWrite | driver.AccessRemoteWrite | driver.AccessRemoteRead)
		}
	})
}

// toRTS moves q through RTR to RTS with the responder's RNR timer and
// resources p names (InfiniBand and RoCE; iWARP's kernel does it).
func (c *cmID) toRTS(q *qp, p driver.ConnParam) error {
	// Init again first: before the exchange the kernel grants no remote
	// access; now it knows the negotiated responder resources (as
	// librdmacm does for QPs of its own).
	if err := c.toInit(q); err != nil {
		return err
	}
	if err := c.moveQP(q, driver.QPSRTR, func(a *ibvQPAttr) {
		a.minRNRTimer = uint8(p.MinRNRTimer)
	}); err != nil {
		return err
	}
	return c.moveQP(q, driver.QPSRTS, nil)
}

func ourQP(x driver.QP) (*qp, error) {
	q, ok := x.(*qp)
	if !ok {
		return nil, fmt.Errorf("%w: a QP of another provider cannot use an rdma:// address", driver.ErrInvalidArg)
	}
	return q, nil
}

func checkDevice(c *cmID, q *qp, addr string) error {
	if dev := c.deviceName(); dev != q.ctx.name {
		return fmt.Errorf("%w: %s is reached through device %s, but the QP is on %s: open %s (cm.Device names it)",
			driver.ErrInvalidArg, addr, dev, q.ctx.name, dev)
	}
	return nil
}

// Dial connects x to addr. A QP reset since its last connection ends
// that connection first; the peer's CM rejects the new one as stale
// until the old one's time-wait is over (on InfiniBand and RoCE), so
// Dial tries again until then, or until ctx is done.
func (*provider) Dial(ctx context.Context, addr string, x driver.QP, p driver.ConnParam) (driver.Conn, error) {
	if err := loadCM(); err != nil {
		return nil, err
	}
	q, err := ourQP(x)
	if err != nil {
		return nil, err
	}
	q.endStaleConn()
	wait := 10 * time.Millisecond
	for {
		k, stale, err := dialOnce(ctx, addr, q, p)
		if !stale {
			return k, err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("%w (the peer's CM holds this QP's earlier connection: try again once its time-wait is over)", err)
		case <-t.C:
		}
		wait = min(2*wait, staleRetry)
	}
}

// dialOnce is one try of Dial; stale reports a reject as stale.
func dialOnce(ctx context.Context, addr string, q *qp, p driver.ConnParam) (k driver.Conn, stale bool, err error) {
	c, err := createCMID()
	if err != nil {
		return nil, false, err
	}
	fail := func(err error) (driver.Conn, bool, error) {
		c.close()
		return nil, false, err
	}
	if err := c.resolve(ctx, addr); err != nil {
		return fail(err)
	}
	if err := checkDevice(c, q, addr); err != nil {
		return fail(err)
	}
	if err := c.toInit(q); err != nil {
		return fail(err)
	}
	cp := toConnParam(p, q)
	err = callRC(lib.connect, c.id, uintptr(unsafe.Pointer(&cp)))
	runtime.KeepAlive(p.PrivateData) // cp points into it
	if err != nil {
		return fail(errnoErr("rdma_connect "+addr, err))
	}
	for {
		ev, err := c.wait(ctx)
		if err != nil {
			return fail(err)
		}
		switch ev.typ {
		case rdmaCMEventConnectResponse:
			if err := c.toRTS(q, p); err != nil {
				return fail(err)
			}
			if err := callRC(lib.establish, c.id); err != nil {
				return fail(errnoErr("rdma_establish", err))
			}
			return newConn(c, q, ev.param), false, nil
		case rdmaCMEventEstablished:
			q.setState(driver.QPSRTS)
			return newConn(c, q, ev.param), false, nil
		case rdmaCMEventRejected:
			// The listener's Reject is, on InfiniBand and RoCE, a CM
			// reject of reason 28 (consumer defined; every reject
			// carries 148 bytes of private data there, padded), and on
			// iWARP a refusal with private data. Anything else is no
			// listener.
			if (!q.ctx.iwarp && ev.status == ibCMRejConsumerDefined) || (q.ctx.iwarp && len(ev.param.PrivateData) > 0) {
				return fail(&driver.RejectError{PrivateData: ev.param.PrivateData})
			}
			err := fmt.Errorf("ibverbs: dial %s: %w (rdma_cm reject status %d)", addr, driver.ErrRefused, ev.status)
			if !q.ctx.iwarp && ev.status == ibCMRejStaleConn {
				c.close()
				return nil, true, err
			}
			return fail(err)
		case rdmaCMEventUnreachable, rdmaCMEventConnectError:
			return fail(fmt.Errorf("ibverbs: dial %s: %w (rdma_cm event %d, status %d)", addr, driver.ErrRefused, ev.typ, ev.status))
		}
	}
}

// listener is an rdma_cm id listening on an address.
type listener struct {
	c    *cmID
	addr string
	done chan struct{}
	once sync.Once
}

func (*provider) Listen(addr string) (driver.Listener, error) {
	if err := loadCM(); err != nil {
		return nil, err
	}
	a, err := resolveTCP(addr)
	if err != nil {
		return nil, err
	}
	c, err := createCMID()
	if err != nil {
		return nil, err
	}
	c.requests = make(chan *cmID, 64)
	sa := sockaddr(a)
	if err := callRC(lib.bindAddr, c.id, uintptr(unsafe.Pointer(&sa[0]))); err != nil {
		c.close()
		return nil, errnoErr("rdma_bind_addr "+addr, err)
	}
	if err := callRC(lib.listen, c.id, 64); err != nil {
		c.close()
		return nil, errnoErr("rdma_listen "+addr, err)
	}
	port := call(lib.getSrcPort, c.id)
	port16 := uint16(port)
	port16 = port16>>8 | port16<<8
	host := a.IP.String()
	if a.IP == nil {
		host = "0.0.0.0"
	}
	return &listener{c: c, addr: net.JoinHostPort(host, strconv.Itoa(int(port16))), done: make(chan struct{})}, nil
}

func (l *listener) Addr() string { return l.addr }

func (l *listener) Accept(ctx context.Context) (driver.ConnRequest, error) {
	select {
	case child := <-l.c.requests:
		return &request{c: child}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-l.done:
		return nil, driver.ErrClosed
	}
}

func (l *listener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.c.close()
		for {
			select {
			case child := <-l.c.requests:
				call(lib.reject, child.id, 0, 0)
				child.close()
				continue
			default:
			}
			break
		}
	})
	return nil
}

// request is a connection request, its id on a channel of its own.
type request struct {
	c    *cmID
	mu   sync.Mutex
	used bool
}

func (r *request) Param() driver.ConnParam { return r.c.reqParam }

func (r *request) take() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.used {
		return fmt.Errorf("%w: the request was already accepted or rejected", driver.ErrInvalidState)
	}
	r.used = true
	return nil
}

func (r *request) Accept(x driver.QP, p driver.ConnParam) (driver.Conn, error) {
	q, err := ourQP(x)
	if err != nil {
		return nil, err
	}
	if p.HoldRTR {
		// rdma_accept takes the QP to RTS; the device raises no
		// EventCommEst to tell when to move it on (no CapCommEstEvent).
		return nil, fmt.Errorf("ibverbs: accept: %w: a QP cannot be held in RTR here; accept without HoldRTR", driver.ErrUnsupported)
	}
	if err := r.take(); err != nil {
		return nil, err
	}
	q.endStaleConn()
	c := r.c
	fail := func(err error) (driver.Conn, error) {
		call(lib.reject, c.id, 0, 0)
		c.close()
		return nil, err
	}
	if err := checkDevice(c, q, "the requester"); err != nil {
		return fail(err)
	}
	if err := c.toInit(q); err != nil {
		return fail(err)
	}
	if !q.ctx.iwarp {
		if err := c.toRTS(q, p); err != nil {
			return fail(err)
		}
	}
	cp := toConnParam(p, q)
	if err := callRC(lib.accept, c.id, uintptr(unsafe.Pointer(&cp))); err != nil {
		if !(q.ctx.noReset && errors.Is(err, syscall.ECONNRESET)) {
			// (siw refuses with ECONNRESET a request its requester
			// abandoned before it looks at the QP, which it leaves as
			// it was.)
			q.acceptFailed()
		}
		return fail(errnoErr("rdma_accept", err))
	}
	ctx, cancel := context.WithTimeout(context.Background(), establishTimeout)
	defer cancel()
	for {
		ev, err := c.wait(ctx)
		if err != nil {
			c.close()
			q.acceptFailed()
			return nil, fmt.Errorf("ibverbs: accept: the requester did not confirm: %w", err)
		}
		switch ev.typ {
		case rdmaCMEventEstablished:
			q.setState(driver.QPSRTS)
			return newConn(c, q, c.reqParam), nil
		case rdmaCMEventRejected, rdmaCMEventDisconnected, rdmaCMEventConnectError, rdmaCMEventUnreachable:
			c.close()
			q.acceptFailed()
			return nil, fmt.Errorf("ibverbs: accept: %w (rdma_cm event %d, status %d)", driver.ErrDisconnected, ev.typ, ev.status)
		}
	}
}

// acceptFailed records what an accept that failed in or after
// rdma_accept may have left the QP in. On iWARP the kernel moves the QP
// on by itself there (to RTS, or to the error state as the connection
// fails) and reports no state (the record is the provider's): the
// record, still Init, would let the QP be accepted or connected again,
// and siw, whose QP never leaves the error state, mishandles that. It is
// recorded in the error state: the QP is not connectable again, and is
// to be destroyed. Elsewhere the record is the device's own.
func (q *qp) acceptFailed() {
	if q.ctx.iwarp {
		q.setState(driver.QPSErr)
	}
}

func (r *request) Reject(privateData []byte) error {
	if err := r.take(); err != nil {
		return err
	}
	var p uintptr
	if len(privateData) > 0 {
		p = uintptr(unsafe.Pointer(&privateData[0]))
	}
	err := callRC(lib.reject, r.c.id, p, uintptr(len(privateData)))
	r.c.close()
	if err != nil {
		return errnoErr("rdma_reject", err)
	}
	return nil
}

// conn is an established connection.
type conn struct {
	c       *cmID
	q       *qp
	resets  uint64 // q.resets when connected: a later Reset ends the ownership
	remote  driver.ConnParam
	done    chan struct{}
	stop    chan struct{}
	watched chan struct{} // closed when watch returns
	ended   sync.Once
	closed  sync.Once
	wg      sync.WaitGroup

	mu       sync.Mutex
	released bool // the rdma_cm id is destroyed
}

func newConn(c *cmID, q *qp, remote driver.ConnParam) *conn {
	k := &conn{c: c, q: q, resets: q.resets.Load(), remote: remote, done: make(chan struct{}), stop: make(chan struct{}), watched: make(chan struct{})}
	q.cmConn.Store(k)
	k.wg.Add(1)
	go k.watch()
	return k
}

// watch waits for the disconnect (or the device's removal), moves the QP
// to the error state, which flushes its work requests, and releases the
// rdma_cm id: the connection is over, whether or not Close is called.
func (k *conn) watch() {
	defer k.wg.Done()
	defer close(k.watched)
	for {
		select {
		case ev := <-k.c.events:
			if ev.typ == rdmaCMEventDeviceRemoval {
				k.q.ctx.removeDevice()
			}
			if ev.typ == rdmaCMEventDisconnected || ev.typ == rdmaCMEventDeviceRemoval {
				k.release()
				return
			}
		case <-k.stop:
			return
		}
	}
}

// end moves the QP to the error state, unless it was reset since the
// connection was made (it is no longer the connection's), and closes
// done.
func (k *conn) end() {
	k.ended.Do(func() {
		if k.q.resets.Load() == k.resets {
			a := ibvQPAttr{qpState: uint32(driver.QPSErr)}
			k.q.modifyRaw(&a, ibvQPState)
		}
		close(k.done)
	})
}

// endStaleConn closes the QP's connection if the QP was reset since it
// was made: the QP is about to be connected again, and the peer's CM
// takes the new connection only once the old one is over.
func (q *qp) endStaleConn() {
	if k := q.cmConn.Load(); k != nil && k.resets != q.resets.Load() && q.cmConn.CompareAndSwap(k, nil) {
		k.Close()
	}
}

// release destroys the rdma_cm id once, moving the QP to the error
// state first.
func (k *conn) release() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.released {
		return
	}
	k.released = true
	k.end()
	k.c.close()
}

// disconnect starts the disconnect, unless the id is released, and moves
// the QP to the error state, which flushes its work requests.
func (k *conn) disconnect() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.released {
		return nil
	}
	var err error
	if e := callRC(lib.disconnect, k.c.id); e != nil && !errors.Is(e, syscall.EINVAL) {
		err = errnoErr("rdma_disconnect", e)
	}
	k.end()
	return err
}

func (k *conn) RemoteParam() driver.ConnParam { return k.remote }
func (k *conn) Done() <-chan struct{}         { return k.done }

// Close disconnects, moves the QP to the error state and releases the
// rdma_cm id once the disconnect is over (the peer answered, or its own
// disconnect crossed ours), or after disconnectTimeout.
func (k *conn) Close() error {
	var err error
	k.closed.Do(func() {
		err = k.disconnect()
		if err == nil {
			// watch sees the end of the disconnect and releases the
			// id; the kernel is not asked to destroy an id whose
			// disconnect is still under way.
			t := time.NewTimer(disconnectTimeout)
			select {
			case <-k.watched:
			case <-t.C:
			}
			t.Stop()
		}
		close(k.stop)
		k.wg.Wait()
		k.release()
	})
	return err
}
