package iwarp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/goverbs/goverbs/internal/acceptq"
	"github.com/goverbs/goverbs/internal/listenwait"
	"github.com/goverbs/goverbs/internal/peerguard"
	"github.com/goverbs/goverbs/internal/soft"
	"github.com/goverbs/goverbs/provider/iwarp/wire"
	"github.com/goverbs/goverbs/verbs/driver"
)

// Connection setup: the MPA Request and Reply exchange of RFC 5044 with
// the enhanced connection setup of RFC 6581, over a TCP connection per
// QP. The initiator asks for peer-to-peer mode with a zero-length RDMA
// Write as RTR, offers the RFC 7306 extensions (see the package
// documentation) and CRC as SetCRC says; the responder agrees to what it
// can and refuses markers.

var crcWanted atomic.Bool

func init() {
	switch strings.ToLower(os.Getenv("GOVERBS_IWARP_CRC")) {
	case "1", "on", "true", "yes":
		crcWanted.Store(true)
	}
}

// SetCRC says whether this side asks for MPA CRC32c on the connections
// it sets up from now on. CRC is used when either side asks (RFC 5044),
// so with on false a connection still uses CRC if the peer asks. The
// default is off, as siw's, unless the environment variable
// GOVERBS_IWARP_CRC is "on" (or "1", "true").
func SetCRC(on bool) { crcWanted.Store(on) }

// CRC reports whether this side asks for MPA CRC32c.
func CRC() bool { return crcWanted.Load() }

// setupTimeout bounds each step of the MPA exchange when the caller's
// context sets no deadline.
const setupTimeout = 10 * time.Second

// rtrTimeout, when not zero, replaces listenwait.Timeout() as the bound
// on how long a responder in peer-to-peer mode waits for the initiator's
// RTR once it has sent its MPA Reply (see rtrWait): for tests of an
// overdue RTR, which leave the wait for the request as it is.
var rtrTimeout time.Duration

// rtrWait is how long a responder in peer-to-peer mode waits for the
// initiator's RTR once it has sent its MPA Reply: as long as a listener
// waits for a request (listenwait.Timeout), so that a half-open
// connection holds nothing longer. Accept waits for it rtrGrace at most.
func rtrWait() time.Duration {
	if rtrTimeout != 0 {
		return rtrTimeout
	}
	return listenwait.Timeout()
}

// speakFirstDelay is how long a responder whose initiator did not ask
// for peer-to-peer mode waits for the initiator's first FPDU before it
// sends anyway (speakFirst); a variable for tests.
var speakFirstDelay = 100 * time.Millisecond

// rtrGrace is how long Accept waits for the RTR before it returns
// anyway (the connection then waits for it up to rtrWait()).
const rtrGrace = 100 * time.Millisecond

func (*provider) Schemes() []string { return []string{"tcp"} }

func (*provider) MaxPrivateData() int { return maxPrivateData }

func (p *provider) Listen(addr string) (driver.Listener, error) {
	return p.ListenConfig(addr, driver.ListenConfig{})
}

// ListenConfig implements driver.ConfigListener: the listener refuses,
// for a growing back-off period, the IP addresses whose connections
// failed too many remote accesses (cfg.Strikes, cfg.Backoff,
// cfg.MaxBackoff; see peerguard for the defaults).
func (*provider) ListenConfig(addr string, cfg driver.ListenConfig) (driver.Listener, error) {
	if addr == "" {
		return nil, fmt.Errorf("%w: empty address: use tcp://host:port (tcp://:0 picks a free port)", driver.ErrInvalidArg)
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on tcp://%s: %w", addr, err)
	}
	g := peerguard.New(peerguard.Config{Strikes: cfg.Strikes, Base: cfg.Backoff, Max: cfg.MaxBackoff})
	return newListener(l.(*net.TCPListener), g), nil
}

// listener accepts TCP connections and reads their MPA Requests
// concurrently (acceptq). A connection from an address its guard refuses
// is closed before anything is read from it.
type listener struct {
	l *net.TCPListener
	q *acceptq.Queue[*net.TCPConn, *request]
}

func newListener(l *net.TCPListener, g *peerguard.Guard) *listener {
	shake := func(nc *net.TCPConn) (*request, bool) {
		peer := peerIP(nc)
		if _, refused := g.Refused(peer); refused {
			nc.SetLinger(0) // a reset: the refused peer learns at once
			return nil, false
		}
		r, ok := handshake(nc)
		if ok {
			r.guard, r.peer = g, peer
		}
		return r, ok
	}
	return &listener{l: l, q: acceptq.New(l.AcceptTCP, l.Close, shake, func(r *request) { r.nc.Close() }).PerPeer(tcpPeer)}
}

// peerIP is the remote IP address of nc, the identity the guard counts
// failures against.
func peerIP(nc *net.TCPConn) string {
	if a, ok := nc.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	return nc.RemoteAddr().String()
}

// tcpPeer names the peer of nc by its IP address, for the listener's
// per-peer share of handshake slots.
func tcpPeer(nc *net.TCPConn) string {
	return "tcp " + peerIP(nc)
}

func (l *listener) Addr() string { return l.l.Addr().String() }
func (l *listener) Close() error { return l.q.Close() }

func (l *listener) Accept(ctx context.Context) (driver.ConnRequest, error) {
	return soft.Accepted(l.q.Accept(ctx))
}

// handshake reads the MPA Request of nc; a peer that is not an iWARP
// one, or asks for markers, or is silent for listenwait.Timeout(), is
// turned away.
func handshake(nc *net.TCPConn) (*request, bool) {
	req, err := readFrame(context.Background(), nc, time.Now().Add(listenwait.Timeout()))
	switch {
	case err != nil || !req.IsRequest():
		return nil, false // not an iWARP peer, or a broken one
	case req.Flags()&wire.FlagMarkers != 0:
		// Markers are not supported: refuse cleanly, as siw does.
		rej := make(wire.Frame, wire.FrameHeaderLen)
		rej.SetHeader(wire.KeyRep, wire.FlagReject|req.Flags()&wire.FlagCRC, max(req.Revision(), wire.Revision1), 0)
		nc.SetWriteDeadline(time.Now().Add(setupTimeout))
		nc.Write(rej)
		return nil, false
	}
	return newRequest(nc, req), true
}

// readFrame reads an MPA Request or Reply frame with its private data,
// until deadline or the end of ctx.
func readFrame(ctx context.Context, nc net.Conn, deadline time.Time) (wire.Frame, error) {
	nc.SetReadDeadline(deadline)
	defer nc.SetReadDeadline(time.Time{})
	// After the deadline is set, so that an end of ctx overrides it.
	stop := context.AfterFunc(ctx, func() { nc.SetReadDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, wire.FrameHeaderLen+wire.MaxPrivateData)
	if _, err := io.ReadFull(nc, buf[:wire.FrameHeaderLen]); err != nil {
		return nil, fmt.Errorf("%w: reading the MPA frame: %v", driver.ErrDisconnected, err)
	}
	n, err := wire.ValidateFrameHeader(buf)
	if err != nil {
		return nil, err
	}
	if _, err := io.ReadFull(nc, buf[wire.FrameHeaderLen:wire.FrameHeaderLen+n]); err != nil {
		return nil, fmt.Errorf("%w: reading MPA private data: %v", driver.ErrDisconnected, err)
	}
	return wire.Frame(buf[:wire.FrameHeaderLen+n]), nil
}

// setup is what one side of a connection learnt of the other from its
// MPA frame.
type setup struct {
	enhanced bool     // RFC 6581: IRD and ORD in the private data
	ird, ord int      // the peer's IRD and ORD (1 each without RFC 6581)
	p2p      bool     // peer-to-peer mode
	rtr      wire.RTR // RTR messages the peer names
	private  []byte   // the application's private data
}

// parseSetup reads the RFC 6581 block (when the frame has one) and the
// application's private data of f; skip bytes of goverbs' block follow
// the RFC 6581 block.
func parseSetup(f wire.Frame) setup {
	s := setup{ird: 1, ord: 1, private: f.PrivateData()}
	if f.Revision() == wire.Revision2 && f.Flags()&wire.FlagEnhanced != 0 && len(s.private) >= wire.V2Len {
		v := wire.V2(s.private)
		s.enhanced, s.ird, s.ord, s.p2p, s.rtr = true, v.IRD(), v.ORD(), v.PeerToPeer(), v.RTR()
		s.private = s.private[wire.V2Len:]
	}
	return s
}

// request is an incoming connection request: its TCP connection and
// MPA Request, waiting for Accept or Reject.
type request struct {
	nc       *net.TCPConn
	req      wire.Frame
	s        setup
	answered soft.Answer
	guard    *peerguard.Guard // the listener's
	peer     string           // the requester's IP address
}

func newRequest(nc *net.TCPConn, req wire.Frame) *request {
	return &request{nc: nc, req: req, s: parseSetup(req)}
}

// Peer names the requester by its IP address (driver.PeerNamer).
func (r *request) Peer() string { return tcpPeer(r.nc) }

func (r *request) Param() driver.ConnParam {
	return driver.ConnParam{PrivateData: append([]byte(nil), r.s.private...),
		ResponderResources: uint8(min(r.s.ird, 255)), InitiatorDepth: uint8(min(r.s.ord, 255))}
}

func (r *request) Reject(privateData []byte) error {
	return r.answered.Reject(func() error {
		flags := wire.FlagReject | r.req.Flags()&wire.FlagCRC
		var pd []byte
		if r.s.enhanced {
			flags |= wire.FlagEnhanced
			pd = make([]byte, wire.V2Len)
			wire.V2(pd).Set(0, 0, false, 0)
		}
		pd = append(pd, privateData...)
		f := make(wire.Frame, wire.FrameHeaderLen+len(pd))
		f.SetHeader(wire.KeyRep, flags, max(r.req.Revision(), wire.Revision1), len(pd))
		copy(f[wire.FrameHeaderLen:], pd)
		r.nc.SetWriteDeadline(time.Now().Add(setupTimeout))
		_, err := r.nc.Write(f)
		r.nc.Close()
		return err
	})
}

func (r *request) Accept(dq driver.QP, p driver.ConnParam) (driver.Conn, error) {
	return soft.Accept(&r.answered, dq, func(q *qp) (driver.Conn, error) { return r.accept(q, p) })
}

func (r *request) accept(q *qp, p driver.ConnParam) (driver.Conn, error) {
	s := r.s
	crc := r.req.Flags()&wire.FlagCRC != 0 || CRC()
	ext := r.req.Flags()&wire.FlagExtOffer != 0
	ird := min(int(p.ResponderResources), maxRdAtomic)
	ord := min(int(p.InitiatorDepth), s.ird, maxRdAtomic)
	// In peer-to-peer mode pick the RTR: a Write if offered, else a Read;
	// a peer that names neither gets a Write, as siw does.
	var rtr wire.RTR
	if s.p2p {
		rtr = wire.RTRWrite
		if s.rtr&wire.RTRWrite == 0 && s.rtr&wire.RTRRead != 0 {
			rtr = wire.RTRRead
		}
	}
	flags, rev := byte(0), byte(wire.Revision1)
	if crc {
		flags |= wire.FlagCRC
	}
	var pd []byte
	if s.enhanced {
		flags |= wire.FlagEnhanced
		rev = wire.Revision2
		pd = make([]byte, wire.V2Len)
		wire.V2(pd).Set(ird, ord, s.p2p, rtr)
	}
	if ext {
		flags |= wire.FlagExtAccept
		e := make([]byte, wire.ExtLen)
		wire.Ext(e).Set(q.num)
		pd = append(pd, e...)
	}
	pd = append(pd, p.PrivateData...)
	if len(pd) > wire.MaxPrivateData {
		r.nc.Close()
		return nil, fmt.Errorf("%w: %d bytes of private data with the MPA blocks, at most %d", driver.ErrPrivateData, len(pd), wire.MaxPrivateData)
	}
	c, err := newConn(q, r.nc, crc, ext, ird, ord)
	if err != nil {
		r.nc.Close()
		return nil, err
	}
	c.wantRTR = rtr
	// Only a QP held in RTR waits for the communication established
	// event: one that Accept moves on to RTS raises none for the
	// requests that reach it, once the receiver has started, before
	// Accept has finished (the initiator may send the moment it has the
	// Reply).
	c.rx.settled = !p.HoldRTR
	c.guard, c.peer = r.guard, r.peer
	remote := driver.ConnParam{PrivateData: append([]byte(nil), s.private...),
		ResponderResources: uint8(min(s.ird, 255)), InitiatorDepth: uint8(min(s.ord, 255))}
	p.QPNum = q.num
	if err := q.attach(c); err != nil {
		c.discard()
		return nil, err
	}
	fail := func(err error) (driver.Conn, error) {
		q.detach(c)
		c.discard()
		return nil, err
	}
	if err := soft.ConnectRTR(q, p, remote); err != nil {
		return fail(err)
	}
	rep := make(wire.Frame, wire.FrameHeaderLen+len(pd))
	rep.SetHeader(wire.KeyRep, flags, rev, len(pd))
	copy(rep[wire.FrameHeaderLen:], pd)
	r.nc.SetWriteDeadline(time.Now().Add(setupTimeout))
	if _, err := r.nc.Write(rep); err != nil {
		return fail(fmt.Errorf("%w: sending the MPA Reply: %v", driver.ErrDisconnected, err))
	}
	r.nc.SetWriteDeadline(time.Time{})
	if rtr != 0 {
		// Peer-to-peer mode: the QP sends nothing before the initiator's
		// RTR, the first FPDU, has arrived (the gate; firstFPDU checks
		// it, and learns a goverbs initiator's QP number from it). Accept
		// waits for it only a moment (below), as rdma_accept does not
		// wait at all: an initiator that never sends it would otherwise
		// hold the caller, a server accepting one request after another,
		// for setupTimeout. The connection ends if the RTR has not come
		// within rtrWait().
		c.watchRTR(rtrWait())
	} else {
		// No peer-to-peer mode: the initiator may wait for this side to
		// speak first (see speakFirst).
		c.speakFirst(speakFirstDelay)
	}
	c.start()
	if rtr != 0 {
		// An initiator sends its RTR as soon as it has the Reply: a
		// moment's wait for it gives the QP the peer's number (a goverbs
		// initiator's) by the time Accept returns, where one that stalls
		// costs the caller no more than the moment.
		t := time.NewTimer(rtrGrace)
		select {
		case <-c.rtrSeen:
		case <-c.done:
		case <-t.C:
		}
		t.Stop()
		remote.QPNum = c.remoteQPN.Load()
	}
	if err := soft.FinishAccept(q, p, remote); err != nil {
		return fail(err)
	}
	c.logSetup("accepted", r.req.Revision(), s.p2p)
	return &connHandle{c: c, remote: remote}, nil
}

func (*provider) Dial(ctx context.Context, addr string, dq driver.QP, p driver.ConnParam) (driver.Conn, error) {
	q, err := soft.Own[*qp](dq)
	if err != nil {
		return nil, err
	}
	if a, err := q.Query(); err != nil {
		return nil, err
	} else if a.State != driver.QPSReset && a.State != driver.QPSInit {
		return nil, fmt.Errorf("%w: dial needs a QP in Reset or Init, this one is %v", driver.ErrInvalidState, a.State)
	}
	var d net.Dialer
	nc0, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("%w: nothing listens at tcp://%s", driver.ErrRefused, addr)
		}
		return nil, err
	}
	nc := nc0.(*net.TCPConn)
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(setupTimeout)
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Now()) })
	defer stop()
	ird := min(int(p.ResponderResources), maxRdAtomic)
	wantOrd := min(int(p.InitiatorDepth), maxRdAtomic)
	pd := make([]byte, wire.V2Len, wire.V2Len+len(p.PrivateData))
	wire.V2(pd).Set(ird, wantOrd, true, wire.RTRWrite)
	pd = append(pd, p.PrivateData...)
	flags := byte(wire.FlagEnhanced | wire.FlagExtOffer)
	if CRC() {
		flags |= wire.FlagCRC
	}
	req := make(wire.Frame, wire.FrameHeaderLen+len(pd))
	req.SetHeader(wire.KeyReq, flags, wire.Revision2, len(pd))
	copy(req[wire.FrameHeaderLen:], pd)
	nc.SetWriteDeadline(deadline)
	if _, err := nc.Write(req); err != nil {
		nc.Close()
		return nil, dialErr(ctx, fmt.Errorf("%w: sending the MPA Request: %v", driver.ErrDisconnected, err))
	}
	nc.SetWriteDeadline(time.Time{})
	rep, err := readFrame(ctx, nc, deadline)
	if err != nil {
		nc.Close()
		return nil, dialErr(ctx, err)
	}
	if !rep.IsReply() {
		nc.Close()
		return nil, fmt.Errorf("%w: the peer answered with an MPA Request frame, not a Reply", driver.ErrDisconnected)
	}
	s := parseSetup(rep)
	if rep.Flags()&wire.FlagReject != 0 {
		nc.Close()
		return nil, &driver.RejectError{PrivateData: append([]byte(nil), s.private...)}
	}
	if rep.Flags()&wire.FlagMarkers != 0 {
		nc.Close()
		return nil, fmt.Errorf("%w: the peer wants MPA markers, which goverbs does not support: turn markers off on the peer", driver.ErrUnsupported)
	}
	ext := rep.Flags()&wire.FlagExtAccept != 0 && len(s.private) >= wire.ExtLen && wire.Ext(s.private).Valid()
	remote := driver.ConnParam{ResponderResources: uint8(min(s.ird, 255)), InitiatorDepth: uint8(min(s.ord, 255))}
	if ext {
		remote.QPNum = wire.Ext(s.private).QPN()
		s.private = s.private[wire.ExtLen:]
	}
	remote.PrivateData = append([]byte(nil), s.private...)
	var rtr wire.RTR
	if s.enhanced && s.p2p {
		if s.rtr&wire.RTRWrite == 0 {
			nc.Close()
			return nil, fmt.Errorf("%w: the peer chose an RTR message other than the zero-length Write offered", driver.ErrUnsupported)
		}
		rtr = wire.RTRWrite
	}
	crc := rep.Flags()&wire.FlagCRC != 0 || CRC()
	c, err := newConn(q, nc, crc, ext, ird, min(wantOrd, s.ird))
	if err != nil {
		nc.Close()
		return nil, err
	}
	c.initiator = true
	c.rtrOut = rtr
	c.kickRTR = rtr != 0 && !ext
	c.gate.Store(true)
	c.remoteQPN.Store(remote.QPNum)
	p.QPNum = q.num
	if err := q.attach(c); err != nil {
		c.discard()
		return nil, err
	}
	if err := soft.ConnectRC(q, p, remote); err != nil {
		q.detach(c)
		c.discard()
		return nil, err
	}
	if !stop() {
		// The context ended as the connection came up.
		q.detach(c)
		c.discard()
		return nil, ctx.Err()
	}
	c.start()
	c.logSetup("connected", rep.Revision(), rtr != 0)
	return &connHandle{c: c, remote: remote}, nil
}

// logSetup reports what a connection negotiated, for GOVERBS_IWARP_DEBUG.
func (c *conn) logSetup(how string, rev byte, p2p bool) {
	if !debug {
		return
	}
	onOff := func(b bool) string {
		if b {
			return "on"
		}
		return "off"
	}
	debugf("QP %d: %s %v (MPA revision %d, CRC %s, peer-to-peer %s, RFC 7306 %s, IRD %d, ORD %d, peer QP %d)",
		c.q.num, how, c.nc.RemoteAddr(), rev, onOff(c.crc), onOff(p2p), onOff(c.ext), c.ird, c.ord, c.remoteQPN.Load())
}

// dialErr prefers the context's error when it ended the dial.
func dialErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}
